"""``kvformats demo``: every registered format, random rows through encode/decode on one device,
checked against the format's documented per-element error bound, then a cache-file round trip.

Bounds come from the layout's regions: each scaled data region is bounded by the grid of its
element type in ``kvformats.numerics.elements`` at the scale s of each block (``2^e`` for power-of-two
rules, the stored value otherwise): ``max(rel |x|, abs s, |x| - max s)``:

* e4m3 (``float8_e4m3fn``): 3 mantissa bits with round-to-nearest-even, so a normal code is off
  by at most half an ulp, 2^-4 of its binade, i.e. ``|x|/16``; a subnormal code (|x / 2^e| <
  2^-6) is off by at most half the step 2^-9, i.e. 2^(e-10). The clamp never bites (|x| <= 448
  2^e by construction). Bound: ``max(|x|/16, 2^(e-10))``. For fp8_ds_mla x is the bf16-rounded
  input (its decode is exact in bf16: 4 significant bits).
* e2m1 (``float4_e2m1fn_x2``): the grid {0, .5, 1, 1.5, 2, 3, 4, 6} 2^e has gaps of at most
  2 2^e and |x / 2^e| <= 6, so the threshold rule is off by at most half a gap: ``2^e``; with
  a stored e4m3 scale s that rounded down, the part of |x| beyond 6 s clips.
* unscaled data regions (the bf16 RoPE tail, the float32 compressor state): exact (bound 0);
  an unscaled region of a quantized type (nvfp4_ds_mla's e4m3 RoPE) has its type's bound at s = 1.

The reported ratio is max(err / bound) over elements with a positive bound (and 0 where an
exact field is exact; inf if an exact field is not). A ratio <= 1 means the bound holds. The
relative error is each element's error over the largest |x| of its row (rows span 2^-8..2^7).

The file step saves every cache with ``kvformats.caches.files`` and reads it back (into a temporary
directory that is removed, unless ``save_to`` names the file to keep); without the ``io`` extra
it is skipped with a one-line note.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch

import kvformats as kvf
from kvformats.errors import UnsupportedError

WIDTH = 100  # every line the demo prints fits a terminal this wide
SCALE_EXPONENTS = (-8, 7)  # each random row is N(0, 1) times 2^k, k uniform in this range
DUMP_BYTES, DUMP_VALUES = 8, 4  # of each region of the slot shown at the end


def best_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _ratio(err: torch.Tensor, bound: torch.Tensor) -> float:
    """max(err / bound) where bound > 0; where bound == 0 the error must be 0 (else inf)."""
    pos = bound > 0
    r = (err[pos] / bound[pos]).max().item() if bool(pos.any()) else 0.0
    if bool((err[~pos] > 0).any()):
        return float("inf")
    return r


def _block_bound(layout, region, x32: torch.Tensor) -> torch.Tensor:
    """Per-element bound for ``x32 [N, D]``, the values of a data region quantized in blocks of
    ``region.block`` against the scales the layout's rule picks for them: the bound of the
    region's element type (kvformats.numerics.elements) at each block's scale."""
    n, d = x32.shape
    blocks = x32.reshape(n, d // region.block, region.block)
    rule = layout.scale_rule
    if rule.power_of_two:
        scale = torch.exp2(rule.exponents(blocks).to(torch.float32))
    else:  # a stored scale that is not a power of two: its value
        scale = rule.scales_of_amax(blocks.abs().amax(-1))
    return region.element.bound(blocks, scale.unsqueeze(-1)).reshape(n, d)


def element_bound(layout, x32: torch.Tensor) -> torch.Tensor:
    """Per-element bound of ``x32 [N, D]`` (the decoded row order: the data regions in page
    order), read from the layout's regions: each scaled region by its element type and block,
    an unscaled region of a quantized element type by its grid at scale 1, every other data
    region exact (0)."""
    bound = torch.zeros_like(x32)
    at = 0
    for region in layout.data_regions:
        count = region.count
        if region.scale:
            if not region.element.quantized:
                raise UnsupportedError(f"the demo has no error bound for {region.dtype} "
                                       f"({layout.name}.{region.name})")
            bound[:, at:at + count] = _block_bound(layout, region, x32[:, at:at + count])
        elif region.element.quantized:  # codes of an unscaled region (nvfp4_ds_mla's e4m3 RoPE): scale 1
            x = x32[:, at:at + count]
            bound[:, at:at + count] = region.element.bound(x, torch.ones((), dtype=x.dtype))
        at += count
    if at != x32.shape[1]:
        raise UnsupportedError(f"{layout.name}: data regions hold {at} elements per row, "
                               f"decode gives {x32.shape[1]}")
    return bound


def _rows(gen: torch.Generator):
    """The demo's row values of a shape: N(0, 1) times 2^k per row (k in SCALE_EXPONENTS), in bf16."""
    lo, hi = SCALE_EXPONENTS

    def values(shape: tuple[int, ...]) -> torch.Tensor:
        x = torch.randn(shape, generator=gen)
        return (x * torch.exp2(torch.randint(lo, hi + 1, (shape[0], 1), generator=gen).float())).to(torch.bfloat16)

    return values


