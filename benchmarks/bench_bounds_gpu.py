"""Yardsticks that bound the issue figures no kernel of ours has reached, on the GPU.

    python3 benchmarks/bench_bounds_gpu.py [--read-mb 33.62] [--rows 64]

Per-call µs inside a replayed CUDA graph (gpu_timing.graph_per_call_us). The read floor cycles
through 8 buffers of the size read, so no call finds its data in L2; the 64-row calls cycle
through 8 slot sets, whose few hundred KB of records may stay in L2 across replays, as in the
op benchmarks' 64-row cases:

- *read floor*: reading ``--read-mb`` of contiguous float32 and nothing else (the HCA
  compress-insert at 64 decode rows must read 33.62 MB of state windows before it can write
  a row): torch.sum over all of it, torch.sum per row of 64 rows, and a Triton kernel whose
  programs each sum one contiguous chunk (chunk sizes swept); the fastest is what any kernel
  reading those bytes pays, launch, ramp-up and tail included;
- *node floors*: an empty Triton kernel, and a ``torch.zeros`` of 64 int32 (a memset node);
- *64-row chain*: a Triton kernel of one program (one warp) per row that loads the row's slot,
  then its 584-byte fp8_ds_mla record from a 1 GiB cache, then stores it: the dependent-load
  chain every slot-addressed op at 64 rows pays, against the library's own gather and decode
  of the same slots.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import subprocess

import torch
import triton
import triton.language as tl
from gpu_timing import copy_bandwidth, graph_per_call_us

import kvformats as kvf

BUFFERS = 8


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit
def _chunk_sum_kernel(x_ptr, out_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """out[pid] = sum of floats pid * CHUNK .. + CHUNK, in BLOCK-wide vector loads."""
    base = tl.program_id(0).to(tl.int64) * CHUNK
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in tl.range(0, CHUNK, BLOCK):
        acc += tl.load(x_ptr + base + i + tl.arange(0, BLOCK))
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def _row_chain_kernel(cache_ptr, slots_ptr, out_ptr, page_stride, REC: tl.constexpr, REC_P2: tl.constexpr,
                      PAGE_SIZE: tl.constexpr, SCALE_OFF: tl.constexpr, SCALE: tl.constexpr):
    """out[pid] = the record of slot slots[pid]: REC bytes at row (slot % PAGE_SIZE) of page
    slot // PAGE_SIZE, and with SCALE > 0 also the SCALE bytes of its scale record at SCALE_OFF
    (fp8_ds_mla's two segments). Slot load, record loads, stores: nothing else."""
    slot = tl.load(slots_ptr + tl.program_id(0)).to(tl.int64)
    page, row = slot // PAGE_SIZE, slot % PAGE_SIZE
    k = tl.arange(0, REC_P2)
    v = tl.load(cache_ptr + page * page_stride + row * REC + k, mask=k < REC)
    dst = out_ptr + tl.program_id(0) * (REC + SCALE)
    if SCALE > 0:  # both loads before any store (a load cannot move above a store that may alias it)
        j = tl.arange(0, SCALE)
        s = tl.load(cache_ptr + page * page_stride + SCALE_OFF + row * SCALE + j)
        tl.store(dst + REC + j, s)
    tl.store(dst + k, v, mask=k < REC)


def read_floor(nbytes: int, log) -> None:
    n = max(1, round(nbytes / 4 / 131072)) * 131072  # floats: a multiple of every chunk below
    xs = [torch.randn(n, device="cuda") for _ in range(BUFFERS)]
    mb = f"read {4 * n / 1e6:.2f} MB"
    log(f"| {mb}: torch.sum (all) | {graph_per_call_us([lambda x=x: x.sum() for x in xs], 16):.2f} |")
    log(f"| {mb}: torch.sum per row (64 rows) | "
        f"{graph_per_call_us([lambda x=x: x.view(64, -1).sum(1) for x in xs], 16):.2f} |")
    best = None
    for chunk, block, warps in itertools.product((4096, 8192, 16384, 32768, 65536), (1024, 2048, 4096), (4, 8)):
        if block > chunk or block < 32 * warps * 4:
            continue
        out = torch.empty(n // chunk, device="cuda")
        fns = [lambda x=x, c=chunk, b=block, w=warps: _chunk_sum_kernel[(n // c,)](x, out, CHUNK=c, BLOCK=b,
                                                                                   num_warps=w) for x in xs]
        us = graph_per_call_us(fns, 16)
        label = f"{n // chunk} programs of {4 * chunk // 1024} KB, {4 * block // 1024} KB loads, {warps} warps"
        if best is None or us < best[0]:
            best = (us, label)
    log(f"| {mb}: Triton, fastest of 30 shapes ({best[1]}) | {best[0]:.2f} |")
    del xs


def node_floors(log) -> None:
    x = torch.empty(1, device="cuda")
    log(f"| empty Triton kernel | {graph_per_call_us([lambda: _empty_kernel[(1,)](x, num_warps=1)], 64):.2f} |")
    log(f"| torch.zeros(64, int32) (memset node) | "
        f"{graph_per_call_us([lambda: torch.zeros(64, dtype=torch.int32, device='cuda')], 64):.2f} |")


def row_chain(rows: int, log, g) -> None:
    layout = kvf.get_format("fp8_ds_mla")
    pages = (1 << 30) // layout.page_bytes
    cache = layout.allocate(pages, device="cuda")
    flat = cache.view(torch.uint8).reshape(-1)
    flat.random_(0, 256)
    capacity = pages * layout.page_size
    scales = layout.region("scale")
    out = torch.empty(rows, layout.row_bytes, dtype=torch.uint8, device="cuda")
    for pattern in ("prefill", "random"):
        if pattern == "random":
            slot_sets = [torch.randint(0, capacity, (rows,), generator=g).cuda() for _ in range(BUFFERS)]
        else:  # rows in one page taken at random, as the op benchmarks' prefill-like slots
            slot_sets = [(int(torch.randint(0, pages, (1,), generator=g)) * layout.page_size
                          + torch.arange(rows) % layout.page_size).cuda() for _ in range(BUFFERS)]
        for label, rec, scale in (("one 584-byte record", layout.row_bytes, 0),
                                  ("576 + 8-byte records (the page's two segments)", 576, 8)):
            fns = [lambda s=s, rec=rec, scale=scale: _row_chain_kernel[(rows,)](
                flat, s, out, layout.page_bytes, REC=rec, REC_P2=1 << (rec - 1).bit_length(),
                PAGE_SIZE=layout.page_size, SCALE_OFF=scales.offset, SCALE=scale, num_warps=1) for s in slot_sets]
            log(f"| {rows} rows, {pattern}: slot → {label} → store (1 warp per row) | "
                f"{graph_per_call_us(fns, 64):.2f} |")
        for op in ("gather", "decode"):
            fns = [lambda s=s, op=op: getattr(layout, op)(cache, s, backend="triton", check=False) for s in slot_sets]
            log(f"| {rows} rows, {pattern}: kvformats fp8_ds_mla {op} | {graph_per_call_us(fns, 64):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--read-mb", type=float, default=33.62)
    ap.add_argument("--rows", type=int, default=64)
    args = ap.parse_args()

    def log(s=""):
        print(s, flush=True)

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    log(f"date {datetime.date.today()}  device {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"triton {triton.__version__}  git {rev or '?'} (+ working tree)")
    log(f"device-to-device copy bandwidth (read + write): {copy_bandwidth():.0f} GB/s")
    log()
    log("| yardstick | graph µs per call |")
    log("| --- | ---: |")
    read_floor(int(args.read_mb * 1e6), log)
    node_floors(log)
    row_chain(args.rows, log, torch.Generator().manual_seed(0))


if __name__ == "__main__":
    main()
