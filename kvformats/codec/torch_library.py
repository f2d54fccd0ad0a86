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
"""

from __future__ import annotations

from typing import Callable

import torch

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
