"""Compile every kvformats Triton kernel for a CUDA target on a machine without a GPU, and print
each kernel's registers, stack (spills) and SASS size.

    python tools/compile_check.py                 # sm_90 (H200), the sanitize driver's full call set
    python tools/compile_check.py --quick --arch 100
    python tools/compile_check.py --only dsv4 --sass   # + the commonest SASS opcodes per kernel

Why: a Triton release can fail to compile a kernel for one specialization only (Triton 3.6's
TritonGPURemoveLayoutConversions on some geometries of gather_paged, seen on the H200 after the
interpreter tests had passed). Run this with the GPU host's Triton (e.g. a virtualenv with
``pip install triton==3.6.0``) before spending device time; the interpreter never compiles.

How: Triton's active driver is replaced by a stand-in that names the target and has no device,
and every launch compiles (Triton's own specialization of each argument: alignment, ints equal
to 1, ...) without running. The calls are those of ``tools/sanitize_driver.py`` (every codec and
paged op of every format and geometry there, every deepseek_v4 operation), routed to the Triton
launchers on CPU tensors, so the outputs are garbage: only compilation is checked. Resource
figures come from ``cuobjdump`` in Triton's wheel. Relies on Triton internals
(``triton.runtime.driver``, ``JITFunction.run``); written against Triton 3.6 and 3.9.

"loads after a store" counts the global loads (LDG) that follow a global store (STG) in the
SASS text, within stretches that end at an unpredicated EXIT, RET or BRA (so one branch's loads
are not counted after another branch's stores; tests/harness/sass_text.py). A load cannot move above a
store that may alias it, so in straight-line code each such load can cost a wait on memory after
the store; at decode sizes, where a call is one program's dependent chain, such waits are a
visible part of its time. In
a kernel with a loop, the count also includes the loop's later iterations, which is not that
pattern. The table shows each kernel's worst specialization.

Exit status: 0 every kernel compiled; 1 a compile failure (listed first), or nothing compiled
(on a host with a GPU the calls do not reach the launchers this way; its GPU tests compile the
kernels for real).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for real (before anything imports Triton)
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository's kvformats, installed or not

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import jit as triton_jit  # noqa: E402
from triton.runtime.driver import driver as triton_driver  # noqa: E402

from tests.harness import sass_text  # noqa: E402

# Text of a compile failure in the traceback. An op that fails MLIR verification (e.g. "ptr type
# matches cmp type": a compare-and-swap operand of another type than the pointer's) prints its
# diagnostic to stderr and raises only "RuntimeError: error encountered during parsing".
COMPILE_ERRORS = ("CompilationError", "PassManager", "MLIR", "ptxas", "error encountered during parsing",
                  "failed to verify")


class _Props:
    def get_device_properties(self, device):  # what the NVIDIA backend asks while compiling
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}


class CompileOnlyDriver:
    """Triton driver stand-in: a target, no device (nothing is launched)."""

    utils = _Props()

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda

    def get_active_torch_device(self):
        return torch.device("cpu")


def install(arch: int) -> list:
    """Make every JIT launch compile only; returns the list the compiled kernels go to."""
    triton_driver.set_active(CompileOnlyDriver(arch))
    compiled: list = []
    run = triton_jit.JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    triton_jit.JITFunction.run = compile_only
    return compiled


def resources(kernel, sass: bool) -> dict:
    """registers, stack bytes, shared bytes, SASS instructions (+ the commonest opcodes)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
        code = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    found = sass_text.instructions(code)
    ops = [op for _, op in found]
    top = collections.Counter(op for op in ops).most_common(6) if sass else []
    return dict(regs=int(m[1]) if m else -1, stack=int(m[2]) if m else -1, shared=kernel.metadata.shared,
                sass=len(ops), top=" ".join(f"{o}:{n}" for o, n in top), late=sass_text.late_loads(found))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (default 90: H100/H200)")
    p.add_argument("--quick", action="store_true", help="the sanitize driver's quick set")
    p.add_argument("--only", choices=("codec", "dsv4"), default=None)
    p.add_argument("--sass", action="store_true", help="also the commonest SASS opcodes of each kernel")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from tests.harness import reliability_harness as harness
    import sanitize_driver as sd
    from tests.harness.reliability_harness import kernel_routing

    from kvformats_kernels.dsv4 import query

    compiled = install(args.arch)
    query._hw_e4m3 = lambda device: query.HW_E4M3["enabled"]  # the CUDA choice, on CPU tensors
    sd.INTERPRETER[0] = True  # route CPU tensors to the launchers (compiled here, not interpreted)
    harness.triton_available = lambda: True  # deepseek_v4 ops too (it asks for CUDA or the interpreter)
    d = sd.Driver(torch.device("cpu"), args.quick)
    if args.only != "dsv4":
        sd.add_codec_calls(d)
    if args.only != "codec":
        sd.add_dsv4_calls(d)
    failures, other = [], 0
    with kernel_routing():
        for label, fn in d.calls:
            try:
                fn()
            except Exception as e:  # garbage outputs may upset a caller; only compile errors count
                text = traceback.format_exc()
                if any(k in text for k in COMPILE_ERRORS):
                    failures.append((label, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
                else:
                    other += 1
                    if os.environ.get("COMPILE_CHECK_VERBOSE"):  # what raised, for a call that compiled nothing
                        print(f"{label}: {text}")
    for label, why in failures:
        print(f"COMPILE FAILED {label}: {why}")
    rows, seen = [], set()
    for name, kernel in compiled:
        if id(kernel) in seen:
            continue
        seen.add(id(kernel))
        rows.append((name, kernel.metadata.num_warps, resources(kernel, args.sass)))
    print(f"\nTriton {triton.__version__}, sm_{args.arch}: {len(d.calls)} calls, {len(rows)} compiled kernels, "
          f"{len(failures)} compile failures, {other} calls raising something else (outputs are not computed)")
    print("| kernel | warps | regs | stack B | shared B | SASS | loads after a store |"
          + (" top opcodes |" if args.sass else ""))
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" --- |" if args.sass else ""))
    agg: dict = {}
    for name, warps, r in rows:  # the worst specialization of each kernel and warp count
        key = (name, warps)
        worse = (r["stack"], r["regs"], r["late"]) > (agg[key]["stack"], agg[key]["regs"], agg[key]["late"]) \
            if key in agg else True
        if worse:
            agg[key] = r
    for (name, warps), r in sorted(agg.items()):
        print(f"| {name} | {warps} | {r['regs']} | {r['stack']} | {r['shared']} | {r['sass']} | {r['late']} |"
              + (f" {r['top']} |" if args.sass else ""))
    if not rows:  # every call ran some other path (seen on a host with a GPU): nothing was checked
        print("NOTHING COMPILED: no call reached a Triton launcher (this tool is meant for a machine "
              "without a GPU, where the calls are routed to the launchers on CPU tensors)")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
