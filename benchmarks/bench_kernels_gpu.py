"""GPU benchmark of the Triton codecs against the device's copy bandwidth and the reference.

    python3 -m benchmarks kernels_gpu [--sweep] [--out perf.md] [--cache-gib 4]

For encode / decode / gather of every format at 64, 512, 16,384 and 131,072 rows of a
multi-GB cache, with two slot patterns (prefill: each request's rows contiguous inside pages
taken in random order; random: a random permutation of all slots), prints
- eager µs: median of triton.testing.do_bench (L2 flushed between calls; at small sizes this
  is the Python launch cost, not the GPU's),
- graph µs: median per-call time of the op replayed inside a CUDA graph; from 16,384 rows on,
  the calls cycle through enough input/slot sets that no call finds its data in L2,
- the fewest bytes the op must move, GB/s and % of the device-to-device copy bandwidth
  measured in the same run (from the graph time), and the reference backend's do_bench median,
- the bytes DRAM must move at 32-byte sector granularity for that slot pattern (traffic.py)
  and the same time as a % of what that count allows at the copy bandwidth,
- from 16,384 rows on, the time of an elementwise kernel that moves the op's fewest bytes (half
  read, half written; gpu_timing.same_size_copy_us) inside the same kind of graph, as a % of
  the op's time ("% of same-size copy"): a short op pays a launch, a ramp-up and a tail that
  the multi-GB copy bandwidth does not, and this column says how near it is to what memory
  speed allows at its own size.
``--sweep`` first tries launch configurations at 131,072 prefill rows and keeps the fastest
(``--sweep-keys`` picks configs, ``--sweep-rounds`` interleaves rounds and keeps the median).

Then the paged ops (``--paged``, on by default): dequantize_gather of every decodable byte
format for one request of 131,072 rows and for 8 requests of 16,384 (pages in random order,
the whole sequence gathered); gather_paged of both indexers at 131,072 rows (8 x 16,384);
decode_topk at [T=4096, K=512] random slots with 10 % −1 holes.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import subprocess
from pathlib import Path

import torch

import kvformats as kvf
from kvformats.codec import slot_ops as ops
from benchmarks.gpu_timing import bench, copy_bandwidth, graph_per_call_us, same_size_copy_us
from benchmarks.traffic import SECTOR, cache_sectors, dense_sectors

SIZES = (64, 512, 16384, 131072)
GRAPH_CALLS = 50
FORMATS = ("fp8_ds_mla", "fp8_indexer", "mxfp4_indexer", "compressor_state")


def make_slots(layout, num_pages: int, n: int, pattern: str, g: torch.Generator) -> torch.Tensor:
    ps = layout.page_size
    if pattern == "random":
        return torch.randperm(num_pages * ps, device="cuda")[:n]
    pages = torch.randperm(num_pages, generator=g)[: (n + ps - 1) // ps]
    i = torch.arange(n)
    return (pages[i // ps] * ps + i % ps).cuda()


def make_input(layout, n: int, g: torch.Generator):
    """Production-like inputs: bf16 rows for the byte formats, float32 kv/score for the state."""
    if layout.name == "compressor_state":
        w = layout.width
        kv = torch.randn(n, w, generator=g).cuda()
        score = torch.randn(n, w, generator=g).cuda()
        kw = dict(positions=torch.randint(0, 1 << 20, (n,), generator=g).cuda(),
                  ape=(torch.randn(layout.ratio, w, generator=g) * 0.01).cuda())
        return (kv, score), kw
    x = torch.randn(n, layout.head_dim, generator=g) * torch.exp(torch.randn(n, 1, generator=g))
    return x.to(torch.bfloat16).cuda(), {}


def min_bytes(layout, op: str, x, n: int) -> int:
    """Fewest bytes an op must move: inputs read once, outputs written once, plus the slots."""
    row = layout.row_bytes
    slots = 8 * n
    if op == "encode":
        xs = x if isinstance(x, tuple) else (x,)
        return sum(t.element_size() * t.shape[1] for t in xs) * n + row * n + slots
    if op == "gather":
        return 2 * row * n + slots
    decoded = row if layout.decode_dtype is None else out_bytes(layout)  # the state decodes what it stores
    return (row + decoded) * n + slots


def input_sets(layout, impl, cache, pages, n, pattern, g):
    """Enough (x, kwargs, slots) sets that cycling through them defeats the L2 (50 MB)."""
    x, kw = make_input(layout, n, g)
    per_call = min_bytes(layout, "encode", x, n)
    count = 1 if n <= 512 else min(8, max(1, -(-256_000_000 // per_call)))
    sets = [(x, kw, make_slots(layout, pages, n, pattern, g))]
    for _ in range(count - 1):
        x2, kw2 = make_input(layout, n, g)
        sets.append((x2, kw2, make_slots(layout, pages, n, pattern, g)))
    for x_, kw_, slots_ in sets:
        impl.encode(layout, x_, cache, slots_, **kw_)
    return sets


def graph_calls(n: int, sets: int) -> int:
    return GRAPH_CALLS if n <= 512 else max(sets, 8 // sets * sets)


def op_fns(layout, impl, cache, x, kw, slots):
    return {
        "encode": lambda: impl.encode(layout, x, cache, slots, **kw),
        "decode": lambda: impl.decode(layout, cache, slots),
        "gather": lambda: impl.gather(layout, cache, slots),
    }


def reference_fns(layout, cache, x, kw, slots):
    return {
        "encode": lambda: ops.encode_reference(layout, x, cache, slots, **kw),
        "decode": lambda: ops.decode_reference(layout, cache, slots),
        "gather": lambda: ops.gather_reference(layout, cache, slots),
    }


def allocate(layout, cache_gib: float):
    num_pages = int(cache_gib * (1 << 30)) // (layout.page_bytes if layout.container_dtype == torch.uint8
                                               else layout.page_size * layout.row_bytes)
    cache = layout.allocate(num_pages, device="cuda")
    cache.view(torch.uint8).random_(0, 256) if cache.dtype == torch.uint8 else cache.normal_()
    return cache, num_pages


# Launch shapes a sweep tries (rows per program x warps). One- and two-warp programs and small
# row counts are included: after the kernel bodies got shorter, those are where the fastest
# shapes at 131,072 rows lie.
ROWS_WARPS = ((2, 1), (4, 1), (8, 1), (16, 1), (4, 2), (8, 2), (16, 2), (4, 4), (8, 4), (16, 4), (32, 4),
              (16, 8), (32, 8))
SWEEP = {
    ("fp8_ds_mla", "encode"): [dict(block_m=b, num_warps=w) for b, w in ROWS_WARPS if b <= 16],
    ("fp8_ds_mla", "decode"): [dict(block_m=b, num_warps=w) for b, w in ROWS_WARPS if b <= 16],
    ("fp8_ds_mla", "dequantize_gather"): [dict(block_m=b, num_warps=w) for b, w in ROWS_WARPS],
    ("rows", "gather"): [dict(tile_bytes=t, num_warps=w)
                         for t, w in ((2048, 1), (4096, 1), (8192, 1), (4096, 2), (8192, 2), (8192, 4),
                                      (16384, 4), (16384, 8))],
    ("rows", "gather_paged"): [dict(tile_bytes=t, num_warps=w)
                               for t, w in ((1024, 1), (2048, 1), (4096, 1), (8192, 1), (2048, 2), (4096, 2),
                                            (8192, 2), (8192, 4), (16384, 4))],
    ("indexer", "encode"): [dict(block_m=b, num_warps=w) for b, w in ROWS_WARPS + ((64, 8),) if b >= 8],
    ("indexer", "encode_mxfp4"): [dict(block_m=b, num_warps=w, lane=1)  # a block per lane: block_m * 4 >= 32 * warps
                                  for b, w in ((4, 1), (8, 1), (16, 1), (8, 2), (16, 2), (32, 2), (16, 4), (32, 4),
                                               (64, 4), (64, 8), (128, 8))]
                                 + [dict(block_m=32, num_warps=4, lane=0)],
    ("indexer", "decode"): [dict(block_m=b, num_warps=w) for b, w in ROWS_WARPS],
    ("indexer", "dequantize_gather"): [dict(block_m=b, num_warps=w) for b, w in ROWS_WARPS + ((64, 8),)],
    **{("state", op): [dict(block_m=m, block_w=bw, num_warps=w)
                       for (m, bw), w in itertools.product(((1, 2048), (2, 1024), (4, 512)), (4, 8))]
       for op in ("encode", "gather")},
}
SWEEP_USES = {  # config key (kernel module, op: kvformats_kernels.tuning) -> (format, op) timed to choose it
    ("fp8_ds_mla", "encode"): [("fp8_ds_mla", "encode")],
    ("fp8_ds_mla", "decode"): [("fp8_ds_mla", "decode")],
    ("fp8_ds_mla", "dequantize_gather"): [("fp8_ds_mla", "dequantize_gather")],
    ("rows", "gather"): [("fp8_ds_mla", "gather"), ("fp8_indexer", "gather"), ("mxfp4_indexer", "gather")],
    ("rows", "gather_paged"): [("fp8_indexer", "gather_paged"), ("mxfp4_indexer", "gather_paged")],
    ("indexer", "encode"): [("fp8_indexer", "encode")],
    ("indexer", "encode_mxfp4"): [("mxfp4_indexer", "encode")],
    ("indexer", "decode"): [("fp8_indexer", "decode"), ("mxfp4_indexer", "decode")],
    ("indexer", "dequantize_gather"): [("fp8_indexer", "dequantize_gather"), ("mxfp4_indexer", "dequantize_gather")],
    ("state", "encode"): [("compressor_state", "encode")],
    ("state", "gather"): [("compressor_state", "gather")],
}
PAGED_FORMATS = ("fp8_ds_mla", "fp8_indexer", "mxfp4_indexer")


# ----- paged ops ----------------------------------------------------------------------------------
def paged_sets(layout, pages: int, requests: int, length: int, g: torch.Generator, count: int = 2):
    """``count`` (table, seq_lens, cu_seq_lens) sets: each request's pages distinct, in random order."""
    ps = layout.page_size
    per = -(-length // ps)
    out = []
    for _ in range(count):
        perm = torch.randperm(pages, generator=g)[: requests * per].reshape(requests, per)
        seq = torch.full((requests,), length, dtype=torch.int64)
        cu = torch.arange(requests + 1, dtype=torch.int64) * length
        out.append((perm.to(torch.int32).cuda(), seq.cuda(), cu.cuda()))
    return out


def out_bytes(layout) -> int:
    """Bytes of one decoded row (the layout's decoded dtype times its head dim)."""
    return torch.empty((), dtype=layout.decode_dtype).element_size() * layout.head_dim


def paged_cases(layout, impl, cache, pages, g):
    """(label, rows, min bytes, [kernel fns], reference fn) of each paged case for this format."""
    cases = []
    for requests, length in ((1, 131072), (8, 16384)):
        sets = paged_sets(layout, pages, requests, length, g)
        outs = [torch.empty((requests, length, layout.head_dim), dtype=layout.decode_dtype, device="cuda")
                for _ in sets]
        fns = [(lambda t=t, s=s, o=o: impl.dequantize_gather(layout, cache, o, t, s, None, None, 0))
               for (t, s, _), o in zip(sets, outs)]
        ref = (lambda t=sets[0][0], s=sets[0][1], o=outs[0]:
               kvf_paged().dequantize_gather_reference(layout, cache, o, t, s, None, None, 0))
        n = requests * length
        cases.append((f"dequantize_gather {requests}x{length}", n, n * (layout.row_bytes + out_bytes(layout)), fns, ref))
    if layout.name != "fp8_ds_mla":
        requests, length = 8, 16384
        sets = paged_sets(layout, pages, requests, length, g)
        n = requests * length
        views = [[torch.empty((n, seg.record_bytes), dtype=torch.uint8, device="cuda") for seg in layout.segments]
                 for _ in sets]
        fns = [(lambda t=t, c=c, v=v: impl.gather_paged(layout, cache, v, t, c)) for (t, _, c), v in zip(sets, views)]
        ref = (lambda t=sets[0][0], c=sets[0][2], v=views[0]: kvf_paged().gather_paged_reference(layout, cache, v, t, c))
        cases.append((f"gather_paged {requests}x{length}", n, 2 * n * layout.row_bytes, fns, ref))
    topk = torch.randint(0, pages * layout.page_size, (4096, 512), device="cuda")
    topk[torch.rand(topk.shape, device="cuda") < 0.1] = -1
    n = topk.numel()
    live = int((topk >= 0).sum())
    cases.append(("decode_topk 4096x512", n, live * layout.row_bytes + n * (out_bytes(layout) + 8),
                  [lambda: impl.decode_topk(layout, cache, topk)],
                  lambda: kvf_paged().decode_topk_reference(layout, cache, topk)))
    return cases


def kvf_paged():
    from kvformats.codec import paged_ops as paged

    return paged


def run_paged(args, bw, log, g):
    import kvformats_kernels as kk

    log()
    log("| format | paged op | rows | eager µs | graph µs | GB/s | % copy BW | reference µs | min MB "
        "| % of same-size copy |")
    log("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for fmt in PAGED_FORMATS:
        layout = kvf.get_format(fmt)
        impl = kk.IMPLEMENTATIONS[fmt]
        cache, pages = allocate(layout, args.cache_gib)
        for label, n, nbytes, fns, ref in paged_cases(layout, impl, cache, pages, g):
            if args.ops and label.split()[0] not in args.ops.split(","):
                continue
            try:
                eager = bench(fns[0])
            except Exception as err:  # keep the rest of the table
                log(f"| {fmt} | {label} | failed: {type(err).__name__}: {str(err)[:300]} |")
                continue
            graph_us = graph_per_call_us(fns, max(len(fns), 4 // len(fns) * len(fns)))
            ref_us = bench(ref, rep_ms=20) * 1e3 if args.reference else float("nan")
            gbs = nbytes / graph_us / 1e3
            same = 100 * same_size_copy_us(nbytes) / graph_us
            log(f"| {fmt} | {label} | {n} | {eager * 1e3:.1f} | {graph_us:.2f} | {gbs:.0f} | {100 * gbs / bw:.0f} | "
                f"{ref_us:.0f} | {nbytes / 1e6:.2f} | {same:.0f} |")
        del cache
        torch.cuda.empty_cache()


def sweep(setups, log, keys=None, rounds: int = 1):
    """Time every candidate of SWEEP (of ``keys`` only, when given) and keep each key's fastest
    by its median over ``rounds`` rounds (the upper one of an even count). A round goes over
    every candidate of every key before the next, so drift falls on all alike. Prints each
    candidate's figures per round."""
    from kvformats_kernels import settings, tuning

    keys = [k for k in SWEEP if keys is None or k in keys]
    base = {k: dict(tuning.CONFIG[k]) for k in keys}  # a candidate overrides its keys only
    times: dict = {}
    for _ in range(rounds):
        for key in keys:
            for i, candidate in enumerate(SWEEP[key]):
                settings.change("config", key, {**base[key], **candidate})
                try:
                    times.setdefault((key, i), []).append(sweep_one(setups, key))
                except Exception as err:  # a configuration that does not compile is skipped
                    log(f"sweep {key} {candidate}: failed: {type(err).__name__}: {str(err)[:200]}")
            settings.change("config", key, base[key])
    for key in keys:
        best = None
        for i, candidate in enumerate(SWEEP[key]):
            if (key, i) not in times:
                continue
            ts = times[(key, i)]
            mid = sorted(ts)[len(ts) // 2]
            log(f"sweep {key} {candidate}: {' / '.join(f'{t * 1e3:.1f}' for t in ts)} us")
            if best is None or mid < best[0]:
                best = (mid, {**base[key], **candidate})
        if best is not None:
            settings.change("config", key, best[1])
        log(f"sweep {key} -> {tuning.CONFIG[key]}")


def sweep_one(setups, key) -> float:
    """Summed per-call ms of the ops that share configuration ``key`` (as currently set)."""
    total = 0.0
    for fmt, op in SWEEP_USES[key]:
        layout, impl, cache, sets, paged_fns = setups[fmt]
        if op == "dequantize_gather":
            fns = paged_fns[0]
        elif op == "gather_paged":
            fns = paged_fns[1]
        else:
            fns = [op_fns(layout, impl, cache, x, kw, slots)[op] for x, kw, slots in sets]
        total += graph_per_call_us(fns, graph_calls(131072, len(fns))) / 1e3
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-keys", default=None, metavar="MODULE.OP,...",
                    help="sweep only these configs (e.g. fp8_ds_mla.dequantize_gather,indexer.decode)")
    ap.add_argument("--sweep-rounds", type=int, default=1, help="interleaved rounds of the sweep (median kept)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None, help="also write every table row as a record (tools/bandwidth_chart.py)")
    ap.add_argument("--cache-gib", type=float, default=4.0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--no-reference", dest="reference", action="store_false")
    ap.add_argument("--no-paged", dest="paged", action="store_false")
    ap.add_argument("--no-codecs", dest="codecs", action="store_false")
    ap.add_argument("--ops", default=None,
                    help="only these ops, comma-separated: encode, decode, gather (codecs) and "
                         "dequantize_gather, gather_paged, decode_topk (paged); default all")
    ap.add_argument("--set", action="append", default=[], metavar="[MODULE.OP.]KEY=INT",
                    help="override KEY in every kernel config that has it (e.g. hw_cvt=0), or in the "
                         "config of one (kernel module, op) only (e.g. indexer.encode_mxfp4.block_m=64, "
                         "v41.decode.num_warps=8), or with a small. prefix in the overrides of calls of few "
                         "rows (tuning.SMALL); repeatable")
    ap.add_argument("--small-rows", type=int, default=None,
                    help="calls of at most this many rows take the small-call overrides (default: the "
                         "library's bounds.small_rows; 0 turns them off)")
    args = ap.parse_args()
    import kvformats_kernels as kk
    from kvformats_kernels import settings, tuning

    if args.small_rows is not None:
        settings.change("bounds", "small_rows", args.small_rows)

    for item in args.set:
        name, value = item.split("=")
        *where, key = name.split(".")
        table = "config"
        if where[:1] in (["small"], ["v41"]):  # the small-call overrides; the V4.1 formats' own table (by op)
            table, where = where[0], where[1:]
        entries = settings.SETTINGS.tables[table]
        chosen = [(tuple(where) if table != "v41" else where[0])] if where else list(entries)
        if not any(key in entries[k] for k in chosen):
            raise SystemExit(f"--set {item}: no config has {key!r}")
        for k in chosen:
            if key in entries[k]:
                settings.change(table, k, {**entries[k], key: int(value)})

    lines = []

    def log(s=""):
        print(s, flush=True)
        lines.append(s)

    dev = torch.cuda.get_device_name()
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        rev = "?"
    import triton

    log(f"date {datetime.date.today()}  device {dev}  torch {torch.__version__}  triton {triton.__version__}  "
        f"git {rev or '?'} (+ working tree)")
    if args.set or args.small_rows is not None:
        log(f"config overrides: {', '.join(args.set)}; small-call overrides up to {tuning.BOUNDS['small_rows']} rows")
    bw = copy_bandwidth()
    log(f"device-to-device copy bandwidth (read + write): {bw:.0f} GB/s")

    g = torch.Generator().manual_seed(0)
    fmts = args.formats.split(",")
    if args.sweep:
        setups = {}
        for fmt in FORMATS:
            layout = kvf.get_format(fmt)
            cache, pages = allocate(layout, min(args.cache_gib, 2.0))
            impl = kk.IMPLEMENTATIONS[fmt]
            cases = paged_cases(layout, impl, cache, pages, g) if fmt in PAGED_FORMATS else []
            paged_fns = ([c[3] for c in cases if c[0].startswith("dequantize_gather 1x")]
                         + [c[3] for c in cases if c[0].startswith("gather_paged")])
            setups[fmt] = (layout, impl, cache, input_sets(layout, impl, cache, pages, 131072, "prefill", g),
                           paged_fns)
        keys = None if args.sweep_keys is None else [tuple(k.split('.')) for k in args.sweep_keys.split(',')]
        sweep(setups, log, keys, args.sweep_rounds)
        del setups
        torch.cuda.empty_cache()
        log(f"configs: {tuning.CONFIG}")

    log()
    log("| format | op | rows | slots | eager µs | graph µs | GB/s | % copy BW | reference µs | min MB "
        "| sector MB | % of sector bound | % of same-size copy |")
    log("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for fmt in fmts if args.codecs else ():
        layout = kvf.get_format(fmt)
        impl = kk.IMPLEMENTATIONS[fmt]
        cache, pages = allocate(layout, args.cache_gib)
        for n, pattern in itertools.product(map(int, args.sizes.split(",")), ("prefill", "random")):
            sets = input_sets(layout, impl, cache, pages, n, pattern, g)
            x, kw, slots = sets[0]
            refs = reference_fns(layout, cache, x, kw, slots)
            # every op touches each slot's cache records once: the pattern's sector count is shared
            records = cache_sectors(layout, slots, layout.byte_pages(cache)[1])
            for op in ("encode", "decode", "gather"):
                if args.ops and op not in args.ops.split(","):
                    continue
                fns = [op_fns(layout, impl, cache, x_, kw_, s_)[op] for x_, kw_, s_ in sets]
                eager = bench(fns[0])
                graph_us = graph_per_call_us(fns, graph_calls(n, len(fns)))
                nbytes = min_bytes(layout, op, x, n)
                sectors = SECTOR * (records + dense_sectors(nbytes - layout.row_bytes * n))
                gbs = nbytes / graph_us / 1e3
                ref_ms = bench(refs[op], rep_ms=20) if args.reference else float("nan")
                same = f"{100 * same_size_copy_us(nbytes) / graph_us:.0f}" if n >= 16384 else "—"
                log(f"| {fmt} | {op} | {n} | {pattern} | {eager * 1e3:.1f} | {graph_us:.2f} | {gbs:.0f} | "
                    f"{100 * gbs / bw:.0f} | {ref_ms * 1e3:.0f} | {nbytes / 1e6:.2f} | {sectors / 1e6:.2f} | "
                    f"{100 * sectors / graph_us / 1e3 / bw:.0f} | {same} |")
            del sets
        del cache
        torch.cuda.empty_cache()
    if args.paged:
        run_paged(args, bw, log, g)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"head": lines[:2], "bandwidth_GBs": bw, "rows": table_records(lines)},
                                              indent=1))


def table_records(lines: list[str]) -> list[dict]:
    """The rows of every Markdown table in ``lines`` as dicts keyed by their table's header."""
    out, header = [], None
    for line in lines:
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(cells[0]) <= set("-: "):
            out.append(dict(zip(header, cells)))
    return out


if __name__ == "__main__":
    main()
