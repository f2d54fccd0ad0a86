"""Time `kvformats check` (load + validate every page) and `diff` on a cache file of a given size.

    python3 -m benchmarks check_cpu [--gib 1.0] [--formats fp8_ds_mla ...]

Pages are filled with real encoded rows (a few pages encoded, then tiled), written to a
temporary safetensors file, and checked through the CLI entry point, as a user would run it.
Prints a table; figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import torch

import kvformats as kvf
from kvformats.caches.files import save_cache
from kvformats.cli import main as cli_main


def filled_cache(layout, total_bytes: int):
    """A cache of about ``total_bytes`` whose pages all hold encoded rows."""
    page = layout.page_bytes
    pages = max(1, total_bytes // page)
    seed_pages = min(pages, 8)
    cache = layout.allocate(pages)
    n = seed_pages * layout.page_size
    slots = torch.arange(n)
    if layout.name == "compressor_state":
        w = layout.width
        layout.encode((torch.randn(n, w), torch.randn(n, w)), cache, slots,
                      positions=torch.arange(n), ape=torch.randn(layout.ratio, w))
    elif layout.name == "compressor_state_v41":
        layout.encode((torch.randn(n, layout.width), torch.randn(n, layout.width)), cache, slots)
    else:
        layout.encode(torch.randn(n, layout.head_dim), cache, slots)
    for start in range(seed_pages, pages, seed_pages):
        stop = min(pages, start + seed_pages)
        cache[start:stop] = cache[: stop - start]
    return cache


def timed_cli(argv: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # time the work, not the terminal
        code = cli_main(argv)
    return time.perf_counter() - t0, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--formats", nargs="*", default=kvf.list_formats())
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.formats:
            layout = kvf.get_format(name)
            cache = filled_cache(layout, int(args.gib * (1 << 30)))
            path = Path(tmp) / f"{name}.safetensors"
            save_cache(path, layout, cache)
            size = path.stat().st_size
            del cache
            t_check, code = timed_cli(["check", str(path), "--json"])
            t_diff, code_diff = timed_cli(["diff", str(path), str(path), "--json"])
            rows.append((name, size / (1 << 30), t_check, code, t_diff, code_diff))
            path.unlink()
    print()
    print(f"{'format':<18} {'file GiB':>8} {'check s':>8} {'exit':>4} {'diff s':>8} {'exit':>4}")
    for name, gib, t_check, code, t_diff, code_diff in rows:
        print(f"{name:<18} {gib:>8.2f} {t_check:>8.2f} {code:>4} {t_diff:>8.2f} {code_diff:>4}")


if __name__ == "__main__":
    main()
