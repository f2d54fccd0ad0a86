"""The CPU-testable parts of the GPU reliability tools: tools/sanitize.py's reading of
compute-sanitizer reports (on sample outputs written here) and its whole flow with a stand-in
sanitizer; the sanitize driver's coverage and its calls (reference backend, and the Triton
launchers under the interpreter); tools/fuzz_at_scale.py's --seconds budget, deadline and
--workers; tools/compile_check.py; the launch counter; benchmarks/bench_custom_ops_gpu.py's table."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.harness.launch_count import LaunchCounter
from scripts import ROOT, load_script

sanitize = load_script("tools/sanitize.py")

DONE = "SANITIZE-DRIVER-DONE calls=269 failures=0 triton_launches=412 kernels=9 seconds=3.1"
CLEAN_MEMCHECK = f"""========= COMPUTE-SANITIZER
triton kernels launched: encode_kernel:40,gather_bytes_kernel:60
{DONE}
========= ERROR SUMMARY: 0 errors
"""
OOB_MEMCHECK = f"""========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 1 bytes
=========     at encode_kernel+0x1a40 in /repo/kvformats_kernels/fp8_ds_mla_jit.py:88
=========     by thread (37,0,0) in block (0,0,0)
=========     Address 0x7f3a1c000e40 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a1c000000 of size 3648 bytes
=========
{DONE}
========= ERROR SUMMARY: 4 errors
"""
CLEAN_RACECHECK = f"""========= COMPUTE-SANITIZER
{DONE}
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""
RACY = f"""========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at paged_decode_kernel+0x5b0 in jit.py:120
=========     and Read access at paged_decode_kernel+0x620 in jit.py:131 [512 hazards]
=========
{DONE}
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
RACE_WARNING = f"""{DONE}
========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)
"""
UNINIT = f"""========= Uninitialized __global__ memory read of size 4 bytes
=========     at gather_bytes_kernel+0x90 in rows_jit.py:40
{DONE}
========= ERROR SUMMARY: 1 error
"""
# As a gVisor runtime answers: the device is refused, then every CUDA call fails.
UNSUPPORTED = """========= COMPUTE-SANITIZER
========= Error: Device not supported. Please refer to the "Supported Devices" section of the sanitizer documentation
Traceback (most recent call last):
RuntimeError: CUDA error: unknown error
========= Target application returned an error
========= ERROR SUMMARY: 1 error
"""
CRASHED_CLEAN = """========= COMPUTE-SANITIZER
Segmentation fault (core dumped)
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""
NO_SUMMARY = f"""========= COMPUTE-SANITIZER
{DONE}
"""
DRIVER_FAILED = """FAILED fp8_indexer encode:
SANITIZE-DRIVER-DONE calls=269 failures=1 triton_launches=400 kernels=9 seconds=3.0
========= ERROR SUMMARY: 0 errors
"""


@pytest.mark.parametrize("text,tool,status,errors", [
    (CLEAN_MEMCHECK, "memcheck", "clean", 0),
    (OOB_MEMCHECK, "memcheck", "findings", 4),
    (CLEAN_RACECHECK, "racecheck", "clean", 0),
    (RACY, "racecheck", "findings", 1),
    (RACE_WARNING, "racecheck", "findings", 0),
    (UNINIT, "initcheck", "findings", 1),
    (UNSUPPORTED, "memcheck", "unsupported", None),
    (CRASHED_CLEAN, "racecheck", "failed", 0),
    (NO_SUMMARY, "synccheck", "failed", None),
    (DRIVER_FAILED, "memcheck", "failed", 0),
])
def test_parse_report(text, tool, status, errors):
    res = sanitize.parse_report(text, tool)
    assert res.status == status
    assert res.errors == errors
    if DONE in text:
        assert (res.launches, res.kernels) == (412, 9)