def _on(device: str, obj):
    """``obj`` (a tensor, or a tuple or dict of them) moved to ``device``."""
    if isinstance(obj, tuple):
        return tuple(_on(device, t) for t in obj)
    if isinstance(obj, dict):
        return {k: _on(device, t) for k, t in obj.items()}
    return obj.to(device)


def _case(layout, n: int, device: str, gen: torch.Generator):
    """(encode thunk, decode thunk, reference float32 [N, D], bound [N, D], cache, slots)."""
    cache = layout.allocate(-(-n // layout.page_size) + 1, device=device)
    slots = torch.randperm(cache.shape[0] * layout.page_size, generator=gen)[:n].to(device)
    x, kwargs, ref = _on(device, layout.examples.encode_args(n, _rows(gen), gen))

    def dec():
        out = layout.decode(cache, slots)
        return torch.cat(out, dim=1) if isinstance(out, tuple) else out.float()

    enc = lambda: layout.encode(x, cache, slots, **kwargs)  # noqa: E731
    return enc, dec, ref, element_bound(layout, ref), cache, slots


def _timed(fn, device: str, repeats: int = 3) -> tuple[float, Any]:
    out = fn()
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _header(layout) -> list[str]:
    params = ", ".join(f"{k}={v}" for k, v in layout.params.items())
    # the region table, without its (long) head line or a format's notes after it
    table = layout.describe().splitlines()[1:2 + len(layout.regions)]
    return [f"{layout.name}({params})",
            f"  row {layout.row_bytes} B, page {layout.page_bytes} B (min {layout.min_page_bytes} B)",
            *("  " + line for line in table)]


# Bytes per row and decoded element that one format's step holds at its peak: the bf16 input and
# the float32 values it is drawn from, the float32 reference, bound and its block temporaries,
# the decoded rows and their float32 copy, the error and the relative error (about 12 float32
# copies; measured: ~100 KB per row at 2048 elements, compressor_state's, the widest).
BYTES_PER_ELEMENT = 48


def memory_needed(rows: int) -> int:
    """About the bytes ``run_demo(rows)`` holds at its peak (measured within 1.2x at 65536 rows):
    the widest format's step (``BYTES_PER_ELEMENT`` per decoded element) beside every format's
    cache, kept for the file step, or that step, which holds them three times (the caches, the
    file's buffer, the caches read back), whichever is more."""
    layouts = [kvf.get_format(name) for name in kvf.list_formats()]
    widest = max(sum(region.count for region in layout.data_regions) for layout in layouts)
    caches = sum((-(-rows // layout.page_size) + 1) * layout.page_bytes for layout in layouts)
    return max(rows * widest * BYTES_PER_ELEMENT + caches, 3 * caches)


def run_demo(rows: int = 4096, device: str | None = None, out=print, save_to: str | None = None) -> list[dict]:
    """Run every registered format; print a report through ``out`` (lines of at most ``WIDTH``
    columns); return one dict per format (``ratio`` <= 1: the bound holds; ``file_ok``: the
    cache read back from its file equals it, None when the file step was skipped).

    The file step writes ``save_to`` when given (and keeps it), else a file in a temporary
    directory that is removed; it is skipped, with a note, without the io extra."""
    from kvformats.caches.files import IO_HINT, io_available

    device = device or best_device()
    gen = torch.Generator().manual_seed(0)
    lo, hi = SCALE_EXPONENTS
    out(f"kvformats {kvf.__version__} demo: {rows} random rows per format on {device} (torch {torch.__version__})")
    out(f"inputs: N(0,1) values times 2^k per row, k uniform in {lo}..{hi}; compressor_state: N(0,1)")
    out("bounds per element: e4m3 max(|x|/16, 2^(e-10)), e2m1 2^e (e: the block's scale exponent);")
    out("  unscaled fields (bf16 RoPE tail, float32 compressor state) exact, unscaled e4m3 at e = 0")
    results, caches = [], {}
    for name in kvf.list_formats():
        layout = kvf.get_format(name)
        enc, dec, ref, bound, cache, slots = _case(layout, rows, device, gen)
        caches[name] = (layout, cache, int(slots[0]))
        t_enc, _ = _timed(enc, device)
        t_dec, got = _timed(dec, device)
        err = (got.float() - ref).abs()
        row_max = ref.abs().amax(dim=1, keepdim=True)
        rel = torch.where(row_max > 0, err / row_max, err)
        res = {"format": name, "max_err": err.max().item(), "mean_err": err.mean().item(),
               "max_rel_err": rel.max().item(), "max_abs_input": ref.abs().max().item(),
               "ratio": _ratio(err, bound), "encode_rows_per_s": rows / t_enc,
               "decode_rows_per_s": rows / t_dec, "file_ok": None}
        results.append(res)
        out("")
        for line in _header(layout):
            out(line)
        out(f"  error: max |err| {res['max_err']:.3g}, mean |err| {res['mean_err']:.3g}, "
            f"for inputs up to |x| {res['max_abs_input']:.3g}")
        out(f"  relative: max |err| / its row's max |x| {100 * res['max_rel_err']:.2f}%; "
            f"max err / bound {res['ratio']:.3f} ({'ok' if res['ratio'] <= 1 else 'BOUND VIOLATED'})")
        if any(r.dtype == "float4_e2m1fn_x2" for r in layout.data_regions):
            out("  expected: e2m1 keeps one mantissa bit, so an element may be off by its block's scale 2^e, up to")
            out("  a third of the block's largest |x| (~30% of a row's max): that is fp4's bound, not a fault")
        out(f"  speed: encode {res['encode_rows_per_s']:,.0f} rows/s, decode {res['decode_rows_per_s']:,.0f} rows/s")
    out("")
    if io_available():
        file_ok = _file_round_trip(caches, save_to, out)
        for res in results:
            res["file_ok"] = file_ok[res["format"]]
    else:
        out(f"file: skipped (cache files need the io extra: {IO_HINT})")
    out(verdict(results))
    return results


def verdict(results: list[dict]) -> str:
    """The demo's last line: whether every format held its bound (and its file round trip)."""
    bad = [r["format"] for r in results if not r["ratio"] <= 1]
    lost = [r["format"] for r in results if r["file_ok"] is False]
    if not bad and not lost:
        return f"verdict: all {len(results)} formats round-trip within their bounds"
    parts = []
    if bad:
        parts.append(f"BOUND VIOLATED by {', '.join(bad)}")
    if lost:
        parts.append(f"file round trip changed {', '.join(lost)}")
    return f"verdict: FAILED: {'; '.join(parts)} ({len(results)} formats)"


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    return a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


def _file_round_trip(caches: dict, save_to: str | None, out) -> dict[str, bool]:
    """Save every demo cache to one file and read it back; show a few bytes of one slot the way
    ``kvformats dump`` shows them. Returns format -> whether the cache came back unchanged."""
    from kvformats.caches.files import load_caches, save_caches

    with tempfile.TemporaryDirectory(prefix="kvformats-demo-") as tmp:
        path = save_to or os.path.join(tmp, "kvformats-demo.safetensors")
        save_caches(path, {name: (layout, cache) for name, (layout, cache, _) in caches.items()})
        back = load_caches(path)
        same = {name: _same_bytes(back[name].cache, cache) for name, (_, cache, _) in caches.items()}
        size = os.path.getsize(path)
        out(f"file: wrote {path}" if save_to else "file: wrote a temporary cache file (removed; --save FILE keeps it)")
        ok = "read back byte-identical" if all(same.values()) else "READ BACK CHANGED"
        out(f"  {size / 2**20:.1f} MiB, {len(caches)} caches, every cache {ok}")
        shown = max(caches, key=lambda name: len(caches[name][0].regions))  # the richest dump; first by name
        layout, _, slot = caches[shown]
        out(f"  first bytes of one {shown} slot, as `kvformats dump FILE --tensor {shown} --slot {slot}`:")
        for line in slot_lines(layout, back[shown].cache, slot):
            out(line)
        if save_to:
            out(f"next: kvformats check {path}")
    return same


def slot_lines(layout, cache: torch.Tensor, slot: int) -> list[str]:
    """A few lines: each region of one slot with its first bytes and first decoded values."""
    from kvformats.caches.hexdump import slot_record

    rec = slot_record(layout, cache, slot)
    lines = [f"    slot {slot} = page {rec['page']} row {rec['row']}"]
    for reg in rec["regions"]:
        raw = bytes.fromhex(reg["hex"])
        more = " ..." if len(raw) > DUMP_BYTES else ""
        values = " ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in reg["values"][:DUMP_VALUES])
        vmore = " ..." if len(reg["values"]) > DUMP_VALUES else ""
        lines.append(f"    {reg['name']:<10} @{reg['offset']:<9} {raw[:DUMP_BYTES].hex(' ')}{more}  = {values}{vmore}")
    return [line[:WIDTH] for line in lines]


__all__ = ["run_demo", "best_device", "element_bound", "memory_needed", "verdict", "WIDTH"]
