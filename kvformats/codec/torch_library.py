"""How kvformats defines its ``torch.library`` ops: a schema, a real implementation, a fake one.

The ops are defined through a ``torch.library.Library`` fragment rather than the
``torch.library.custom_op`` decorator. Both give the same dispatcher op (same schema, same
``torch.compile`` and ``opcheck`` behaviour), but ``custom_op`` also routes every eager call
through Python autograd and in-place/view kernels of its own, several times the host cost of a
``Library`` kernel per eager call of a mutating op (docs/explanation/measured-choices.md). kvformats ops are not
differentiable, so those kernels bought nothing: the real implementation is registered for
``CompositeExplicitAutograd`` (every backend; autograd falls back to the dispatcher's default,
which bumps the version counters of mutated arguments).

Rules the implementations keep (``custom_op`` enforced some of them): outputs never alias
inputs, mutated arguments are declared ``Tensor(a!)`` in the schema, and the fake computes
shapes, dtypes and strides only.

The pieces an op declared with ``kvformats.codec.op.Op`` is made of: ``define`` (schema, real
and fake implementations), ``implementation`` (the real one: the public function), ``Binding``
(a call's arguments in schema order) and ``wrapper`` (a function with the public function's
signature that goes through the op).
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Callable

import torch

from kvformats.codec.registry import get_format
from kvformats.errors import InputTypeError, KVFormatError, describe
from kvformats.runtime import deferred
from kvformats.validation import check_memory

NAMESPACE = "kvformats"

# One fragment for every op of the namespace; it must stay referenced, or torch drops the ops.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def define(name: str, schema: str, impl: Callable, fake: Callable) -> None:
    """Define ``kvformats::<name>`` with ``schema`` (``"(args) -> returns"``), its eager
    implementation ``impl`` and its fake (meta) implementation ``fake``."""
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)


def shares_storage(t: torch.Tensor, others) -> bool:
    """Whether ``t`` shares storage with a tensor among ``others`` (anything else is skipped):
    an implementation then returns a copy, as outputs never alias inputs nor each other."""
    ptr = t.untyped_storage().data_ptr()
    return any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() == ptr for o in others)


def rows(t: torch.Tensor) -> int:
    """Rows of ``t`` (0 for a 0-dim tensor): sizes an ``out`` workspace before the function has
    validated ``t``, which then reports the bad shape itself."""
    return t.shape[0] if t.dim() else 0


def arg_names(args: str) -> list[str]:
    """The parameter names of a schema's argument list ``"Tensor x, float? scale, ..."``."""
    return [a.split()[-1] for a in args.split(", ")]


def fresh(t: torch.Tensor, inputs) -> torch.Tensor:
    """``t`` contiguous and in storage of its own (custom-op outputs must not alias inputs)."""
    t = t.contiguous()
    return t.clone(memory_format=torch.contiguous_format) if shares_storage(t, inputs) else t


@functools.lru_cache(maxsize=256)
def layout_of(fmt: str, params: str):
    """The layout a codec op's ``(fmt, params)`` name (``kvformats.codec.torch_ops.layout_key``)."""
    return get_format(fmt, **json.loads(params))


