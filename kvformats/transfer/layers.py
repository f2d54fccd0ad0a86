"""Which caches belong to which layer: the unit of a layer-by-layer transfer.

A model's caches are named per layer. By default a name ``L<k>.<cache>`` or ``L<k>_<cache>``
belongs to layer ``k`` (the names of examples/transfer_two_process.py and of the benchmarks:
``L0.swa``, ``L0.index``, ``L1.hca_state``); an engine with other names passes the grouping
itself, a mapping layer -> cache names. Every cache of a plan must be in exactly one layer, so
that "every layer verified" means every byte of the request verified.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.transfer.plan import TransferPlan

LAYER_NAME = re.compile(r"L(\d+)[._]")  # "L12.csa", "L3_index": the layer's number first


def layer_groups(names: Iterable[str], layers: Mapping | None = None) -> dict[int, tuple[str, ...]]:
    """Layer -> its cache names, in layer order, covering ``names`` exactly once. ``layers``:
    a mapping layer (a non-negative int) -> cache names; None reads the layer from each name
    (module doc). InputError for a cache in no layer or in two, or a layer naming no cache of
    ``names``."""
    names = list(names)
    if layers is None:
        groups: dict[int, list[str]] = {}
        unnamed = []
        for name in names:
            m = LAYER_NAME.match(name)
            if m is None:
                unnamed.append(name)
            else:
                groups.setdefault(int(m.group(1)), []).append(name)
        if unnamed:
            raise InputError(f"caches {sorted(unnamed)} have no layer in their names (L<k>.<cache>): pass layers= "
                             f"{{layer: [cache names]}}")
        return {k: tuple(groups[k]) for k in sorted(groups)}
    if not isinstance(layers, Mapping):
        raise InputTypeError(f"layers must be a mapping layer -> cache names, got {describe(layers)}")
    out: dict[int, tuple[str, ...]] = {}
    seen: dict[str, int] = {}
    for k, members in layers.items():
        if type(k) is not int or k < 0:  # noqa: E721 - a bool is refused too
            raise InputTypeError(f"layers' keys must be non-negative ints, got {k!r}")
        if isinstance(members, str) or not isinstance(members, Iterable):
            raise InputTypeError(f"layers[{k}] must be cache names, got {describe(members)}")
        members = tuple(members)
        for name in members:
            if name in seen:
                raise InputError(f"cache {name!r} is in layer {seen[name]} and layer {k}")
            seen[name] = k
        out[k] = members
    unknown = sorted(set(seen) - set(names))
    missing = sorted(set(names) - set(seen))
    if unknown or missing:
        raise InputError(f"layers must cover the plan's caches exactly: in no layer {missing}, not in the plan "
                         f"{unknown}")
    return {k: out[k] for k in sorted(out)}


def plan_caches(plan: TransferPlan) -> list[str]:
    """Every cache name a plan moves (an arena's fields each), in plan order."""
    return [c for p in plan.caches.values() for c in p.caches]


def layer_plans(plan: TransferPlan, layers: Mapping | None = None) -> dict[int, TransferPlan]:
    """Layer -> the part of ``plan`` that moves that layer's caches (``TransferPlan.only``)."""
    if not isinstance(plan, TransferPlan):
        raise InputTypeError(f"plan must be a TransferPlan (plan_transfer), got {describe(plan)}")
    return {k: plan.only(names) for k, names in layer_groups(plan_caches(plan), layers).items()}


def layer_plan(plan: TransferPlan, layer: int, layers: Mapping | None = None) -> TransferPlan:
    """The part of ``plan`` that moves layer ``layer``'s caches."""
    parts = layer_plans(plan, layers)
    if layer not in parts:
        raise InputError(f"the plan has no layer {layer!r}; its layers: {sorted(parts)}")
    return parts[layer]
