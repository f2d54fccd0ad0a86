"""``kvformats check``: validate every page of a cache against rules derived from its layout.

Rules come from the regions' declared roles and element types, so every format gets them:
pad bytes are zero; ue8m0 scale bytes are never 0xFF and lie in the exponent range a finite
input can produce (fp8_ds_mla: 105..247); float32 scales are powers of two in that range; e4m3
bytes are never NaN codes; e2m1 nibbles are never the negative zero the writer cannot emit;
bf16 and float32 values are finite. A row whose bytes are all zero was never written and is
exempt from the scale-range rules. Pages are streamed in chunks, so memory stays bounded.
"""

from __future__ import annotations

import functools

import torch

from kvformats.caches.regions import region_bytes
from kvformats.layout import Layout, Region
from kvformats.numerics import codes as nx
from kvformats.numerics.elements import ELEMENTS

CHUNK_BYTES = 64 << 20
MAX_LISTED_PAGES = 20
_ONES = {4: 0x1111111111111111, 8: 0x0101010101010101}  # the lowest bit of every nibble / byte
_HIGH = {4: 0x8888888888888888 - (1 << 64), 8: 0x8080808080808080 - (1 << 64)}  # as int64


def _words(raw: torch.Tensor) -> torch.Tensor | None:
    """An int64 view of region bytes ``[..., nbytes]`` when alignment allows, else None."""
    try:
        return raw.view(torch.int64)
    except RuntimeError:
        return None


def has_field(words: torch.Tensor, value: int, width: int) -> torch.Tensor:
    """Per 8-byte word: does any ``width``-bit field (4 or 8) equal ``value``? SWAR: xor turns
    matching fields into zero fields, and ``(x - ones) & ~x & high`` is non-zero exactly when some
    field of x is zero (a borrow can only start at the lowest zero field)."""
    pattern = 0
    for shift in range(0, 64, width):
        pattern |= value << shift
    x = words ^ (pattern - (1 << 64) if pattern >= 1 << 63 else pattern)
    return ((x - _ONES[width]) & ~x & _HIGH[width]) != 0


def _fields_equal(raw: torch.Tensor, width: int, mask: int, value: int) -> torch.Tensor:
    """Per 8-byte word when alignment allows (else per byte): does any ``width``-bit field c (4
    or 8) hold ``c & mask == value``?"""
    words = _words(raw)
    if words is not None:
        wide = 0
        for shift in range(0, 64, width):
            wide |= mask << shift
        return has_field(words & (wide - (1 << 64) if wide >= 1 << 63 else wide), value, width)
    full = (1 << width) - 1
    return functools.reduce(torch.logical_or, (((raw >> shift) & full & mask) == value for shift in range(0, 8, width)))


