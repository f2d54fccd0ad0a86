"""Run every kvformats Triton kernel under compute-sanitizer and print one line per tool.

    python tools/sanitize.py                          # memcheck, racecheck, initcheck, synccheck
    python tools/sanitize.py --tools memcheck --quick
    python tools/sanitize.py --cache-dir /tmp/kvf-triton-cache --logs /tmp/kvf-sanitize

``tools/sanitize_driver.py`` (every Triton op of every format, the paged ops with missing pages
and out-of-range slots, every deepseek_v4 operation) runs once without the sanitizer to fill
``TRITON_CACHE_DIR`` (compiling under the sanitizer is slow), then once under each tool, as a
process of its own. Under memcheck and initcheck torch's caching allocator is turned off
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``): inside its pools an out-of-bounds write lands in another
live block and is not reported, and a reused block counts as initialised.

Each tool's result is read from its own report (``ERROR SUMMARY: N errors``; racecheck's
``RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)``) together with the driver's
closing line; a run whose driver did not finish, or whose report has no summary, is *failed*,
never clean. A sanitizer that cannot run on this device or runtime (no binary, "Device not
supported", ...) is reported as *unsupported* with its own words.

Exit status: 0 every tool clean; 1 any finding; 2 no finding but a tool unsupported or failed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "sanitize_driver.py"
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
DONE = "SANITIZE-DRIVER-DONE"
NO_CACHING = {"memcheck", "initcheck"}
# Words compute-sanitizer uses when it cannot instrument this device / runtime at all.
UNSUPPORTED = re.compile(
    r"device not supported|not supported on this|unsupported (device|gpu|platform|driver)|"
    r"internal sanitizer error|unable to (find|load|initialize)|failed to (initialize|load)|"
    r"target application terminated before first instrumented api call|"
    r"no (cuda-capable|supported) device|cuda driver version is insufficient|"
    r"unrecognized option|unknown option|invalid option", re.IGNORECASE)
# What a tool prints for an access it caught in a kernel (vs. its own errors about the setup).
KERNEL_FINDING = re.compile(r"Invalid __\w+__|Uninitialized __\w+__|Race reported|Barrier error|Misaligned|"
                            r"Out-of-range|Hardware exception|is out of bounds|Illegal|Divergent", re.IGNORECASE)
FINDING_LINE = re.compile(r"^=+\s+(Invalid|Uninitialized|Barrier|Race|Error|Warning|Program hit|Leaked|"
                          r"Out-of-range|Misaligned|Address|.*hazard)", re.IGNORECASE)


@dataclass
class Result:
    tool: str
    status: str  # clean | findings | failed | unsupported
    errors: int | None = None
    warnings: int = 0
    launches: int | None = None
    kernels: int | None = None
    seconds: float = 0.0
    detail: str = ""
    first: list[str] = field(default_factory=list)


# ----- parsing ------------------------------------------------------------------------------------
def parse_driver(text: str) -> dict | None:
    """The driver's closing line as a dict of ints (calls, failures, triton_launches, kernels), or None."""
    lines = [ln for ln in text.splitlines() if DONE in ln]
    if not lines:
        return None
    fields = dict(re.findall(r"(\w+)=(-?[\d.]+)", lines[-1]))
    return {k: (float(v) if "." in v else int(v)) for k, v in fields.items()}


