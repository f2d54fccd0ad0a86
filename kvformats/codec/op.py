"""An op is declared once, where it is defined: ``Op``.

    SWA_INSERT = Op(MODEL_FAMILY, "swa_insert", mutates=("q", "kv_cache"), sites=("positions",),
                    result=lambda a: a["q"])

    @SWA_INSERT.public
    def swa_insert(q: torch.Tensor, ..., backend: str = "auto", check: bool | str = True) -> torch.Tensor:
        ...validate...
        SWA_INSERT.resolve(backend, device)(q, kv, ...)     # the backend's implementation
        return q

    @SWA_INSERT.reference
    def swa_insert_reference(q, kv, ...): ...               # takes the validated arguments

A kernel package registers its implementation under the same key (the family's
``OpFamily``, the op's name) and records value errors at ``deferred.site(op, arg)``, the index the
declaration allocated for ``sites``.

From the declaration and the public function's signature (its annotations) come:

* the registry key ``(OpFamily(family), name)``, ``reference`` and ``resolve``;
* the device-record sites, allocated here (``site(arg)``);
* the ``torch.library`` op ``kvformats::<family prefix><name>``: its schema
  (``kvformats.codec.op_schema``), its real implementation (the public function) and its fake
  (``fake``; none is needed for an op that only writes its arguments);
* ``wrapper``: a function with the public function's signature that goes through the op, and
  ``op_arguments`` / ``results`` between the two (``workspaces`` allocates ``out=`` arguments the
  caller left None; ``result`` makes the Python result of an op that writes its arguments);
* the public function itself: the launch replay of ``kvformats.runtime.replay`` around the
  function (``replay=False``: none), and under ``torch.compile`` the wrapper instead, so that
  dynamo traces one op rather than the launches. Callers (``kvformats.compat``) call the one
  function in eager code and compiled code alike.

The ops are defined when the declaring module is imported: defining them costs a few
milliseconds and imports no ``torch._dynamo`` (``kvformats.codec.torch_ops``, the codec ops, does).
``example(rows, g)`` (optional) gives the keyword arguments of one valid call of ``rows`` tokens
on CPU tensors: the test harness builds its prepared calls of the op from it
(``tests/harness/calls.py``).

**Codec ops** (``encode``, ``decode``, ... of every layout: ``kvformats.codec.slot_ops``,
``paged_ops``) take a layout, which no schema type is: the op takes it as ``str fmt, str params``.
They are declared in ``CODEC`` (torch names without prefix) with three parts:

    ENCODE = Op(CODEC, "encode", mutates=("cache",), sites=("slots",))

    @ENCODE.layout_public            # the public function (Layout.encode calls it): replayed
    def encode(layout, x, cache, slots, *, backend="auto", check=True, **kwargs) -> None: ...

    @ENCODE.lowering                 # a public call -> the op's arguments after (fmt, params)
    def _(layout, x, cache, slots, *, backend="auto", check=True, **kwargs): return ([x], cache, slots, backend, check)

    @ENCODE.op_level                 # the op's real implementation; its annotations are the schema
    def _encode(fmt: str, params: str, inputs: list[torch.Tensor], cache: torch.Tensor, ...) -> None: ...

Their torch ops are defined by ``define_layout_op(key)`` (``kvformats.codec.torch_ops`` loops over
``CODEC.declared``: importing it, not ``import kvformats``, defines them, as before), which also
gives ``wrapper`` (the public signature, through the op) and registers the wrapper as what dynamo
traces in place of the public function (``torch.compiler.substitute_in_graph``): the routing
costs the eager call nothing, not even the check ``routed`` makes.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from kvformats.codec import op_schema, registry, torch_library
from kvformats.codec.model_family import ModelOpFamily
from kvformats.errors import KVFormatError
from kvformats.runtime import deferred, replay

DECLARED: dict[str, Op] = {}  # torch op name -> declaration: every op declared in this process
# The codec ops (module doc): registered per format (``registry.register_op``), not under this
# family's key; the family lists them and names their torch ops ``kvformats::<name>``.
CODEC = ModelOpFamily("codec", torch_prefix="")
# True while dynamo traces (it folds this call to a constant), a plain ``return False`` otherwise:
# a third of is_compiling()'s cost on the eager path, and dynamo is what cannot trace the replay
# key (it reads addresses).
_tracing = torch.compiler.is_dynamo_compiling


def _nothing(*args) -> None:
    """The fake of an op that writes its arguments and returns nothing."""
    return None


def routed(replayed: Callable, traced: Callable) -> Callable:
    """``replayed`` in eager code, ``traced`` while torch.compile traces (the replay key reads
    addresses, which a traced tensor has none of; the op keeps the graph whole)."""

    @functools.wraps(replayed)
    def call(*args, **kwargs):
        if _tracing():
            return traced(*args, **kwargs)
        return replayed(*args, **kwargs)

    return call


def replayed(fn: Callable) -> Callable:
    """``fn``, a public function that calls declared ops (``csa_compress_kv_insert``), with its
    launches replayed in eager code and traced as it is under torch.compile (its ops then go
    through their torch.library ops)."""
    return routed(replay.replayable(fn), fn)


class Op:
    """The declaration of one public op of a model-op ``family`` (module doc).

    ``mutates``: the arguments it writes (``Tensor(a!)``); an op that writes returns nothing at
    the op level. ``sites``: the arguments whose values it checks on the device (one record site
    each). ``fake(*op_arguments)``: shapes, dtypes and strides of the outputs of an op that
    writes nothing. ``result(arguments)``: the public function's return value for an op that
    writes (None when not given; a codec op's ``result(arguments, output, layout)``, where
    ``arguments`` are those after ``(fmt, params)``, for any op). ``workspaces``:
    ``{argument: allocate(values)}`` for ``out=`` arguments (optional in Python, required at the
    op level). ``keep_layout``: the outputs keep their documented strides (otherwise the op
    returns them contiguous). ``replay``: whether the public function replays its launches.
    ``example``: see the module doc. ``public_names``: a codec op's op-level argument -> the
    public name its errors use (``{"inputs": "x"}``).
    """

    def __init__(self, family: ModelOpFamily, name: str, *, mutates: tuple[str, ...] = (),
                 sites: tuple[str, ...] = (), fake: Callable | None = None, result: Callable | None = None,
                 workspaces: dict[str, Callable] | None = None, keep_layout: bool = False, replay: bool = True,
                 example: Callable | None = None, public_names: dict[str, str] | None = None):
        if name in family.declared:
            raise KVFormatError(f"{family.name}.{name} is declared twice")
        self.family, self.name, self.key = family, name, family.key
        self.torch_name = family.torch_prefix + name
        self.mutates, self.fake, self.result = tuple(mutates), fake, result
        self.workspaces = dict(workspaces or {})
        self.keep_layout, self.replay, self.example = keep_layout, replay, example
        self.public_names = dict(public_names or {})
        self.sites = {arg: deferred.site(name, arg) for arg in sites}
        self.schema: op_schema.Schema | None = None
        self.function: Callable | None = None  # the public function (set by ``public``)
        self.impl: Callable | None = None  # a codec op's op-level function (``op_level``)
        self.lower: Callable | None = None  # a codec op's public call -> op arguments (``lowering``)
        family.declared[name] = self
        DECLARED[self.torch_name] = self

    # ----- dispatch -------------------------------------------------------------------------------
    def site(self, arg: str) -> int:
        """The device-record site of ``arg`` (one of ``sites``)."""
        return self.sites[arg]

    def reference(self, fn: Callable) -> Callable:
        """Decorator: register ``fn`` as the reference implementation (it takes the validated
        arguments)."""
        return self.family.reference(self.name)(fn)

    def resolve(self, backend: str, device) -> Callable:
        """The implementation ``backend`` selects for tensors on ``device``."""
        return registry.resolve(self.key, self.name, backend, device)

    # ----- the public function and its torch.library op -------------------------------------------
    def public(self, fn: Callable) -> Callable:
        """Decorator of the public function: define the op from its signature and return the
        function callers use (module doc)."""
        if fn.__name__ != self.name:
            raise KVFormatError(f"op {self.name} is declared on a function named {fn.__name__}")
        schema = self.schema = op_schema.derive(fn, self.mutates, frozenset(self.workspaces))
        if not self.mutates and self.fake is None:
            raise KVFormatError(f"op {self.name} returns tensors: declare its fake (shapes, dtypes, strides)")
        replayed = replay.replayable(fn) if self.replay else fn
        names = torch_library.arg_names(schema.args)
        impl = torch_library.implementation(replayed, names, in_place=bool(self.mutates),
                                            keep_layout=self.keep_layout)
        torch_library.define(self.torch_name, schema.text, impl, self.fake or _nothing)
        self.torch_op = torch_library.torch_op(self.torch_name)
        self.op_arguments = torch_library.Binding(self.name, fn, schema.args,
                                                  self._allocate if self.workspaces else None)
        self.wrapper = torch_library.wrapper(fn, self.torch_op, self.op_arguments, self.results)
        self.function = routed(replayed, self.wrapper)
        return self.function

    def _allocate(self, values: dict) -> dict:
        return {arg: allocate(values) for arg, allocate in self.workspaces.items()}

    def results(self, arguments: dict, output):
        """The public function's return value from the op's ``arguments`` and ``output``."""
        if self.mutates:
            return None if self.result is None else self.result(arguments)
        assert self.schema is not None
        return op_schema.nest(output, self.schema.nesting)

    # ----- codec ops: a layout travels as (fmt, params) -------------------------------------------
    def layout_public(self, fn: Callable) -> Callable:
        """Decorator of a codec op's public function (its first parameter the layout): replayed
        (``replay=False``: as it is), and traced as the op once ``define_layout_op`` ran."""
        if fn.__name__ != self.name:
            raise KVFormatError(f"op {self.name} is declared on a function named {fn.__name__}")
        self.function = replay.replayable(fn) if self.replay else fn
        return self.function

    def lowering(self, fn: Callable) -> Callable:
        """Decorator: ``fn(layout, <the public parameters>)`` gives the op's arguments after
        ``(fmt, params)``, in schema order (``check`` last, as given)."""
        self.lower = fn
        return fn

    def op_level(self, fn: Callable) -> Callable:
        """Decorator of a codec op's real implementation ``fn(fmt, params, ...)``: its annotations
        (and ``check``'s default) are the op's schema."""
        self.schema = op_schema.derive(fn, self.mutates, frozenset(), defaults=True)
        if not self.mutates and self.fake is None:
            raise KVFormatError(f"op {self.name} returns tensors: declare its fake (shapes, dtypes, strides)")
        self.impl = fn
        return fn

    def define_layout_op(self, key: Callable) -> Callable:
        """Define a codec op's torch op (``key(layout)``: its ``(fmt, params)``) and return the
        wrapper, which dynamo then traces in place of the public function."""
        if self.impl is None or self.lower is None or self.function is None or self.schema is None:
            raise KVFormatError(f"codec op {self.name} needs layout_public, lowering and op_level")
        torch_library.define(self.torch_name, self.schema.text, self.impl, self.fake or _nothing)
        op = self.torch_op = torch_library.torch_op(self.torch_name)
        names = torch_library.arg_names(self.schema.args)[2:]
        public = [self.public_names.get(n, n) for n in names]  # as the errors name them
        # the tensor arguments' (position, public name), checked before the dispatcher sees them
        tensors = [(i, public[i]) for i, a in enumerate(self.schema.args.split(", ")[2:]) if a.startswith("Tensor")]
        lower, result, mutates = self.lower, self.result, bool(self.mutates)
        compiling, check_memory = torch_library._compiling, torch_library.check_memory
        plain = self.function.__wrapped__ if self.replay else self.function  # type: ignore[attr-defined]

        @functools.wraps(plain)
        def wrapper(layout, *args, **kwargs):
            values = lower(layout, *args, **kwargs)
            if values[-1] == "strict":  # a bool in the schema: strict mode around the call instead
                with deferred.strict_checks():
                    return wrapper(layout, *args, **{**kwargs, "check": True})
            if not compiling():  # dynamo traces the op itself (is_neg() would break the graph)
                for i, name in tensors:
                    v = values[i]
                    if isinstance(v, torch.Tensor):
                        check_memory(name, v)
                    elif isinstance(v, (list, tuple)):
                        for t in v:
                            if isinstance(t, torch.Tensor):
                                check_memory(name, t)
            output = op(*key(layout), *values)
            if result is None:
                return output
            return result(dict(zip(names, values)) if mutates else None, output, layout)

        self.wrapper = wrapper
        from torch._dynamo import substitute_in_graph  # importing torch_ops imports dynamo anyway

        substitute_in_graph(self.function)(wrapper)
        return wrapper


def family_tables(family: ModelOpFamily, names) -> tuple[dict, dict, dict, tuple]:
    """A model-op family's ops ``names`` as its torch_ops module exposes them: name -> declaration,
    name -> (schema argument list, returns), name -> wrapper, and the torch op names."""
    declared = {name: family.declared[name] for name in names}
    return (declared, {name: (op.schema.args, op.schema.returns) for name, op in declared.items()},
            {name: op.wrapper for name, op in declared.items()}, tuple(op.torch_name for op in declared.values()))