def _bad_codes(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """Bytes (or words) holding a NaN code of element type ``kind`` (its short name: "e4m3"), or
    for a type without NaN codes the negative zero its writers never emit ("e2m1")."""
    elem = next(e for e in ELEMENTS.values() if e.short == kind)
    if elem.nan is not None:
        return _fields_equal(raw, elem.bits, elem.nan.mask, elem.nan.code)
    if elem.negative_zero is None:  # no code its writers never emit: nothing to flag
        return torch.zeros_like(raw, dtype=torch.bool)
    return _fields_equal(raw, elem.bits, (1 << elem.bits) - 1, elem.negative_zero)


def scale_exponent_range(layout: Layout) -> tuple[int, int] | None:
    """(lowest, highest) scale exponent encode can produce from finite input, from the layout's
    (profile's) ScaleRule and the dtype encode rounds its input to; None for unscaled formats and
    for rules that store arbitrary (not power-of-two) float32 scales."""
    rule = getattr(layout, "scale_rule", None)
    if rule is None or not rule.power_of_two:
        return None
    floor = torch.tensor([rule.floor], dtype=torch.float32)
    biggest = torch.tensor([torch.finfo(layout.quant_input_dtype).max], dtype=torch.float32)
    if rule.exponent_mode == "floor_minus_emax":
        lo, hi = nx.floor_log2(floor) - rule.element_emax, nx.floor_log2(biggest) - rule.element_emax
    else:
        lo = nx.ceil_log2(floor / rule.element_max if rule.floor_on == "absmax" else floor)
        hi = nx.ceil_log2(biggest / rule.element_max)
    clamp = (rule.exponent_min, rule.exponent_max)
    return max(int(lo), clamp[0]), min(int(hi), clamp[1])


def _signed_zero_allowed(layout: Layout) -> bool:
    """Whether the layout's profile writes e2m1 negative zero (nibble 0x8) for tiny negatives."""
    profile = getattr(layout, "numerics", None)
    return bool(getattr(profile, "e2m1_signed_zero", False))


def _violations(layout: Layout, region: Region, raw: torch.Tensor, written: torch.Tensor, erange) -> dict:
    """Rule name -> bool tensor [pages] of rows/pages breaking it, for one region of a chunk."""
    rows = lambda bad: (bad.reshape(*bad.shape[:2], -1).any(-1))  # noqa: E731 - [P, rows]
    found = {}
    elem = region.element
    if region.role == "pad":
        found["pad_zero"] = (raw != 0).any(-1)  # empty where the page has no pad bytes
    elif elem.exponent_bias and elem.nan is not None:  # exponent bytes: never the NaN code, in the range encode reaches
        found[elem.nan.rule] = rows(elem.is_nan_code(raw))
        if erange is not None:
            lo, hi = erange[0] + elem.exponent_bias, erange[1] + elem.exponent_bias
            found["scale_range"] = rows((raw < lo) | (raw > hi)) & written
    elif elem.ieee and region.role == "scale":
        bits = raw.contiguous().view(getattr(torch, f"int{elem.bits}")).to(torch.int64)  # sign-extended
        ebits = elem.bits - 1 - elem.mantissa_bits
        emax = (1 << ebits) - 1
        exp = ((bits >> elem.mantissa_bits) & emax) - (emax >> 1)
        if erange is not None:
            sign_or_fraction = (1 << (elem.bits - 1)) | ((1 << elem.mantissa_bits) - 1)
            bad = (bits & sign_or_fraction) != 0  # not a positive power of two
            bad |= (exp < erange[0]) | (exp > erange[1])
            found["scale_pow2_range"] = rows(bad) & written
        else:  # arbitrary float scales (e.g. vLLM's): positive and finite
            bad = (bits <= 0) | (exp == (emax >> 1) + 1)
            found["scale_positive_finite"] = rows(bad) & written
    elif elem.nan is not None:
        found[elem.nan.rule] = rows(_bad_codes(raw, elem.short))
    elif elem.negative_zero is not None:
        if not _signed_zero_allowed(layout):
            found[f"{elem.short}_no_negative_zero"] = rows(_bad_codes(raw, elem.short))
    elif elem.ieee:
        values = raw.contiguous().view(elem.torch_dtype)
        found[f"{region.dtype}_finite"] = rows(~torch.isfinite(values))
    return {name: bad.any(-1) if bad.dim() > 1 else bad for name, bad in found.items()}


def check(layout: Layout, cache: torch.Tensor) -> dict:
    """Validate every page -> report dict: ``ok``, ``pages``, per rule the number of bad pages
    and the first bad page ids, and the first bad pages with the rules they break."""
    erange = scale_exponent_range(layout)
    pages_total = cache.shape[0]
    chunk = max(1, CHUNK_BYTES // max(layout.page_bytes, 1))
    rules: dict[str, dict] = {}
    per_page: dict[int, list[str]] = {}
    for start in range(0, pages_total, chunk):
        sl = slice(start, min(start + chunk, pages_total))
        raws = {r.name: region_bytes(layout, cache, r, sl) for r in layout.regions}
        written = torch.zeros(raws[layout.regions[0].name].shape[:2], dtype=torch.bool, device=cache.device)
        for r in layout.regions:
            if not r.per_page:
                written |= raws[r.name].amax(-1) != 0
        for r in layout.regions:
            for name, bad in _violations(layout, r, raws[r.name], written, erange).items():
                entry = rules.setdefault(name, {"bad_pages": 0, "first_pages": []})
                ids = (bad.nonzero().flatten() + start).tolist()
                entry["bad_pages"] += len(ids)
                entry["first_pages"] = (entry["first_pages"] + ids)[:MAX_LISTED_PAGES]
                for p in ids:
                    if len(per_page) < MAX_LISTED_PAGES or p in per_page:
                        per_page.setdefault(p, []).append(f"{r.name}:{name}")
    return {"format": layout.name, "params": layout.params, "pages": pages_total,
            "scale_exponent_range": list(erange) if erange else None,
            "ok": all(v["bad_pages"] == 0 for v in rules.values()), "rules": rules,
            "bad_pages": [{"page": p, "violations": v} for p, v in sorted(per_page.items())]}
