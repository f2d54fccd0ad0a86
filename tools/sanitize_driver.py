"""Call every kvformats op that has a Triton kernel once, on small inputs, for compute-sanitizer.

    python tools/sanitize_driver.py [--device cuda|cpu] [--quick] [--list]

Run by ``tools/sanitize.py`` under each compute-sanitizer tool, as a process of its own.

* Codec ops: for every registered format with a Triton ``encode`` / ``decode`` / ``gather`` /
  ``dequantize_gather`` / ``gather_paged`` / ``decode_topk`` (``kvformats.codec.registry``), calls
  through the public layout methods with ``backend="triton"`` on caches whose last page ends
  exactly where their allocation ends, with −1 slots, slots beyond the capacity
  (``check=False``, up to ``2^31 - 1`` / ``2^40``), block tables with −1 entries, pages beyond
  the cache and positions beyond the table, and workspaces of the exact size. Ops without a
  Triton kernel are skipped (listed with ``--list``).
* Every public ``kvformats.deepseek_v4`` operation through its public function with
  ``backend="auto"`` (the Triton kernel on CUDA once one is registered, else the reference),
  on the paged batches of ``tests/harness/dsv4_scenarios.py`` (missing pages, −1 slots).

Every call is made even if an earlier one raised; the last line is
``SANITIZE-DRIVER-DONE calls=.. failures=.. triton_launches=.. kernels=..`` (compiled Triton
launches, counted through Triton's launch hook), which ``tools/sanitize.py`` requires: a run
without it did not finish. Exit status 1 if any call failed. ``--device cpu`` runs the same
calls on the reference backend (a check of the inputs themselves).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's kvformats, installed or not

import torch  # noqa: E402

import kvformats as kvf  # noqa: E402
from kvformats import deepseek_v4 as dsv4  # noqa: E402
from kvformats.codec import paged_ops as paged, registry  # noqa: E402
from tests.harness.launch_count import LaunchCounter  # noqa: E402
from tests.harness.sanitize_dsv4_cases import dsv4_cases  # noqa: E402,F401  (also used by the tests)

CODEC_OPS = ("encode", "decode", "gather", *paged.PAGED_OPS)
SENTINEL = 0xA5
# Second geometry per format (odd page sizes and row sizes); formats not listed get page_size 4 only.
ODD = {
    "fp8_ds_mla": dict(head_dim=192, rope_dim=64, page_size=3),
    "fp8_indexer": dict(head_dim=256, page_size=5),
    "mxfp4_indexer": dict(head_dim=96, page_size=2),
    "compressor_state": dict(head_dim=48, ratio=128, page_size=8),
    "compressor_state_v41": dict(head_dim=48, page_size=2),
    "fp8_ds_mla_v41": dict(head_dim=96, page_size=3),
    "fp4_ds_mla_v41": dict(head_dim=48, page_size=5),
    "fp8_ds_mla_v41_interleaved": dict(head_dim=96, page_size=3),
    "fp4_ds_mla_v41_interleaved": dict(head_dim=48, page_size=5),
}
DONE = "SANITIZE-DRIVER-DONE"


class Driver:
    """Collects (label, thunk) calls; ``run`` makes each, counting failures."""

    def __init__(self, device: torch.device, quick: bool):
        self.device, self.quick = device, quick
        self.calls: list[tuple[str, object]] = []
        self.skipped: list[str] = []
        self.gen = torch.Generator().manual_seed(0)

    def add(self, label: str, fn) -> None:
        self.calls.append((label, fn))

    # -- inputs, built on the host and copied (no device kernels besides the fills)
    def t(self, values, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device)

    def randn(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(dtype).to(self.device)

    def cache(self, layout, pages: int, *, exact: bool = False, pad: int = 0) -> torch.Tensor:
        """A zeroed cache whose last page ends exactly at the end of its allocation (a write past
        it is out of bounds); ``exact``: byte pages only ``min_page_bytes`` wide; ``pad``: extra
        elements in the page stride, filled with the sentinel."""
        if layout.container_dtype != torch.uint8:
            elems = layout.page_size * layout.cache_shape(1)[2]
            arena = torch.zeros((pages - 1) * (elems + pad) + elems, dtype=layout.container_dtype, device=self.device)
            return arena.as_strided(layout.cache_shape(pages), (elems + pad, layout.cache_shape(1)[2], 1))
        width = layout.min_page_bytes if exact else layout.page_bytes
        arena = torch.full(((pages - 1) * (width + pad) + width,), SENTINEL, dtype=torch.uint8, device=self.device)
        cache = arena.as_strided((pages, width), (width + pad, 1))
        cache[:, :layout.min_page_bytes] = 0
        return cache

    def run(self) -> int:
        failures = 0
        for label, fn in self.calls:
            try:
                fn()
            except Exception:  # keep going: the sanitizer should still see every other kernel
                failures += 1
                print(f"FAILED {label}:\n{traceback.format_exc()}", flush=True)
        if self.device.type == "cuda":
            try:
                torch.cuda.synchronize()
            except Exception:
                failures += 1
                print(f"FAILED final synchronize:\n{traceback.format_exc()}", flush=True)
        return failures


# ----- codec ops ----------------------------------------------------------------------------------
INTERPRETER = [False]  # --interpreter: CPU tensors go to the Triton launchers (TRITON_INTERPRET=1)


def codec_backend(fmt: str, op: str, device: torch.device) -> str | None:
    """"triton" where that op has a Triton kernel on CUDA (or a launcher, with --interpreter);
    "reference" on the CPU; None: skip."""
    if device.type != "cuda" and INTERPRETER[0]:
        from tests.harness.reliability_harness import kernel_impl

        return "triton" if kernel_impl(fmt, op) is not None else None
    if device.type != "cuda":
        return "reference" if "reference" in registry._OPS.get((fmt, op), {}) else None
    registry._load_kernels()
    return "triton" if "triton" in registry._OPS.get((fmt, op), {}) else None


def layouts_of(fmt: str, quick: bool) -> list:
    out = [kvf.get_format(fmt, page_size=4)]
    if not quick and fmt in ODD:
        out.append(kvf.get_format(fmt, **ODD[fmt]))
    return out


def encode_inputs(d: Driver, layout, n: int, dtype) -> tuple:
    if layout.decode_dtype is None and not hasattr(layout, "ratio"):  # compressor_state_v41: (kv, score) alone
        return (d.randn(n, layout.width, dtype=dtype), d.randn(n, layout.width, dtype=dtype)), {}
    if layout.decode_dtype is None:  # compressor_state: (kv, score) with positions and ape
        w = layout.width
        kw = dict(positions=d.t(list(range(5, 5 + n))), ape=d.randn(layout.ratio, w, dtype=dtype))
        return (d.randn(n, w, dtype=dtype), d.randn(n, w, dtype=dtype)), kw
    return d.randn(n, layout.head_dim, dtype=dtype) * 3, {}


def strided_rows(x: torch.Tensor, extra: int = 3) -> torch.Tensor:
    wide = torch.zeros(x.shape[0], x.shape[1] + 2 * extra, dtype=x.dtype, device=x.device)
    wide[:, extra:extra + x.shape[1]] = x
    return wide[:, extra:extra + x.shape[1]]


def add_encodes(d: Driver, layout, cache, b: str, tag: str) -> None:
    cap = cache.shape[0] * layout.page_size
    ps = layout.page_size
    dtypes = [torch.bfloat16] if d.quick else [torch.bfloat16, torch.float16, torch.float32]
    for dtype in dtypes:
        x, kw = encode_inputs(d, layout, 4, dtype)
        slots = d.t([0, cap - 1, -1, ps + 1 if ps + 1 < cap - 1 else 1])
        d.add(f"{tag} encode {dtype}", lambda x=x, kw=kw, s=slots: layout.encode(x, cache, s, backend=b, **kw))
    x, kw = encode_inputs(d, layout, 5, torch.bfloat16)
    for dtype, huge in ((torch.int32, 2**31 - 1), (torch.int64, 2**40)):
        wild = d.t([cap, -1, 1, cap + 1000, huge], dtype)
        d.add(f"{tag} encode check=False {dtype}",
              lambda s=wild: layout.encode(x, cache, s, backend=b, check=False, **kw))
    if not d.quick:
        xs = tuple(strided_rows(t) for t in x) if isinstance(x, tuple) else strided_rows(x)
        d.add(f"{tag} encode strided", lambda: layout.encode(xs, cache, d.t([2, 0, -1, cap - 2, 3]), backend=b, **kw))


def add_reads(d: Driver, layout, cache, fmt: str, tag: str) -> None:
    cap = cache.shape[0] * layout.page_size
    for op in ("decode", "gather"):
        b = codec_backend(fmt, op, d.device)
        if b is None:
            d.skipped.append(f"{fmt}.{op}")
            continue
        fn = getattr(layout, op)
        d.add(f"{tag} {op}", lambda fn=fn, b=b: fn(cache, d.t([cap - 1, -1, 0, 2], torch.int32), backend=b))
        d.add(f"{tag} {op} check=False",
              lambda fn=fn, b=b: fn(cache, d.t([cap, 2**40, -5, 1, cap - 1]), backend=b, check=False))
    b = codec_backend(fmt, "decode_topk", d.device)
    if b is None:
        d.skipped.append(f"{fmt}.decode_topk")
    else:
        topk = d.t([[cap - 1, -1, 0], [-1, -1, 2]], torch.int32)
        d.add(f"{tag} decode_topk", lambda b=b: layout.decode_topk(cache, topk, backend=b))


def add_paged(d: Driver, layout, cache, fmt: str, tag: str) -> None:
    pages, ps = cache.shape[0], layout.page_size
    # -1 entries, a page beyond the cache (pages), and positions beyond the table's width
    table = d.t([[pages - 1, -1, 0], [pages, 1 % pages, -1]], torch.int32)
    # each op's backend under its own name: the lambdas run later, after the next op's lookup
    b_dg = codec_backend(fmt, "dequantize_gather", d.device)
    if layout.decode_dtype is None:  # no single decoded row type: the op does not apply
        pass
    elif b_dg is None:
        d.skipped.append(f"{fmt}.dequantize_gather")
    else:
        seq = [3 * ps + 2, 2 * ps + 1]
        glen = [min(s, 2 * ps + 1) for s in seq]
        out = torch.zeros((2, 1 + max(glen), layout.head_dim), dtype=layout.decode_dtype, device=d.device)
        d.add(f"{tag} dequantize_gather", lambda: layout.dequantize_gather(
            cache, out, block_table=table, seq_lens=d.t(seq), gather_lens=d.t(glen),
            block_table_base_offsets=d.t([0, 1]), offset=1, backend=b_dg))
        d.add(f"{tag} dequantize_gather (seq_lens only)", lambda: layout.dequantize_gather(
            cache, out[:, :ps + 2], block_table=table, seq_lens=d.t([ps + 2, 1]), backend=b_dg))
    b = codec_backend(fmt, "gather_paged", d.device)
    if b is None:
        d.skipped.append(f"{fmt}.gather_paged")
    else:
        cu = [0, 3 * ps + 1, 3 * ps + 1 + 2 * ps]
        ws = tuple(torch.zeros((cu[-1], s.record_bytes), dtype=torch.uint8, device=d.device) for s in layout.segments)
        d.add(f"{tag} gather_paged", lambda b=b: layout.gather_paged(
            cache, block_table=table, cu_seq_lens=d.t(cu, torch.int32), out=ws, backend=b))


def add_profile_encodes(d: Driver, fmt: str) -> None:
    """One encode per non-default numerics profile (each is its own compiled encode variant)."""
    from kvformats.numerics.profiles import profile_table

    table = profile_table(fmt)
    for name in (table.names if table is not None else ()):
        layout = kvf.get_format(fmt, page_size=4, profile=name)
        if layout.default_profile or codec_backend(fmt, "encode", d.device) is None:
            continue
        cache = d.cache(layout, 3)
        x, kw = encode_inputs(d, layout, 4, torch.bfloat16)
        cap = 3 * layout.page_size
        d.add(f"{fmt} profile {name} encode", lambda layout=layout, cache=cache, x=x, kw=kw, cap=cap: layout.encode(
            x, cache, d.t([cap - 1, -1, 0, 5]), backend=_encode_backend(d), **kw))


def add_profile_reads(d: Driver, fmt: str) -> None:
    """The reads of one profile per reading of scale byte 0xFF (``ue8m0_ff``) other than the
    default profile's: the decode kernels take it as a constexpr, so each is its own variant."""
    from kvformats.numerics.profiles import profile_table

    table = profile_table(fmt)
    if table is None:
        return
    seen = {table.get(table.default).ue8m0_ff}
    for name in table.names:
        layout = kvf.get_format(fmt, page_size=4, profile=name)
        if layout.numerics.ue8m0_ff in seen:
            continue
        seen.add(layout.numerics.ue8m0_ff)
        cache = d.cache(layout, 3)
        add_reads(d, layout, cache, fmt, f"{fmt} profile {name}")
        add_paged(d, layout, cache, fmt, f"{fmt} profile {name}")


