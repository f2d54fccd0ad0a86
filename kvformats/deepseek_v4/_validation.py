"""Validation shared by the DeepSeek V4 operations. Every check raises a typed error
(InputError / InputTypeError / LayoutError) that says what was expected and what came, and none
writes anything. Checks that read tensor values (ranges, duplicates, ordering) run on the host
and are skipped inside CUDA-graph capture, where no host synchronisation can happen.
"""

from __future__ import annotations

import torch

from kvformats.codec.registry import get_format
from kvformats.errors import InputError, InputTypeError, LayoutError, describe
from kvformats.formats import CompressorState, Fp8DsMla
from kvformats.formats.compressor_state import RATIOS, halves
from kvformats.validation import FLOAT_DTYPES, INDEX_DTYPES, capturing, check_cache, check_tensor, repeats  # noqa: F401 - FLOAT_DTYPES: C.FLOAT_DTYPES


def check_mode(check) -> None:
    """``check`` is True, False or "strict", as every op takes it (spec/checks.md §1). For the ops
    whose inputs have no invalid values (each maps to a defined output, -1 for a missing entry):
    it is validated so that one ``check`` can be passed to every op, and changes nothing."""
    if check is True or check is False or (isinstance(check, str) and check == "strict"):
        return
    raise InputTypeError(f"check must be True, False or 'strict', got {check!r}")


def check_int(name: str, value, *, minimum: int = 0, allowed: tuple | None = None) -> int:
    """``value`` is a Python int >= ``minimum`` (and in ``allowed`` when given)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputTypeError(f"{name} must be an int, got {describe(value)}")
    if allowed is not None and value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value}")
    if value < minimum:
        raise InputError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_float(name: str, value, *, minimum: float = 0.0) -> float:
    """``value`` is a real number >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputTypeError(f"{name} must be a float, got {describe(value)}")
    if not value >= minimum:  # also rejects NaN
        raise InputError(f"{name} must be >= {minimum}, got {value}")
    return float(value)


def check_index(name: str, t, n: int | None, device) -> int:
    """``t`` is an int32/int64 ``[n]`` tensor on ``device``; returns its length."""
    check_tensor(name, t, dtypes=INDEX_DTYPES, shape=(n,), device=device)
    return t.shape[0]


def check_table(block_table, requests: int | None, device, base_offsets=None) -> int:
    """``block_table`` int ``[requests, max_pages]``; optional ``base_offsets`` int ``[requests]``."""
    check_tensor("block_table", block_table, dtypes=INDEX_DTYPES, shape=(requests, None), device=device)
    if base_offsets is not None:
        check_tensor("block_table_base_offsets", base_offsets, dtypes=INDEX_DTYPES,
                     shape=(block_table.shape[0],), device=device)
    return block_table.shape[0]


def check_cos_sin(cos_sin, device, rope_dim: int | None = None) -> int:
    """``cos_sin`` is float32 ``[max_positions, rope_dim]`` (rope_dim even); returns rope_dim."""
    check_tensor("cos_sin_cache", cos_sin, dtypes=(torch.float32,), shape=(None, rope_dim), device=device)
    if cos_sin.shape[1] == 0 or cos_sin.shape[1] % 2:
        raise InputError(f"cos_sin_cache must have an even, positive number of columns (the rope dim), "
                         f"got {describe(cos_sin)}")
    return cos_sin.shape[1]


def check_positions_in_table(positions, cos_sin, mask=None, name: str = "positions") -> None:
    """Host check: every position that will be rotated (``mask``) is a row of ``cos_sin``."""
    if positions.numel() == 0 or capturing(positions):
        return
    p = positions if mask is None else positions[mask]
    if p.numel() == 0:
        return
    lo, hi = int(p.min()), int(p.max())
    if lo < 0 or hi >= cos_sin.shape[0]:
        raise InputError(f"{name} must lie in [0, {cos_sin.shape[0]}) (rows of cos_sin_cache), got values "
                         f"in [{lo}, {hi}]; build a longer table with kvformats.deepseek_v4.rope.cos_sin_cache")


def check_sorted(name: str, t) -> None:
    """Host check: a cumulative offsets tensor never decreases."""
    if t.shape[0] > 1 and not capturing(t) and bool((t[1:] < t[:-1]).any()):
        raise InputError(f"{name} must never decrease (cumulative token offsets), got {t.tolist()[:16]}")


_LAYOUTS: dict[tuple, object] = {}


def layout_of(fmt, **params):
    """The layout of ``fmt`` (a Layout class or a registered format name) with ``params``, made
    once per parameters: building and validating a layout was most of an op's host-side
    checking, and layouts are immutable."""
    key = (fmt, *params.items())
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = get_format(fmt, **params) if isinstance(fmt, str) else fmt(**params)
        _LAYOUTS[key] = layout
    return layout


def state_layout(state_cache, ratio: int, head_dim: int) -> CompressorState:
    """The compressor-state layout of ``state_cache`` for ``ratio`` and ``head_dim``, checked."""
    check_int("ratio", ratio, allowed=RATIOS)
    if not isinstance(state_cache, torch.Tensor) or state_cache.dtype != torch.float32 or state_cache.dim() != 3:
        raise InputTypeError(f"state_cache must be a float32 tensor [pages, rows_per_page, 2 * W], "
                             f"got {describe(state_cache)}")
    coff = halves(ratio)
    if state_cache.shape[2] != 2 * coff * head_dim:
        raise LayoutError(f"state_cache rows must hold 2 * W = {2 * coff * head_dim} floats for ratio {ratio} "
                          f"and head_dim {head_dim} (W = {coff} * head_dim), got {state_cache.shape[2]}")
    if state_cache.shape[1] < 1:
        raise LayoutError(f"state_cache must have at least one row per page, got {describe(state_cache)}")
    layout = layout_of(CompressorState, head_dim=head_dim, ratio=ratio, page_size=state_cache.shape[1])
    check_cache(layout, state_cache)
    return layout


def ds_mla_layout(kv_cache, head_dim: int, rope_dim: int, page_size: int) -> Fp8DsMla:
    """The fp8_ds_mla layout the compressed/SWA cache must fit, checked against the cache."""
    check_int("kv_page_size", page_size, minimum=1)
    nope = head_dim - rope_dim
    if nope <= 0 or nope % 64:
        raise InputError(f"fp8_ds_mla needs head_dim - rope_dim to be a positive multiple of 64, got "
                         f"head_dim {head_dim} and rope_dim {rope_dim}")
    layout = layout_of(Fp8DsMla, head_dim=head_dim, rope_dim=rope_dim, page_size=page_size)
    check_cache(layout, kv_cache)
    return layout


def check_written_slots(layout, cache, slots, write, name: str) -> None:
    """Host check on the rows that will be written: below the cache's capacity, no repeats."""
    if slots.numel() == 0 or capturing(slots):
        return
    live = slots[write & (slots >= 0)]
    capacity = cache.shape[0] * layout.page_size
    if live.numel() and int(live.max()) >= capacity:
        raise InputError(f"{name} has slot {int(live.max())} beyond the cache's capacity: {cache.shape[0]} pages "
                         f"* {layout.page_size} rows = {capacity} slots (negative means 'no row')")
    if repeats(live):
        raise InputError(f"{name} repeats a target row among the rows this call writes")
