"""The ``torch.library`` schema of a public op, read off its Python function.

An op takes the function's parameters in definition order (positional, then keyword-only, same
names), so every argument is positional at the op level and the schema is the signature with
torch's type names. The types come from the annotations:

* ``torch.Tensor`` -> ``Tensor``; ``int``, ``float``, ``str``, ``bool`` -> the same names; ``X | None``
  -> ``X?``; ``list[torch.Tensor]`` -> ``Tensor[]`` (the codec ops' ``inputs`` and workspaces);
* an argument the op writes (``mutates``) -> ``Tensor(a!)`` (``Tensor(a!)[]``), letters in order; it stays optional
  (``Tensor(a!)?``) unless the wrapper allocates it where the caller passes None (``allocated``:
  an optional mutated argument passed as None breaks inductor's lowering in torch 2.13);
* ``check`` -> ``bool``: True / False travel in the op, ``"strict"`` is applied around the call;
* the returns: ``()`` for an op that writes its arguments (its Python result is made from them),
  else the return annotation with nested tuples flattened (a schema returns no nesting), or
  ``Tensor[]`` for ``list[torch.Tensor]``.

No defaults are written (the wrappers fill them in, ``kvformats.codec.torch_library.Binding``),
except with ``defaults=True``: the codec ops' op-level functions keep their ``bool check=True``.
``torch.library.infer_schema`` reads the same annotations, but writes ``SymInt`` for ``int`` (a
traced int would stay symbolic where these ops specialize today) and the defaults; this keeps
the schemas the ops were first defined with.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Callable, NamedTuple

import torch

from kvformats.errors import KVFormatError

_NAMES: dict[object, str] = {torch.Tensor: "Tensor", int: "int", float: "float", str: "str", bool: "bool",
                             list[torch.Tensor]: "Tensor[]"}
LIST = "list"  # the nesting of a ``list[torch.Tensor]`` result: the op's list, returned as it is


class Schema(NamedTuple):
    """An op's schema: its argument list, its returns, and the nesting of the function's result
    (None: one tensor; a tuple of nestings: a tuple; ``()`` with returns ``()``: no output;
    ``LIST``: a list of tensors)."""

    args: str
    returns: str
    nesting: object

    @property
    def text(self) -> str:
        return f"({self.args}) -> {self.returns}"


def _parts(hint) -> tuple[object, bool]:
    """(the type, whether None is allowed) of an annotation ``X`` or ``X | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(members) < len(typing.get_args(hint))
        return (members[0] if len(members) == 1 else tuple(members)), optional
    return hint, False


def _argument(name: str, hint, letter: str | None, allocated: bool, where: str, default: str = "") -> str:
    if name == "check":
        return "bool check" + default
    kind, optional = _parts(hint)
    if kind not in _NAMES:
        raise KVFormatError(f"{where}: parameter {name!r} is annotated {hint!r}; an op's parameters are "
                            f"torch.Tensor, list[torch.Tensor], int, float, str or bool (each may be '| None')")
    if letter is None:
        return f"{_NAMES[kind]}{'?' if optional else ''} {name}{default}"
    if kind == list[torch.Tensor]:
        return f"Tensor({letter}!)[] {name}{default}"
    if kind is not torch.Tensor:
        raise KVFormatError(f"{where}: mutated parameter {name!r} must be a torch.Tensor, got {hint!r}")
    return f"Tensor({letter}!){'?' if optional and not allocated else ''} {name}{default}"


def _default(param: inspect.Parameter) -> str:
    """``=value`` of a parameter's default as a schema writes it (bool, int, float, None)."""
    value = param.default
    if value is param.empty:
        return ""
    return "=" + str(value)


def _nesting(hint, where: str):
    """The nesting of a return annotation: None for a tensor, a tuple of nestings for a tuple."""
    if hint is torch.Tensor:
        return None
    if hint == list[torch.Tensor]:
        return LIST
    if typing.get_origin(hint) is tuple:
        return tuple(_nesting(a, where) for a in typing.get_args(hint))
    raise KVFormatError(f"{where}: an op returns torch.Tensor or tuples of them (annotate the return), got {hint!r}")


def _flat(nesting) -> int:
    return 1 if nesting is None else sum(_flat(n) for n in nesting)


def derive(fn: Callable, mutates: tuple[str, ...], allocated: frozenset[str], *, defaults: bool = False) -> Schema:
    """The schema of ``fn``'s op (module doc; ``defaults``: write the parameters' defaults).
    KVFormatError for a parameter without a type an op can take, or a mutated name that is not a
    parameter: a programming error, found at import."""
    where = f"op {fn.__qualname__}"
    hints = typing.get_type_hints(fn)
    params = inspect.signature(fn).parameters
    unknown = [m for m in mutates if m not in params]
    if unknown:
        raise KVFormatError(f"{where}: mutates names {unknown}, which are not its parameters")
    missing = [n for n in params if n not in hints and n != "check"]
    if missing:
        raise KVFormatError(f"{where}: annotate {missing} (the op's schema is read off the annotations)")
    letters = {m: "abcdefghijklmnopqrstuvwxyz"[i] for i, m in enumerate(n for n in params if n in mutates)}
    args = ", ".join(_argument(n, hints.get(n), letters.get(n), n in allocated, where,
                               _default(p) if defaults else "") for n, p in params.items())
    if mutates:
        return Schema(args, "()", ())
    nesting = _nesting(hints.get("return"), where)
    if nesting == LIST:
        return Schema(args, "Tensor[]", LIST)
    count = _flat(nesting)
    returns = "Tensor" if nesting is None else "(" + ", ".join(["Tensor"] * count) + ")"
    return Schema(args, returns, nesting)


def nest(flat, nesting):
    """The function's result from the op's flat outputs (a tensor or a tuple of them)."""
    if nesting is None or nesting == LIST or not any(isinstance(n, tuple) for n in nesting):
        return flat
    items = iter(flat)

    def build(n):
        return next(items) if n is None else tuple(build(m) for m in n)

    return build(nesting)