def test_parse_report_details():
    res = sanitize.parse_report(OOB_MEMCHECK, "memcheck")
    assert res.first[0].startswith("========= Invalid __global__ write")
    assert sanitize.parse_report(RACE_WARNING, "racecheck").warnings == 2
    assert "Device not supported" in sanitize.parse_report(UNSUPPORTED, "memcheck").detail
    assert "did not finish" in sanitize.parse_report(CRASHED_CLEAN, "racecheck").detail
    assert sanitize.parse_driver("nothing here") is None
    assert sanitize.parse_driver(DONE)["triton_launches"] == 412
    cpu = sanitize.parse_report(DONE.replace("412", "0") + "\n========= ERROR SUMMARY: 0 errors\n", "memcheck")
    assert cpu.status == "failed" and "nothing was checked" in cpu.detail
    uncounted = sanitize.parse_report(DONE.replace("412", "-1") + "\n========= ERROR SUMMARY: 0 errors\n", "memcheck")
    assert uncounted.status == "clean" and uncounted.launches == -1 and "not counted" in uncounted.detail


def test_exit_status_and_table():
    clean = sanitize.Result("memcheck", "clean", errors=0, launches=10, kernels=2, seconds=1.5)
    found = sanitize.Result("racecheck", "findings", errors=3, launches=10, kernels=2)
    odd = sanitize.Result("initcheck", "unsupported", detail="Device not supported")
    assert sanitize.exit_status([clean]) == 0
    assert sanitize.exit_status([clean, found, odd]) == 1
    assert sanitize.exit_status([clean, odd]) == 2
    assert sanitize.exit_status([]) == 2
    table = sanitize.format_table([clean, found, odd], {"calls": 5, "triton_launches": 10, "kernels": 2})
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["tool", "result", "errors"]
    assert lines[2].split()[:6] == ["memcheck", "clean", "0", "10", "2", "1.5"]
    assert lines[4].split()[:3] == ["initcheck", "unsupported", "-"] and lines[4].endswith("Device not supported")


def test_tool_command_and_environment(tmp_path):
    opts = {"--target-processes", "--track-unused-memory", "--print-limit", "--report-api-errors"}
    cmd = sanitize.tool_command("/x/compute-sanitizer", "initcheck", ["--quick"], opts)
    assert cmd[:3] == ["/x/compute-sanitizer", "--tool", "initcheck"]
    # no --track-unused-memory: its default is off, and the H200 host's release exited 255 at once with it
    assert not any(c.startswith("--track-unused-memory") for c in cmd) and "--report-api-errors=no" in cmd
    assert cmd[-2:] == [str(sanitize.DRIVER), "--quick"]
    old = sanitize.tool_command("/x/cs", "memcheck", [], {"--print-limit"})  # an older release: options left out
    assert "--target-processes=all" not in old and "--print-limit=50" in old
    assert "--report-api-errors=no" not in sanitize.tool_command("/x/cs", "memcheck", [], opts, api_errors=True)
    env = sanitize.driver_env(str(tmp_path), "memcheck")
    assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1" and env["TRITON_CACHE_DIR"] == str(tmp_path)
    racecheck = sanitize.driver_env(str(tmp_path), "racecheck")
    assert racecheck.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")


def _fake_sanitizer(tmp_path: Path, reports: dict) -> str:
    """A stand-in compute-sanitizer printing a canned report per --tool."""
    for tool, text in reports.items():
        (tmp_path / f"{tool}.txt").write_text(text)
    script = tmp_path / "compute-sanitizer"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "--help" ]; then echo "--tool --target-processes --print-limit --track-unused-memory"; exit 0; fi
cat "{tmp_path}/$2.txt"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_sanitize_main_with_a_stand_in(tmp_path, capsys):
    fake = _fake_sanitizer(tmp_path, {"memcheck": CLEAN_MEMCHECK, "racecheck": RACY, "synccheck": UNSUPPORTED})
    argv = ["--sanitizer", fake, "--no-warm", "--logs", str(tmp_path / "logs")]
    assert sanitize.main(argv + ["--tools", "memcheck"]) == 0
    assert sanitize.main(argv + ["--tools", "memcheck", "racecheck", "synccheck"]) == 1
    out = capsys.readouterr().out
    assert "racecheck: findings" in out and "synccheck: unsupported" in out
    assert (tmp_path / "logs" / "racecheck.log").read_text() == RACY
    assert sanitize.main(argv + ["--tools", "synccheck"]) == 2
    capsys.readouterr()
    (tmp_path / "initcheck.txt").write_text("==ERROR== the target could not start\n")
    assert sanitize.main(argv + ["--tools", "initcheck"]) == 2
    out = capsys.readouterr().out  # a run without a summary is failed, and its own words are shown
    assert "initcheck: failed" in out and "| ==ERROR== the target could not start" in out