def _encode_backend(d: Driver) -> str:
    return "reference" if d.device.type != "cuda" and not INTERPRETER[0] else "triton"


def add_codec_calls(d: Driver) -> None:
    for fmt in kvf.list_formats():
        if not d.quick:
            add_profile_encodes(d, fmt)
        add_profile_reads(d, fmt)
        if codec_backend(fmt, "encode", d.device) is None:
            d.skipped.append(f"{fmt}.encode")
        for layout in layouts_of(fmt, d.quick):
            tag = f"{fmt}{layout.params}"
            variants = [dict()] if d.quick or layout.container_dtype != torch.uint8 else [dict(), dict(exact=True, pad=13)]
            if layout.container_dtype != torch.uint8 and not d.quick:
                variants.append(dict(pad=7))
            for v in variants:
                cache = d.cache(layout, 3, **v)
                b = codec_backend(fmt, "encode", d.device)
                if b is not None:
                    add_encodes(d, layout, cache, b, f"{tag}{v}")
                add_reads(d, layout, cache, fmt, f"{tag}{v}")
                add_paged(d, layout, cache, fmt, f"{tag}{v}")


# ----- deepseek_v4 ops ----------------------------------------------------------------------------
def dsv4_backend(op: str) -> str:
    """"auto" (the Triton kernel on CUDA once registered); with --interpreter, "triton" where a
    kernel is registered, so the launchers see these inputs on the CPU too."""
    if INTERPRETER[0]:
        from tests.harness.reliability_harness import family_kernel

        if family_kernel(dsv4.FAMILY, op) is not None:
            return "triton"
    return "auto"


