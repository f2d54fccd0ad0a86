"""Reference-backend speed on CPU: encode / decode / gather of every registered format.

    python3 -m benchmarks reference_cpu [--rows 64 1024 16384] [--repeats 11]
        [--formats fp8_ds_mla ...]

Each case writes to (or reads from) a cache of 300 pages (more if the rows need them) at random
distinct slots; the median wall time over the repeats is reported, after one warm-up call.
Figures on a shared or loaded machine vary; compare runs made on the same machine at one time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import kvformats as kvf


def _inputs(layout, n: int, pages: int, gen: torch.Generator):
    slots = torch.randperm(pages * layout.page_size, generator=gen)[:n]
    if layout.name == "compressor_state":
        w = layout.width
        x = (torch.randn(n, w, generator=gen), torch.randn(n, w, generator=gen))
        kwargs = {"positions": torch.randint(0, 1 << 20, (n,), generator=gen),
                  "ape": torch.randn(layout.ratio, w, generator=gen)}
        return x, slots, kwargs
    if layout.name == "compressor_state_v41":
        w = layout.width
        return (torch.randn(n, w, generator=gen), torch.randn(n, w, generator=gen)), slots, {}
    return torch.randn(n, layout.head_dim, generator=gen).to(torch.bfloat16), slots, {}


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench(rows_list, repeats: int, min_pages: int = 300, formats=None):
    gen = torch.Generator().manual_seed(0)
    results = []
    for name in formats or kvf.list_formats():
        layout = kvf.get_format(name)
        for n in rows_list:
            pages = max(min_pages, -(-n // layout.page_size))
            cache = layout.allocate(pages)
            x, slots, kwargs = _inputs(layout, n, pages, gen)
            ops = {
                "encode": lambda: layout.encode(x, cache, slots, backend="reference", **kwargs),
                "decode": lambda: layout.decode(cache, slots, backend="reference"),
                "gather": lambda: layout.gather(cache, slots, backend="reference"),
            }
            for op, fn in ops.items():
                ms = _median_ms(fn, repeats)
                results.append({"op": op, "format": name, "rows": n, "pages": pages, "ms": ms,
                                "rows_per_s": n / (ms / 1e3)})
    return results


def table(results) -> str:
    lines = ["| op | format | rows | cache pages | median ms | rows/s |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in sorted(results, key=lambda r: (r["op"], r["format"], r["rows"])):
        lines.append(f"| {r['op']} | {r['format']} | {r['rows']} | {r['pages']} | {r['ms']:.2f} | "
                     f"{r['rows_per_s']:,.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[64, 1024, 16384])
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--formats", nargs="+", default=None, help="default: every registered format")
    args = p.parse_args(argv)
    unknown = [f for f in args.formats or () if f not in kvf.list_formats()]
    if unknown:  # one line before any output, not a traceback from the first lookup
        print(f"benchmarks reference_cpu: unknown format {unknown[0]!r}; registered formats: "
              f"{', '.join(kvf.list_formats())}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, kvformats {kvf.__version__}")
    print(table(bench(args.rows, args.repeats, formats=args.formats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
