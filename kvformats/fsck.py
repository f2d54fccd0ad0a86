"""``kvformats check``: validate every page of a cache against rules derived from its layout.

Rules come from the regions' declared roles and element types, so every format gets them:
pad bytes are zero; ue8m0 scale bytes are never 0xFF and lie in the exponent range a finite
input can produce (fp8_ds_mla: 105..247); float32 scales are powers of two in that range; e4m3
bytes are never NaN codes; e2m1 nibbles are never the negative zero the writer cannot emit;
bf16 and float32 values are finite. A row whose bytes are all zero was never written and is
exempt from the scale-range rules. Pages are streamed in chunks, so memory stays bounded.
"""

from __future__ import annotations

import torch

from kvformats import numerics as nx
from kvformats.inspect import region_bytes
from kvformats.layout import Layout, Region

CHUNK_BYTES = 64 << 20
MAX_LISTED_PAGES = 20


def scale_exponent_range(layout: Layout) -> tuple[int, int] | None:
    """(lowest, highest) scale exponent encode can produce from finite input, from the layout's
    ScaleRule and the dtype encode rounds its input to; None for unscaled formats."""
    rule = getattr(layout, "scale_rule", None)
    if rule is None:
        return None
    floor = torch.tensor([rule.floor], dtype=torch.float32)
    biggest = torch.tensor([torch.finfo(layout.quant_input_dtype).max], dtype=torch.float32)
    lo = nx.ceil_log2(floor / rule.element_max if rule.floor_on == "absmax" else floor)
    hi = nx.ceil_log2(biggest / rule.element_max)
    clamp = (rule.exponent_min, rule.exponent_max)
    return max(int(lo), clamp[0]), min(int(hi), clamp[1])


def _violations(layout: Layout, region: Region, raw: torch.Tensor, written: torch.Tensor, erange) -> dict:
    """Rule name -> bool tensor [pages] of rows/pages breaking it, for one region of a chunk."""
    rows = lambda bad: (bad.reshape(*bad.shape[:2], -1).any(-1))  # noqa: E731 - [P, rows]
    found = {}
    if region.role == "pad":
        found["pad_zero"] = rows(raw != 0)
    elif region.dtype == "float8_e8m0fnu":
        found["ue8m0_not_ff"] = rows(raw == 0xFF)
        if erange is not None:
            lo, hi = erange[0] + nx.UE8M0_BIAS, erange[1] + nx.UE8M0_BIAS
            found["scale_range"] = rows((raw < lo) | (raw > hi)) & written
    elif region.dtype == "float32" and region.role == "scale":
        bits = raw.contiguous().view(torch.int32)
        exp = ((bits >> 23) & 0xFF) - 127
        bad = (bits & 0x807FFFFF) != 0  # sign or mantissa set: not a positive power of two
        if erange is not None:
            bad |= (exp < erange[0]) | (exp > erange[1])
        found["scale_pow2_range"] = rows(bad) & written
    elif region.dtype == "float8_e4m3fn":
        found["e4m3_not_nan"] = rows((raw & 0x7F) == 0x7F)
    elif region.dtype == "float4_e2m1fn_x2":
        found["e2m1_no_negative_zero"] = rows(((raw & 0xF) == 0x8) | ((raw >> 4) == 0x8))
    elif region.dtype in ("bfloat16", "float32"):
        values = raw.contiguous().view(getattr(torch, region.dtype))
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
                written |= (raws[r.name] != 0).any(-1)
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
