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
    writes (None when not given). ``workspaces``: ``{argument: allocate(values)}`` for ``out=``
    arguments (optional in Python, required at the op level). ``keep_layout``: the outputs keep
    their documented strides (otherwise the op returns them contiguous). ``replay``: whether the
    public function replays its launches. ``example``: see the module doc.
    """

    def __init__(self, family: ModelOpFamily, name: str, *, mutates: tuple[str, ...] = (),
                 sites: tuple[str, ...] = (), fake: Callable | None = None, result: Callable | None = None,
                 workspaces: dict[str, Callable] | None = None, keep_layout: bool = False, replay: bool = True,
                 example: Callable | None = None):
        if name in family.declared:
            raise KVFormatError(f"{family.name}.{name} is declared twice")
        self.family, self.name, self.key = family, name, family.key
        self.torch_name = family.torch_prefix + name
        self.mutates, self.fake, self.result = tuple(mutates), fake, result
        self.workspaces = dict(workspaces or {})
        self.keep_layout, self.replay, self.example = keep_layout, replay, example
        self.sites = {arg: deferred.site(name, arg) for arg in sites}
        self.schema: op_schema.Schema | None = None
        self.function: Callable | None = None  # the public function (set by ``public``)
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