def test_sanitize_says_plainly_when_there_is_no_sanitizer(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda explicit=None: None)
    assert sanitize.main(["--no-warm", "--logs", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "compute-sanitizer not found" in out and "clean" not in out


# ----- the driver --------------------------------------------------------------------------------------
def test_driver_covers_every_deepseek_v4_operation():
    import torch

    sd = load_script("tools/sanitize_driver.py")
    from kvformats import deepseek_v4 as dsv4

    for quick in (False, True):
        d = sd.Driver(torch.device("cpu"), quick)
        assert {op for _, op, _ in sd.dsv4_cases(d)} == set(dsv4.MODEL_OPS)


# The interpreter run keeps to the codec ops: the deepseek_v4 kernels' own tests cover them there.
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU half: on a GPU host tools/sanitize.py runs the driver")
@pytest.mark.parametrize("extra", [[], ["--interpreter", "--quick", "--only", "codec"]])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's overflowing numpy products
def test_driver_calls_all_succeed_on_cpu(extra, capsys):
    sd = load_script("tools/sanitize_driver.py")

    try:
        assert sd.main(["--device", "cpu", *extra]) == 0
    finally:
        sd.INTERPRETER[0] = False
    out = capsys.readouterr().out
    fields = sanitize.parse_driver(out)
    assert fields["failures"] == 0 and fields["calls"] > (30 if extra else 200)
    assert fields["triton_launches"] == 0  # counted (the hook is in), and nothing compiled runs on the CPU
    if extra:  # the interpreter's launches go through no compiled launcher
        assert "fp8_ds_mla.gather_paged" not in out.split("skipped")[-1]


# ----- fuzz budget, launch counter, bench table ----------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU timing: on a GPU the first batch compiles kernels")
def test_fuzz_seconds_budget_stops_the_run(capsys):
    fuzz_at_scale = load_script("tools/fuzz_at_scale.py")

    t0 = time.time()
    rc = fuzz_at_scale.main(["--examples", "1000000", "--seconds", "2", "--formats", "fp8_indexer", "mxfp4_indexer",
                             "--no-pipeline", "--steps", "5"])
    took = time.time() - t0
    out = capsys.readouterr().out
    assert rc == 0 and took < 2 + 8
    assert "stopped by the --seconds 2 budget" in out
    reached = int(out.split("stopped by the --seconds 2 budget: ")[1].split()[0])
    assert 0 < reached < 1_000_000
    assert "differing from the model (outside written rows or in them): 0" in out
    totals = [ln for ln in out.splitlines() if "(machine total)" in ln]
    assert len(totals) == 2 and all(int(ln.split()[4]) > 0 for ln in totals)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU timing: on a GPU the first batch compiles kernels")
def test_fuzz_cuts_short_a_batch_that_overruns_its_budget(capsys, monkeypatch):
    fuzz_at_scale = load_script("tools/fuzz_at_scale.py")

    # batches planned at 30 s and a deadline timer 1.5 s after the start: the first batch is cut
    monkeypatch.setattr(fuzz_at_scale, "BATCH_SECONDS", 30.0)
    monkeypatch.setattr(fuzz_at_scale, "OVERRUN_SECONDS", -1.5)
    t0 = time.time()
    rc = fuzz_at_scale.main(["--examples", "1000000", "--seconds", "3", "--formats", "fp8_indexer", "--no-pipeline"])
    took = time.time() - t0
    out = capsys.readouterr().out
    assert rc == 0 and took < 10 and "out of time: a batch was cut short" in out
    assert int(out.split("total fuzzed operations: ")[1].split()[0]) > 0  # the cut batch's operations count
    assert "differing from the model (outside written rows or in them): 0" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU run: on a GPU each worker compiles kernels first")
def test_fuzz_workers_sum_their_tables():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "fuzz_at_scale.py"), "--examples", "200",
                           "--workers", "2", "--formats", "fp8_indexer", "--no-pipeline", "--steps", "5"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "workers: 2 (0 failed)" in out and "differing from the model (outside written rows or in them): 0" in out
    total = [ln for ln in out.splitlines() if "(machine total)" in ln]
    assert len(total) == 1 and int(total[0].split()[4]) >= 200  # each worker did its 100


def _triton_ptxas() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists()


@pytest.mark.skipif(not _triton_ptxas(), reason="needs Triton's NVIDIA backend (ptxas, cuobjdump in its wheel)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a tool for machines without a GPU; with one, the GPU tests "
                    "compile every kernel for real (and the tool reports that nothing compiled)")
def test_compile_check_compiles_every_codec_kernel_for_sm90():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check.py"), "--quick", "--only", "codec"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ", 0 compile failures," in done.stdout
    rows = {ln.split("|")[1].strip() for ln in done.stdout.splitlines() if ln.startswith("| ") and "kernel" in ln}
    assert {"encode_kernel", "decode_kernel", "gather_paged_kernel", "paged_decode_kernel",
            "mxfp4_encode_kernel", "fp8_encode_kernel"} <= rows


SASS = """
        /*0000*/                   LDG.E.64 R2, desc[UR4][R2.64] ;        /* 0x0000000402027981 */
        /*0010*/              @P0 BRA 0x60 ;                               /* 0x0000000000000947 */
        /*0020*/                   STG.E.128 desc[UR4][R4.64], R8 ;       /* 0x0000000804007986 */
        /*0030*/              @!P1 LDG.E R6, desc[UR4][R6.64] ;           /* 0x0000000406069981 */
        /*0040*/                   STG.E desc[UR4][R4.64+0x10], R6 ;      /* 0x0000100604007986 */
        /*0050*/                   EXIT ;                                 /* 0x000000000000794d */
        /*0060*/                   LDG.E.128 R8, desc[UR4][R2.64] ;       /* 0x0000000402087981 */
        /*0070*/                   STG.E.128 desc[UR4][R4.64], R8 ;       /* 0x0000000804007986 */
        /*0080*/              @P2 EXIT ;                                  /* 0x000000000000294d */
        /*0090*/                   LDG.E R6, desc[UR4][R6.64] ;           /* 0x0000000406067981 */
        /*00a0*/                   BRA 0xa0 ;                             /* 0xfffffffc00fc7947 */
"""


def test_sass_late_loads_count_per_stretch_between_exits():
    from tests.harness import sass_text

    found = sass_text.instructions(SASS)
    assert [op for _, op in found] == ["LDG", "BRA", "STG", "LDG", "STG", "EXIT", "LDG", "STG", "EXIT", "LDG", "BRA"]
    assert found[1][0] == "@P0" and found[0][0] == ""
    # 0x30 follows the store at 0x20; 0x60 starts after an unpredicated EXIT (another branch);
    # 0x90 follows the store at 0x70 (the EXIT at 0x80 is predicated)
    assert sass_text.late_loads(found) == 2
    assert sass_text.late_loads([(p, op) for p, op in found if op != "EXIT"]) == 3


def test_launch_counter_hooks_and_unhooks():
    pytest.importorskip("triton")
    from triton import knobs

    counter = LaunchCounter()
    assert counter.install() and counter.installed
    knobs.runtime.launch_enter_hook({"name": "encode_kernel"})
    knobs.runtime.launch_enter_hook({"name": "encode_kernel"})
    knobs.runtime.launch_enter_hook(None)
    # what compiled launches pass (Triton 3.x): a LazyDict, whose get() takes no key
    from triton.compiler.compiler import LazyDict

    knobs.runtime.launch_enter_hook(LazyDict({"name": "gather_kernel"}))
    counter.remove()
    knobs.runtime.launch_enter_hook({"name": "after"})
    assert counter.counts == {"encode_kernel": 2, "gather_kernel": 1, "?": 1} and counter.total() == 4
    assert not counter.installed


def test_bench_table_and_verdict():
    import benchmarks.bench_custom_ops_gpu as bench

    def row(fmt, op, launcher, op_nc_us):
        eager = {p: launcher + 30.0 for p in bench.EAGER_PATHS}
        eager.update(launcher=launcher, **{"op nc": op_nc_us})
        paired = {p: v - launcher for p, v in eager.items()}  # the overheads are the paired medians
        return dict(fmt=fmt, op=op, rows=64, eager=eager, paired=paired, graph={"launcher": 3.0, "op": 3.25})

    rows = [row("fp8_indexer", "encode", 20.0, 23.5), row("mxfp4_indexer", "gather", 18.0, 22.0)]
    table = bench.format_table(rows)
    lines = table.splitlines()
    assert lines[0].count("|") == lines[2].count("|") == len(bench.EAGER_PATHS) + len(bench.GRAPH_PATHS) + 9
    assert "| +30.0 | +30.0 | +3.5 | +30.0 |" in lines[2] and "+0.25" in lines[2]
    assert lines[-1].startswith("largest eager custom-op overhead (op nc − launcher): +4.0 µs (mxfp4_indexer gather)")
    assert "(op − launcher) up to +30.0 µs" in lines[-1]
    assert lines[-1].endswith(": met")
    assert bench.format_table([row("fp8_ds_mla", "decode", 20.0, 26.0)]).endswith("NOT met")


def test_bench_bare_ops_call_the_launcher_through_the_dispatcher():
    # the bench's "bare op" path: kvformats' schema, the launcher as the whole kernel (here the
    # reference functions on CPU tensors stand in for the launchers)
    import types

    import benchmarks.bench_custom_ops_gpu as bench

    import kvformats as kvf
    from kvformats.codec import slot_ops as ops

    lay = kvf.Fp8DsMla(page_size=2)
    impl = types.SimpleNamespace(encode=ops.encode_reference, decode=ops.decode_reference,
                                 gather=ops.gather_reference)
    bare = bench.bare_ops("fp8_ds_mla_test", lay, impl)
    assert bench.bare_ops("fp8_ds_mla_test", lay, impl) == bare  # defined once
    cache, want = lay.allocate(2), lay.allocate(2)
    x = torch.randn(3, lay.head_dim)
    slots = torch.tensor([0, 3, 1])
    bare["encode"]("fp8_ds_mla", "{}", [x], cache, slots, "triton", False)
    lay.encode(x, want, slots)
    assert torch.equal(cache, want)
    (dec,) = bare["decode"]("fp8_ds_mla", "{}", cache, slots, "triton", False)
    assert torch.equal(dec, lay.decode(want, slots))
    assert torch.equal(bare["gather"]("fp8_ds_mla", "{}", cache, slots, "triton", False), lay.gather(want, slots))


def test_fuzz_preflight_flags_ops_without_a_registered_kernel():
    pytest.importorskip("triton")
    fuzz_at_scale = load_script("tools/fuzz_at_scale.py")

    offered = lambda backend, fmt, op: True  # noqa: E731  (a harness that offers every op)
    flagged = fuzz_at_scale.unregistered_ops([("fp8_indexer", "triton", None), ("no_such_format", "triton", None),
                                              ("no_such_format", "reference", None)], offered)
    assert flagged == [f"no_such_format.{op}" for op in ("encode", "decode", "gather", "dequantize_gather",
                                                         "gather_paged", "decode_topk")]


def test_gpu_session_script_refuses_an_unknown_part():
    script = Path(__file__).resolve().parents[2] / "tools" / "gpu_session.sh"
    done = subprocess.run(["bash", str(script), "bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage:" in done.stderr