def add_dsv4_calls(d: Driver) -> None:
    for label, op, build in dsv4_cases(d):
        b = dsv4_backend(op)
        d.add(f"deepseek_v4.{label} ({b})", lambda op=op, build=build, b=b: getattr(dsv4, op)(**build(), backend=b))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="one input dtype and one geometry per format")
    p.add_argument("--interpreter", action="store_true",
                   help="CPU only: call the Triton launchers under TRITON_INTERPRET=1 (slow; checks the inputs)")
    p.add_argument("--only", choices=("codec", "dsv4"), default=None,
                   help="only the format codec / paged ops, or only the deepseek_v4 operations")
    p.add_argument("--list", action="store_true", help="print the calls (and skipped ops) without running them")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.interpreter and args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports Triton
        INTERPRETER[0] = True
    d = Driver(torch.device(args.device), args.quick)
    if args.only != "dsv4":
        add_codec_calls(d)
    if args.only != "codec":
        add_dsv4_calls(d)
    if args.list:
        print("\n".join(label for label, _ in d.calls))
        print("skipped (no Triton kernel): " + (", ".join(sorted(set(d.skipped))) or "none"))
        return 0
    counter = LaunchCounter()
    counted = counter.install()
    t0 = time.time()
    if INTERPRETER[0]:
        from tests.harness.reliability_harness import kernel_routing

        with kernel_routing():
            failures = d.run()
    else:
        failures = d.run()
    counter.remove()
    kernels = ",".join(f"{k}:{v}" for k, v in sorted(counter.counts.items()))
    print(f"triton kernels launched: {kernels or 'none'}")
    print(f"skipped (no Triton kernel): {', '.join(sorted(set(d.skipped))) or 'none'}")
    print(f"{DONE} calls={len(d.calls)} failures={failures} "
          f"triton_launches={counter.total() if counted else -1} "
          f"kernels={len(counter.counts)} seconds={time.time() - t0:.1f}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