def unaliased(out: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``out``, copied if it shares storage with an input (custom-op outputs must not alias)."""
    if out._base is None:  # a tensor of its own, not a view: the common case, without the storage lookups
        for t in inputs:
            if out is t:
                break
        else:
            return out
    return out.clone() if shares_storage(out, inputs) else out


def as_list(decoded, *inputs) -> list[torch.Tensor]:
    """A decode's result (a tensor or a tuple of them) as the list a ``Tensor[]`` op returns."""
    if not isinstance(decoded, tuple):
        return [unaliased(decoded.contiguous(), *inputs)]
    # Several outputs must not alias each other either: compressor_state's (kv, score) are the two
    # halves of one buffer, which contiguous() keeps as views when there are 0 or 1 rows.
    outs: list[torch.Tensor] = []
    for t in decoded:
        t = t.contiguous()
        if shares_storage(t, outs):
            t = t.clone()
        outs.append(unaliased(t, *inputs))
    return outs


def decoded_like(layout, cache: torch.Tensor, lead: tuple[int, ...]) -> list[torch.Tensor]:
    """Fake outputs of a codec decode of ``lead`` slots: their shapes and dtypes."""
    if layout.decode_dtype is None:  # compressor_state: (kv, score_state) float32
        return [cache.new_empty((*lead, layout.width), dtype=torch.float32) for _ in range(2)]
    return [cache.new_empty((*lead, layout.head_dim), dtype=layout.decode_dtype)]


def decoded(arguments: dict, output: list, layout):
    """A codec decode's Python result from the op's list: a tensor, or a tuple for compressor_state."""
    return tuple(output) if layout.decode_dtype is None else output[0]


def flat(result):
    """A result with nested tuples as one flat tuple (a schema returns no nesting)."""
    if isinstance(result, tuple):
        return tuple(x for r in result for x in (flat(r) if isinstance(r, tuple) else (r,)))
    return result


# Python types a schema argument type takes from the wrappers (a bool is no int here: the op
# would take True as 1 silently), and how an error names them.
_PY_TYPES: dict[str, type | tuple[type, ...]] = {"Tensor": torch.Tensor, "int": int, "float": (int, float), "str": str}
_TYPE_NAMES = {"Tensor": "a tensor", "int": "an int", "float": "a float", "str": "a string"}


_compiling = torch.compiler.is_compiling


def check_memories(**tensors) -> None:
    """``validation.check_memory`` of each tensor (or each tensor of a list) named by keyword: what
    a custom-op wrapper runs before torch's dispatcher sees a sparse or negative-bit tensor (whose
    errors are untyped)."""
    if _compiling():  # dynamo traces the op itself (is_neg() would break the graph)
        return
    for name, value in tensors.items():
        for t in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(t, torch.Tensor):
                check_memory(name, t)


def implementation(fn: Callable, names: list[str], *, in_place: bool, keep_layout: bool = False) -> Callable:
    """The eager implementation of an op whose arguments are ``fn``'s parameters ``names``: it
    calls ``fn`` (same validation, errors and bytes). An op that writes in place returns None;
    otherwise the nested result is flattened and every output made contiguous and unaliased
    (``keep_layout``: outputs keep their documented strides)."""

    def impl(*values):
        result = fn(**dict(zip(names, values)))
        if in_place:
            return None
        result = flat(result)
        if keep_layout:
            return result
        if not isinstance(result, tuple):
            return fresh(result, values)
        outs: list[torch.Tensor] = []  # nor may outputs alias each other (views of one buffer at T * H <= 1)
        for r in result:
            outs.append(fresh(r, (*values, *outs)))
        return tuple(outs)

    return impl


class Binding:
    """``binding(*args, **kwargs)``: the arguments of an op (in schema order) for the call
    ``fn(*args, **kwargs)``: defaults filled in, scalar types checked, ``out`` workspaces
    allocated where None (``workspaces(values)`` gives them). ``args`` is the schema's argument
    list, which names ``fn``'s parameters in order (checked: KVFormatError at import)."""

    def __init__(self, name: str, fn: Callable, args: str, workspaces: Callable | None = None):
        fields = [a.rsplit(" ", 1) for a in args.split(", ")]  # [schema type, name]
        params = inspect.signature(fn).parameters
        if list(params) != [n for _, n in fields]:  # a programming error of this package, found at import
            raise KVFormatError(f"schema of {name} out of date with {fn.__qualname__}")
        self.name, self.workspaces = name, workspaces
        self.positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
        self.defaults = {n: p.default for n, p in params.items() if p.default is not p.empty}
        self.kinds = {n: (t.split("(")[0].rstrip("?"), t.endswith("?") or self.defaults.get(n, 0) is None)
                      for t, n in fields}

    def __call__(self, *args, **kwargs) -> dict:
        name, positional, kinds = self.name, self.positional, self.kinds
        if len(args) > len(positional) or any(k not in kinds for k in kwargs):
            raise InputTypeError(f"{name}() takes {len(positional)} positional arguments and keywords {list(kinds)}")
        values = {**self.defaults, **dict(zip(positional, args)), **kwargs}
        for n, (kind, optional) in kinds.items():  # the op schema would reject these less helpfully
            if n not in values:
                raise InputTypeError(f"{name}() missing argument {n!r}")
            v = values[n]
            if n == "check":  # the schema's bool carries True / False; "strict" is applied around the call
                if v is not True and v is not False and v != "strict":
                    raise InputTypeError(f"check must be True, False or 'strict', got {describe(v)}")
                values[n] = v is not False
            elif kind == "bool":  # the Python functions take any truth value
                values[n] = bool(v)
            elif not (v is None and optional) and not (isinstance(v, _PY_TYPES[kind]) and not isinstance(v, bool)):
                raise InputTypeError(f"{n} must be {_TYPE_NAMES[kind]}, got {describe(v)}")
            elif isinstance(v, torch.Tensor) and not _compiling():
                check_memory(n, v)  # before torch's dispatcher meets a sparse or negative-bit tensor
        if self.workspaces is not None:
            values.update({k: t for k, t in self.workspaces(values).items() if values[k] is None})
        return {n: values[n] for n in kinds}


def wrapper(fn: Callable, op, binding: Binding, results: Callable) -> Callable:
    """A function with ``fn``'s signature that calls ``op`` (an OpOverload) on ``binding``'s
    arguments and returns ``results(arguments, output)``."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        arguments = binding(*args, **kwargs)
        if kwargs.get("check") == "strict":  # a bool in the schema: strict mode around the call instead
            with deferred.strict_checks():
                return results(arguments, op(*arguments.values()))
        return results(arguments, op(*arguments.values()))

    return call


def torch_op(name: str):
    """The OpOverload ``kvformats::<name>`` (defined by ``define``)."""
    return getattr(getattr(torch.ops, NAMESPACE), name).default
