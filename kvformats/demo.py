"""``kvformats demo``: every registered format, random rows through encode/decode on one device,
checked against the format's documented per-element error bound.

Bounds (x = what the format quantizes; e = the block's scale exponent, scale = 2^e):

* fp8_ds_mla NoPE dims, x = bf16(input): e4m3 keeps 3 mantissa bits with round-to-nearest-even,
  so a normal code is off by at most half an ulp, 2^-4 of its binade, i.e. ``|x|/16``; a
  subnormal code (|x / 2^e| < 2^-6) is off by at most half the step 2^-9, i.e. 2^(e-10). The
  clamp never bites (|x| <= 448 2^e by construction), and the bf16 result of decode is exact
  (4 significant bits). Bound: ``max(|x|/16, 2^(e-10))``. RoPE tail: exact (bound 0).
* fp8_indexer, x = float32 input: the same e4m3 analysis with the row's float32 power-of-two
  multiplier: ``|x - x^| <= max(|x|/16, 2^(e-10))``.
* mxfp4_indexer: the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} 2^e has gaps of at most 2 2^e and
  |x / 2^e| <= 6, so the threshold rule is off by at most half a gap: ``2^e`` per block.
* compressor_state: kv and score + ape are stored as float32: exact (bound 0).

The reported ratio is max(err / bound) over elements with a positive bound (and 0 where an
exact field is exact; inf if an exact field is not). A ratio <= 1 means the bound holds.
"""

from __future__ import annotations

import time

import torch

import kvformats as kvf


def best_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _ratio(err: torch.Tensor, bound: torch.Tensor) -> float:
    """max(err / bound) where bound > 0; where bound == 0 the error must be 0 (else inf)."""
    pos = bound > 0
    r = (err[pos] / bound[pos]).max().item() if bool(pos.any()) else 0.0
    if bool((err[~pos] > 0).any()):
        return float("inf")
    return r


def _block_bound(layout, x32: torch.Tensor, block: int, kind: str) -> torch.Tensor:
    """Per-element bound for ``x32 [N, D]`` quantized in ``block``-wide blocks."""
    n, d = x32.shape
    blocks = x32.reshape(n, d // block, block)
    e = layout.scale_rule.exponents(blocks).unsqueeze(-1).to(torch.float32)
    if kind == "e2m1":
        return torch.exp2(e).expand_as(blocks).reshape(n, d)
    return torch.maximum(blocks.abs() / 16, torch.exp2(e - 10)).reshape(n, d)


def _case(layout, n: int, device: str, gen: torch.Generator):
    """(encode thunk, decode thunk, reference float32 [N, D], bound [N, D], cache, slots)."""
    cache = layout.allocate(-(-n // layout.page_size) + 1, device=device)
    slots = torch.randperm(cache.shape[0] * layout.page_size, generator=gen)[:n].to(device)
    if layout.name == "compressor_state":
        w = layout.width
        kv = torch.randn(n, w, generator=gen).to(device)
        score = torch.randn(n, w, generator=gen).to(device)
        ape = torch.randn(layout.ratio, w, generator=gen).to(device)
        pos = torch.randint(0, 1 << 20, (n,), generator=gen).to(device)
        ref = torch.cat([kv, score + ape[pos % layout.ratio]], dim=1)
        enc = lambda: layout.encode((kv, score), cache, slots, positions=pos, ape=ape)  # noqa: E731
        dec = lambda: torch.cat(layout.decode(cache, slots), dim=1)  # noqa: E731
        return enc, dec, ref, torch.zeros_like(ref), cache, slots
    x = (torch.randn(n, layout.head_dim, generator=gen) *
         torch.exp2(torch.randint(-8, 8, (n, 1), generator=gen).float())).to(torch.bfloat16).to(device)
    enc = lambda: layout.encode(x, cache, slots)  # noqa: E731
    dec = lambda: layout.decode(cache, slots).float()  # noqa: E731
    x32 = x.float()
    if layout.name in ("fp8_ds_mla", "fp8_ds_mla_v32"):
        nope = layout.nope_dim
        bound = torch.zeros_like(x32)
        bound[:, :nope] = _block_bound(layout, x32[:, :nope], 64 if layout.name == "fp8_ds_mla" else 128, "e4m3")
    elif layout.name == "mxfp4_indexer":
        bound = _block_bound(layout, x32, 32, "e2m1")
    else:
        bound = _block_bound(layout, x32, 128, "e4m3")
    return enc, dec, x32, bound, cache, slots


def _timed(fn, device: str, repeats: int = 3) -> tuple[float, object]:
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


def run_demo(rows: int = 4096, device: str | None = None, out=print, save_to: str | None = None) -> list[dict]:
    """Run every registered format; print a report through ``out``; return one dict per format.
    With ``save_to``, end by writing every cache to that file and dumping one fp8_ds_mla slot."""
    device = device or best_device()
    gen = torch.Generator().manual_seed(0)
    out(f"kvformats {kvf.__version__} demo: {rows} random rows per format on {device} "
        f"(torch {torch.__version__})")
    results, caches = [], {}
    for name in kvf.list_formats():
        layout = kvf.get_format(name)
        enc, dec, ref, bound, cache, slots = _case(layout, rows, device, gen)
        caches[name] = (layout, cache, int(slots[0]))
        t_enc, _ = _timed(enc, device)
        t_dec, got = _timed(dec, device)
        err = (got.float() - ref).abs()
        res = {"format": name, "max_err": err.max().item(), "mean_err": err.mean().item(),
               "ratio": _ratio(err, bound), "encode_rows_per_s": rows / t_enc,
               "decode_rows_per_s": rows / t_dec}
        results.append(res)
        out("")
        out(layout.describe())
        out(f"  round trip: max |err| {res['max_err']:.3g}, mean |err| {res['mean_err']:.3g}, "
            f"max err / bound {res['ratio']:.3f} ({'ok' if res['ratio'] <= 1 else 'BOUND VIOLATED'})")
        out(f"  speed: encode {res['encode_rows_per_s']:,.0f} rows/s, "
            f"decode {res['decode_rows_per_s']:,.0f} rows/s")
    out("")
    out("bounds: fp8 codes max(|x|/16, 2^(e-10)); mxfp4 2^e per block; rope tail and compressor "
        "state exact (x = bf16-rounded input for fp8_ds_mla, e = block scale exponent)")
    if save_to:
        _save_and_dump(caches, save_to, out)
    return results


def _save_and_dump(caches: dict, path: str, out) -> None:
    """Write every demo cache to one file, then show one slot the way ``kvformats dump`` does."""
    from kvformats.io import save_caches
    from kvformats.render import dump_slot

    save_caches(path, {name: (layout, cache) for name, (layout, cache, _) in caches.items()})
    layout, cache, slot = caches["fp8_ds_mla"]
    out("")
    out(f"wrote every demo cache to {path}; `kvformats dump {path} --tensor fp8_ds_mla --slot {slot}` shows:")
    out(dump_slot(layout, cache.cpu(), slot))
    out("")
    out(f"next: kvformats check {path}    kvformats dump {path} --tensor fp8_ds_mla --page {slot // layout.page_size}")


__all__ = ["run_demo", "best_device"]
