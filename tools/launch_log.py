"""Every kernel launch of a fixed call set, as text, on a machine without a GPU: for showing that a
change moved no launch (run it before and after, then ``diff`` the two files).

    python tools/launch_log.py > before.txt      # at the old commit
    python tools/launch_log.py > after.txt       # at the new one
    diff before.txt after.txt && echo "same launches"

The call set: the sanitize driver's (every codec and paged op of every format at its geometries,
every deepseek_v4 operation; ``tools/sanitize_driver.py``), every public call of
``tests.harness.calls.public_calls`` at a decode step (64 rows) and a prefill (1,000 rows), and an
encode, decode and gather of 7 rows of every format at each of its declared example parameter sets.
Each runs twice, so the second run is the replayed one where a call replays.

Launches are logged instead of run (``tests.harness.launch_stub``: CPU tensors take the CUDA
path). A line is the call's label, the kernel, its grid and its arguments, with every tensor
argument written as ``@`` followed by the index of its address among the call's distinct
addresses (addresses differ between runs; which arguments share one does not). No byte is
written, so outputs are garbage; only the launches are compared.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sanitize_driver as sd  # noqa: E402

from kvformats.codec.registry import get_format, list_formats  # noqa: E402
from tests.harness import calls as harness_calls  # noqa: E402
from tests.harness.launch_stub import Address, stubbed_launches  # noqa: E402


def example_params(layout_cls) -> tuple:
    """A format's declared example parameter sets, wherever the declaration keeps them."""
    examples = getattr(layout_cls, "examples", None)
    for holder, name in ((examples, "params"), (layout_cls, "example_params")):
        value = getattr(holder, name, None) if holder is not None else None
        if isinstance(value, (tuple, list)):
            return tuple(value)
    return ({},)


def encode_args(layout, n: int, values, gen: torch.Generator):
    """A format's declared valid encode arguments, wherever the declaration keeps them."""
    examples = getattr(layout, "examples", None)
    fn = getattr(examples, "encode_args", None) or layout.example_encode_args
    return fn(n, values, gen)


def format_calls(gen: torch.Generator) -> list[tuple[str, object]]:
    out = []
    for fmt in list_formats():
        cls = type(get_format(fmt))
        for params in example_params(cls):
            lay = get_format(fmt, **params)
            pages = 4
            cache = lay.allocate(pages)
            slots = torch.arange(7, dtype=torch.int64) * 2 % (pages * lay.page_size)
            x, kwargs, _ = encode_args(lay, 7, lambda shape: torch.randn(shape, generator=gen), gen)
            label = f"{fmt}{sorted(params.items())}"
            out.append((f"{label}.encode", lambda lay=lay, x=x, k=kwargs, c=cache, s=slots: lay.encode(x, c, s, **k)))
            out.append((f"{label}.decode", lambda lay=lay, c=cache, s=slots: lay.decode(c, s)))
            out.append((f"{label}.gather", lambda lay=lay, c=cache, s=slots: lay.gather(c, s)))
    return out


def call_set() -> list[tuple[str, object]]:
    driver = sd.Driver(torch.device("cpu"), quick=False)
    sd.INTERPRETER[0] = True  # the Triton backends where a kernel is registered (launches stubbed)
    sd.add_codec_calls(driver)
    sd.add_dsv4_calls(driver)
    out = list(driver.calls)
    gen = torch.Generator().manual_seed(0)
    for rows in (64, 1000):
        for name, call in harness_calls.public_calls("cpu", rows=rows).items():
            out.append((f"public[{rows}].{name}", call))
    return out + format_calls(gen)


def render(label: str, log: list) -> list[str]:
    seen: dict[int, int] = {}
    lines = []
    for kernel, grid, args in log:
        words = []
        for a in args:
            if isinstance(a, Address):
                words.append(f"@{seen.setdefault(int(a), len(seen))}")
            else:
                words.append(repr(a))
        lines.append(f"{label} | {kernel} | {grid} | {' '.join(words)}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=None, help="only calls whose label contains this text")
    args = p.parse_args(argv)
    failures = 0
    from tests.harness.reliability_harness import kernel_routing

    log: list = []
    with kernel_routing(), stubbed_launches(log):
        calls = [(label, fn) for label, fn in call_set() if args.only is None or args.only in label]
        for label, fn in calls:
            for run in ("full", "again"):
                start = len(log)
                try:
                    fn()
                except Exception as e:  # a refusal is part of the behaviour compared
                    failures += 1
                    print(f"[{run}] {label} | raised {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                lines = render(label, log[start:])
                print("\n".join(f"[{run}] {line}" for line in lines) if lines else f"[{run}] {label} | no launch")
    print(f"# {len(calls)} calls, {failures} raised", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
