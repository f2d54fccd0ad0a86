"""Yardsticks that bound the issue figures no kernel of ours has reached, on the GPU.

    python3 -m benchmarks bounds_gpu [--read-mb 33.62] [--rows 64] [--scatter-rows 131072]
        [--only-scatter | --only-paged]

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
  of the same slots; and the same chain for compressor_state's 8 KB rows (four warps per row);
- *scatter yardstick* (``--scatter-rows``, 131,072 by default; ``--only-scatter`` runs only
  this): each byte format's record bytes copied from contiguous rows to the records of
  prefill-like and random slots of a 1 GiB cache, with no arithmetic: the memory traffic of an
  encode, as a % of what its 32-byte sectors allow at the copy bandwidth, beside the library's
  encode and gather of the same slots. Random slots scatter each row's two segments into two
  random places of DRAM; this says how far the sector count is from what DRAM gives;
- *paged against slots* (``--scatter-rows`` rows; ``--only-paged`` runs only this): the
  dequantize_gather of one request and of 8 equal requests, pages in random order, beside the
  slot decode of the very rows the block table names, in three interleaved rounds, as % of the
  copy bandwidth: what the table lookup costs over reading the same rows by slot.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import subprocess

import torch
import triton
import triton.language as tl
from benchmarks.bench_kernels_gpu import make_input, make_slots, paged_sets
from benchmarks.gpu_timing import copy_bandwidth, graph_per_call_us
from benchmarks.traffic import SECTOR, cache_sectors, dense_sectors

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


@triton.jit
def _scatter_kernel(src_ptr, slots_ptr, cache_ptr, n, page_stride, PAGE_SIZE: tl.constexpr,
                    A_OFF: tl.constexpr, A: tl.constexpr, A_P2: tl.constexpr,
                    B_OFF: tl.constexpr, B: tl.constexpr, B_P2: tl.constexpr, BM: tl.constexpr):
    """Rows of A + B contiguous bytes of src into the two segment records (A bytes at A_OFF,
    B bytes at B_OFF of each page) of the rows at slots: an encode's memory traffic and nothing
    else (both loads before either store)."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    live = rows < n
    slot = tl.load(slots_ptr + rows, mask=live, other=0).to(tl.int64)
    base = (slot // PAGE_SIZE) * page_stride
    row = slot % PAGE_SIZE
    a, b = tl.arange(0, A_P2), tl.arange(0, B_P2)
    ma, mb = live[:, None] & (a < A)[None, :], live[:, None] & (b < B)[None, :]
    va = tl.load(src_ptr + rows[:, None] * (A + B) + a[None, :], mask=ma)
    vb = tl.load(src_ptr + rows[:, None] * (A + B) + A + b[None, :], mask=mb)
    tl.store(cache_ptr + (base + A_OFF + row * A)[:, None] + a[None, :], va, mask=ma)
    tl.store(cache_ptr + (base + B_OFF + row * B)[:, None] + b[None, :], vb, mask=mb)


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


def chain_slots(layout, pages: int, rows: int, pattern: str, g) -> list[torch.Tensor]:
    """BUFFERS slot sets of ``rows`` rows for the 64-row chains: random slots of the cache, or
    (prefill) consecutive slots from a random first page, as the op benchmarks' prefill-like
    slots (64 rows of fp8_ds_mla: one page; of compressor_state, whose pages hold 4 rows: 16)."""
    if pattern == "random":
        return [torch.randint(0, pages * layout.page_size, (rows,), generator=g).cuda() for _ in range(BUFFERS)]
    span = -(-rows // layout.page_size)
    return [(int(torch.randint(0, pages - span + 1, (1,), generator=g)) * layout.page_size
             + torch.arange(rows)).cuda() for _ in range(BUFFERS)]


def row_chain(rows: int, log, g) -> None:
    layout = kvf.get_format("fp8_ds_mla")
    pages = (1 << 30) // layout.page_bytes
    cache = layout.allocate(pages, device="cuda")
    flat = cache.view(torch.uint8).reshape(-1)
    flat.random_(0, 256)
    scales = layout.region("scale")
    out = torch.empty(rows, layout.row_bytes, dtype=torch.uint8, device="cuda")
    for pattern in ("prefill", "random"):
        slot_sets = chain_slots(layout, pages, rows, pattern, g)
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


def state_chain(rows: int, log, g) -> None:
    """The same chain for compressor_state's 8 KB rows (4 warps per row), against the library's
    compressor_state gather and decode of the same slots."""
    layout = kvf.get_format("compressor_state")
    pages = (1 << 30) // layout.page_bytes
    cache = layout.allocate(pages, device="cuda")
    cache.normal_()
    flat = cache.view(torch.uint8).reshape(-1)
    out = torch.empty(rows, layout.row_bytes, dtype=torch.uint8, device="cuda")
    for pattern in ("prefill", "random"):
        slot_sets = chain_slots(layout, pages, rows, pattern, g)
        fns = [lambda s=s: _row_chain_kernel[(rows,)](
            flat, s, out, layout.page_bytes, REC=layout.row_bytes, REC_P2=layout.row_bytes, PAGE_SIZE=layout.page_size,
            SCALE_OFF=0, SCALE=0, num_warps=4) for s in slot_sets]
        log(f"| {rows} rows, {pattern}: slot → one 8 KB compressor_state row → store (4 warps per row) | "
            f"{graph_per_call_us(fns, 64):.2f} |")
        for op in ("gather", "decode"):
            fns = [lambda s=s, op=op: getattr(layout, op)(cache, s, backend="triton", check=False) for s in slot_sets]
            log(f"| {rows} rows, {pattern}: kvformats compressor_state {op} | {graph_per_call_us(fns, 64):.2f} |")


def scatter_floor(rows: int, bw: float, log, g) -> None:
    """At ``rows`` rows of each byte format, prefill-like and random slots of a 1 GiB cache: the
    scatter yardstick (the record bytes copied from contiguous rows to the slots' records, no
    arithmetic) against the library's encode and gather of the same slots, each as a % of what
    the op's 32-byte sectors allow at the copy bandwidth ``bw`` (GB/s)."""
    for fmt in ("fp8_ds_mla", "fp8_indexer", "mxfp4_indexer"):
        layout = kvf.get_format(fmt)
        pages = (1 << 30) // layout.page_bytes
        cache = layout.allocate(pages, device="cuda")
        (sa, sb) = layout.segments
        rec = sa.record_bytes + sb.record_bytes
        count = min(BUFFERS, max(1, -(-256_000_000 // (2 * rec * rows))))  # no call finds its data in L2
        bm = max(1, 8192 // (1 << (rec - 1).bit_length()))
        for pattern in ("prefill", "random"):
            sets = []
            for _ in range(count):
                slots = make_slots(layout, pages, rows, pattern, g)
                x = make_input(layout, rows, g)[0]
                src = torch.randint(0, 256, (rows, rec), dtype=torch.uint8, device="cuda")
                sets.append((slots, x, src))
            sectors = SECTOR * (cache_sectors(layout, sets[0][0], layout.page_bytes) + dense_sectors(8 * rows))
            cases = {
                "scatter yardstick": (rec * rows, [lambda s=s, src=src: _scatter_kernel[(triton.cdiv(rows, bm),)](
                    src, s, cache, rows, layout.page_bytes, PAGE_SIZE=layout.page_size,
                    A_OFF=layout.segment_offsets[sa.name], A=sa.record_bytes, A_P2=1 << (sa.record_bytes - 1).bit_length(),
                    B_OFF=layout.segment_offsets[sb.name], B=sb.record_bytes, B_P2=1 << (sb.record_bytes - 1).bit_length(),
                    BM=bm, num_warps=4) for s, _, src in sets]),
                "kvformats encode": (x.element_size() * x.shape[1] * rows, [
                    lambda s=s, x=x: layout.encode(x, cache, s, backend="triton", check=False) for s, x, _ in sets]),
                "kvformats gather": (rec * rows, [
                    lambda s=s: layout.gather(cache, s, backend="triton", check=False) for s, _, _ in sets]),
            }
            for label, (dense, fns) in cases.items():
                us = graph_per_call_us(fns, max(len(fns), 8))
                total = sectors + SECTOR * dense_sectors(dense)
                log(f"| {rows} rows, {fmt}, {pattern}: {label} ({total / 1e6:.1f} MB in sectors) | {us:.2f} "
                    f"({100 * total / us / 1e3 / bw:.0f} % of the sector bound) |")
        del cache, sets
        torch.cuda.empty_cache()


def paged_floor(rows: int, bw: float, log, g) -> None:
    """dequantize_gather of ``rows`` rows (1 request, then 8) of each decodable byte format
    against the slot decode of the same rows, three interleaved rounds, % of the copy
    bandwidth ``bw`` (GB/s) for the fewest bytes (records read, decoded rows written)."""
    out_bytes = {"fp8_ds_mla": 2, "fp8_indexer": 4, "mxfp4_indexer": 4}
    for fmt, requests in itertools.product(out_bytes, (1, 8)):
        layout = kvf.get_format(fmt)
        pages = (1 << 30) // layout.page_bytes
        cache = layout.allocate(pages, device="cuda")
        cache.random_(0, 256)
        length, ps = rows // requests, layout.page_size
        sets = paged_sets(layout, pages, requests, length, g)
        outs = [torch.empty((requests, length, layout.head_dim), dtype=layout.decode_dtype, device="cuda")
                for _ in sets]
        i = torch.arange(length, device="cuda")
        slots = [(t.long()[:, i // ps] * ps + i % ps).reshape(-1) for t, _, _ in sets]
        cases = {
            "slot decode of the same rows": [lambda s=s: layout.decode(cache, s, backend="triton", check=False)
                                             for s in slots],
            "dequantize_gather": [lambda t=t, q=q, o=o: layout.dequantize_gather(
                cache, o, block_table=t, seq_lens=q, backend="triton", check=False) for (t, q, _), o in zip(sets, outs)],
        }
        times: dict = {}
        for _ in range(3):
            for label, fns in cases.items():
                times.setdefault(label, []).append(graph_per_call_us(fns, 4))
        nbytes = rows * (layout.row_bytes + out_bytes[fmt] * layout.head_dim)
        for label, ts in times.items():
            pct = " / ".join(f"{100 * nbytes / t / 1e3 / bw:.1f}" for t in ts)
            log(f"| {rows} rows, {fmt}, {requests} x {length}: {label} | {' / '.join(f'{t:.2f}' for t in ts)} "
                f"({pct} % of the copy bandwidth) |")
        del cache, sets, outs, slots, cases
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--read-mb", type=float, default=33.62)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--scatter-rows", type=int, default=131072)
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--only-scatter", action="store_true", help="only the scatter yardstick")
    only.add_argument("--only-paged", action="store_true", help="only the paged against slots yardstick")
    args = ap.parse_args()

    def log(s=""):
        print(s, flush=True)

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    log(f"date {datetime.date.today()}  device {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"triton {triton.__version__}  git {rev or '?'} (+ working tree)")
    bw = copy_bandwidth()
    log(f"device-to-device copy bandwidth (read + write): {bw:.0f} GB/s")
    log()
    log("| yardstick | graph µs per call |")
    log("| --- | ---: |")
    if not (args.only_scatter or args.only_paged):
        read_floor(int(args.read_mb * 1e6), log)
        node_floors(log)
        row_chain(args.rows, log, torch.Generator().manual_seed(0))
        state_chain(args.rows, log, torch.Generator().manual_seed(1))
    if not args.only_paged:
        scatter_floor(args.scatter_rows, bw, log, torch.Generator().manual_seed(2))
    if not args.only_scatter:
        paged_floor(args.scatter_rows, bw, log, torch.Generator().manual_seed(3))


if __name__ == "__main__":
    main()