def parse_report(text: str, tool: str) -> Result:
    """A tool's result from its complete output (sanitizer lines and the driver's own)."""
    errors = [int(n) for n in re.findall(r"ERROR SUMMARY:\s*(\d+) errors?", text)]
    races = [tuple(map(int, m)) for m in re.findall(
        r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed\s*\((\d+) errors?,\s*(\d+) warnings?\)", text)]
    driver = parse_driver(text)
    res = Result(tool, "failed")
    if driver is not None:
        res.launches, res.kernels = driver.get("triton_launches"), driver.get("kernels")
    res.first = [ln.strip() for ln in text.splitlines()
                 if FINDING_LINE.match(ln.strip()) and "SUMMARY" not in ln][:8]
    counted = sum(errors) + sum(r[1] + r[2] for r in races)
    unsupported = UNSUPPORTED.search(text)
    ran = driver is not None and driver.get("triton_launches", 0) > 0
    # "Device not supported" and then every CUDA call failing is no finding about kvformats;
    # a reported kernel access (res.first) is one, even if the driver died of it.
    caught = any(KERNEL_FINDING.search(ln) for ln in text.splitlines() if ln.startswith("="))
    if unsupported and not ran and not (counted and caught):
        res.status, res.detail = "unsupported", _line_of(text, unsupported.start())
        return res
    if not errors and not races:
        res.detail = "no sanitizer summary in the output" + ("" if driver else "; the driver did not finish")
        return res
    res.errors = sum(errors) + sum(r[1] for r in races)
    res.warnings = sum(r[2] for r in races)
    if counted:
        res.status = "findings"
    elif driver is None:
        res.detail = "the driver did not finish (crashed or was killed): 0 errors counts for nothing"
    elif driver.get("failures", 0):
        res.detail = f"{driver['failures']} driver calls raised"
    elif driver.get("triton_launches") == 0:
        res.detail = "no compiled Triton kernel ran (a CPU device, or no kernel registered): nothing was checked"
    else:
        res.status = "clean"
        if driver.get("triton_launches", -1) < 0:
            res.detail = "Triton launches not counted (no launch hook in this Triton)"
    return res


def _line_of(text: str, at: int) -> str:
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return text[start:end if end >= 0 else len(text)].strip().lstrip("= ").strip()


# ----- running ------------------------------------------------------------------------------------
def find_sanitizer(explicit: str | None = None) -> str | None:
    """The compute-sanitizer binary: --sanitizer, $COMPUTE_SANITIZER, PATH, CUDA's usual places,
    or the nvidia-cuda-sanitizer-api wheel."""
    candidates = [explicit, os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer"),
                  "/usr/local/cuda/bin/compute-sanitizer",
                  *sorted(glob.glob("/usr/local/cuda-*/bin/compute-sanitizer"), reverse=True),
                  *sorted(glob.glob("/opt/nvidia/*/compute-sanitizer*/compute-sanitizer")),
                  *glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia",
                                          "*", "compute-sanitizer", "compute-sanitizer"))]
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def supported_options(binary: str) -> set[str]:
    """Options this compute-sanitizer lists in --help (older releases lack some)."""
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", out.stdout + out.stderr))


def tool_command(binary: str, tool: str, driver_args: list[str], options: set[str],
                 api_errors: bool = False) -> list[str]:
    cmd = [binary, "--tool", tool]
    wanted = [("--target-processes", "all"), ("--print-limit", "50")]
    if not api_errors:  # CUDA API errors of torch / Triton internals are not kernel findings
        wanted.append(("--report-api-errors", "no"))
    if tool == "racecheck":
        wanted.append(("--racecheck-report", "all"))
    for opt, value in wanted:  # "--opt=value": also right where an option's value is optional
        if not options or opt in options:
            cmd.append(f"{opt}={value}")
    return cmd + [sys.executable, str(DRIVER), *driver_args]


