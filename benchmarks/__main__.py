"""``python3 -m benchmarks <name> [options]``: run one benchmark (``--list`` names them)."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import textwrap
from pathlib import Path

USAGE = "usage: python3 -m benchmarks <name> [options]   (python3 -m benchmarks <name> --help: its options)"

# name -> module: every script of the package with a main()
BENCHMARKS = {
    "host_gpu": "bench_host_gpu", "kernels_gpu": "bench_kernels_gpu", "dsv4_gpu": "bench_dsv4_gpu",
    "custom_ops_gpu": "bench_custom_ops_gpu", "pipeline_gpu": "bench_pipeline_gpu", "small_gpu": "bench_small_gpu",
    "bounds_gpu": "bench_bounds_gpu", "profile_host_gpu": "profile_host_gpu", "host_overhead_cpu": "host_overhead_cpu",
    "reference_cpu": "bench_reference_cpu", "check_cpu": "bench_check_cpu", "transfer_cpu": "bench_transfer_cpu",
    "tiers_cpu": "bench_tiers_cpu",
}


def _docstring(module: str) -> str:
    """A benchmark module's docstring, read without importing it (some set up the environment at
    import: host_overhead_cpu turns the Triton interpreter off for the process)."""
    return ast.get_docstring(ast.parse((Path(__file__).parent / f"{module}.py").read_text())) or ""


def _summary(doc: str) -> str:
    """A module docstring's first sentence as plain text (reST ``literals`` without their quotes)."""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s", first, maxsplit=1)[0]
    return re.sub(r"`+([^`]*)`+", r"\1", sentence)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(USAGE + "\n")
        for name, module in BENCHMARKS.items():
            summary = textwrap.wrap(_summary(_docstring(module)), 76)
            print(f"  {name:<20} {summary[0] if summary else ''}")
            for line in summary[1:]:
                print(" " * 23 + line)
        return 0 if argv else 2
    if argv[0] not in BENCHMARKS:
        print(f"unknown benchmark {argv[0]!r}; one of: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    if argv[0].endswith("_gpu") and not {"-h", "--help"} & set(argv[1:]):
        import torch

        if not torch.cuda.is_available():  # before any work, not a traceback from the first CUDA call
            print(f"benchmarks {argv[0]}: needs a CUDA device; none is available here", file=sys.stderr)
            return 2
    module = importlib.import_module(f"benchmarks.{BENCHMARKS[argv[0]]}")
    sys.argv = [f"benchmarks {argv[0]}", *argv[1:]]
    result = module.main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