def driver_env(cache_dir: str, tool: str | None) -> dict:
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("CUDA_MODULE_LOADING", "LAZY")  # only the kernels used get loaded (and instrumented)
    env.pop("TRITON_INTERPRET", None)
    if tool in NO_CACHING:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def run_logged(cmd: list[str], env: dict, log: Path, timeout: float) -> tuple[str, float, int | None]:
    """(output, seconds, exit status or None when killed at ``timeout``); the whole process
    group goes on a timeout, so no sanitized driver is left holding the GPU."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        text, rc = proc.communicate(timeout=timeout)[0], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, rc = (proc.communicate()[0] or "") + f"\n[sanitize.py: killed after {timeout:.0f} s]\n", None
    log.write_text(text)
    return text, time.time() - t0, rc


# ----- the table ----------------------------------------------------------------------------------
def format_table(results: list[Result], warm: dict | None = None) -> str:
    head = f"{'tool':<10} {'result':<12} {'errors':>6} {'triton launches':>15} {'kernels':>7} {'seconds':>8}  detail"
    lines = [head, "-" * len(head)]
    for r in results:
        errs = "-" if r.errors is None else str(r.errors + r.warnings)
        launches = "-" if r.launches is None else str(r.launches)
        kernels = "-" if r.kernels is None else str(r.kernels)
        lines.append(f"{r.tool:<10} {r.status:<12} {errs:>6} {launches:>15} {kernels:>7} {r.seconds:>8.1f}  {r.detail}")
    if warm is not None:
        lines.append(f"(without the sanitizer: {warm.get('calls')} calls, {warm.get('triton_launches')} Triton "
                     f"launches of {warm.get('kernels')} kernels)")
    return "\n".join(lines)


def exit_status(results: list[Result]) -> int:
    if any(r.status == "findings" for r in results):
        return 1
    return 0 if results and all(r.status == "clean" for r in results) else 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    p.add_argument("--quick", action="store_true", help="the driver's --quick (one dtype, one geometry per format)")
    p.add_argument("--only", choices=("codec", "dsv4"), default=None,
                   help="the driver's --only: the format codec / paged ops, or the deepseek_v4 operations")
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "kvformats-sanitize-triton-cache"),
                   help="TRITON_CACHE_DIR shared by the warm-up run and the sanitized runs")
    p.add_argument("--no-warm", action="store_true", help="skip the unsanitized run that fills --cache-dir")
    p.add_argument("--logs", default=None, help="folder for each tool's full output (default: a new temp folder)")
    p.add_argument("--sanitizer", default=None, help="path of compute-sanitizer (default: searched)")
    p.add_argument("--api-errors", action="store_true",
                   help="also count failed CUDA API calls as findings (default: kernel accesses only)")
    p.add_argument("--timeout", type=float, default=240, help="seconds per tool run (default 240)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="kvformats-sanitize-"))
    logs.mkdir(parents=True, exist_ok=True)
    driver_args = (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
    binary = find_sanitizer(args.sanitizer)
    if binary is None:
        print("compute-sanitizer not found (looked at --sanitizer, $COMPUTE_SANITIZER, PATH, /usr/local/cuda*/bin, "
              "the nvidia-cuda-sanitizer-api wheel): nothing was checked")
        print(format_table([Result(t, "unsupported", detail="no compute-sanitizer binary") for t in args.tools]))
        return 2
    warm = None
    if not args.no_warm:
        text, secs, rc = run_logged([sys.executable, str(DRIVER), *driver_args], driver_env(args.cache_dir, None),
                                    logs / "warm.log", args.timeout)
        warm = parse_driver(text)
        print(f"warm-up run (fills {args.cache_dir}): {secs:.1f} s, exit {rc}, log {logs / 'warm.log'}", flush=True)
        if warm is None or rc != 0:
            print(text[-4000:])
            print("the driver fails without the sanitizer; fix that first (nothing was sanitized)")
            return 2
    options = supported_options(binary)
    results = []
    for tool in args.tools:
        cmd = tool_command(binary, tool, driver_args, options, args.api_errors)
        text, secs, rc = run_logged(cmd, driver_env(args.cache_dir, tool), logs / f"{tool}.log", args.timeout)
        res = parse_report(text, tool)
        res.seconds = secs
        if rc is None and res.status != "findings":
            res.status, res.detail = "failed", f"killed after --timeout {args.timeout:g} s"
        results.append(res)
        print(f"{tool}: {res.status} ({secs:.1f} s, exit {rc}, log {logs / (tool + '.log')})", flush=True)
        for ln in res.first:
            print(f"    {ln}")
        if res.status == "failed":  # e.g. an option this release rejects: its own words
            print("\n".join(f"    | {ln}" for ln in text.strip().splitlines()[:15]))
    print()
    print(f"compute-sanitizer: {binary}")
    print(format_table(results, warm))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
