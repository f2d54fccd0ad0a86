"""Outputs that cannot be written: refused up front in one line (exit 2), before any work, and
nothing replaced; a failing standard output ends in one line too (issue 35, item 12)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.cli import main

LINUX_PROC = os.path.isdir("/proc/self")  # /proc refuses new files though root may write there


def run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def one_line(err: str, start: str) -> bool:
    return err.startswith(f"kvformats: error: {start}") and err.count("\n") == 1


def unwritable(tmp_path: Path) -> list[str]:
    (tmp_path / "afile").write_text("x")
    places = [str(tmp_path / "missing" / "x"), str(tmp_path), str(tmp_path / "afile" / "x")]
    return places + (["/proc/x"] if LINUX_PROC else [])


def test_demo_save_refused_before_the_demo(capsys, tmp_path, monkeypatch):
    import kvformats.cli.demo as demo

    monkeypatch.setattr(demo, "run_demo", lambda **kw: pytest.fail("the demo ran"))
    for target in unwritable(tmp_path):
        code, out, err = run(capsys, "demo", "--rows", "8", "--device", "cpu", "--save", target)
        assert code == 2 and out == "" and one_line(err, "--save: cannot write the cache file"), (target, err)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_demo_save_does_not_replace_a_pipe(capsys, tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    code, out, err = run(capsys, "demo", "--rows", "8", "--device", "cpu", "--save", str(pipe))
    assert code == 2 and out == "" and one_line(err, "--save: cannot write") and "not a regular file" in err
    assert pipe.is_fifo()  # a cache file is renamed into place: it would have replaced the pipe


def test_a_directory_that_refuses_new_files_is_found_up_front(capsys, tmp_path, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    code, out, err = run(capsys, "diagram", "fp8_ds_mla", "-o", str(tmp_path / "d.svg"))
    assert code == 2 and out == "" and one_line(err, "cannot write the SVG file") and "Read-only" in err
    assert list(tmp_path.iterdir()) == []


def test_quality_out_refused_before_the_report(capsys, tmp_path, monkeypatch):
    import kvformats.dsv4_layer.quality as quality

    monkeypatch.setattr(quality, "report", lambda *a, **k: pytest.fail("the report ran"))
    for target in unwritable(tmp_path):
        code, out, err = run(capsys, "quality", "--tiny", "--json", "--out", target)
        assert code == 2 and out == "" and one_line(err, "--out: cannot write the quality report"), (target, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_an_output_failing_after_the_work_is_one_line(capsys, tmp_path, monkeypatch):
    import kvformats.caches.files as files
    from kvformats.errors import CacheWriteError

    def full(path, caches):
        raise CacheWriteError(f"cannot write the cache file {path}: No space left on device")

    monkeypatch.setattr(files, "save_caches", full)
    code, out, err = run(capsys, "demo", "--rows", "8", "--device", "cpu", "--save", str(tmp_path / "d.st"))
    assert code == 2 and one_line(err, "cannot write the cache file") and "No space" in err


class _FullStdout:
    """A stdout on a full device."""

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["show", "fp8_ds_mla"]])
def test_a_full_stdout_is_one_line(monkeypatch, capsys, argv):
    monkeypatch.setattr(sys, "stdout", _FullStdout())
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err, "cannot write to standard output: No space left on device")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_dev_full_in_a_real_process():
    lib = Path(kvf.__file__).resolve().parents[1]  # the kvformats under test
    env = dict(os.environ, PYTHONPATH=str(lib) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "kvformats", "list"], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=lib, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "kvformats: error: cannot write to standard output: No space left on device\n"


def test_a_gpu_benchmark_without_cuda_is_one_line(monkeypatch, capsys):
    import torch

    from benchmarks.__main__ import main as bench_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main(["kernels_gpu"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == "benchmarks kernels_gpu: needs a CUDA device; none is available here\n"


def test_reference_cpu_unknown_format_is_one_line(capsys):
    from benchmarks.__main__ import main as bench_main

    assert bench_main(["reference_cpu", "--formats", "fp8_ds_mla", "nosuch"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "unknown format 'nosuch'" in cap.err


def test_benchmarks_help_is_plain_text(capsys):
    """``python3 -m benchmarks --help`` lists every benchmark with its docstring's first sentence,
    whole and without reST markup (it showed ``literals`` and lines cut mid-sentence)."""
    from benchmarks.__main__ import BENCHMARKS
    from benchmarks.__main__ import main as bench_main

    assert bench_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "`" not in out and out.startswith("usage: python3 -m benchmarks <name>")
    for name in BENCHMARKS:
        assert f"\n  {name} " in out
    entries: list[str] = []
    for line in out.split("\n\n", 1)[1].splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            entries.append(line)
        elif entries:
            entries[-1] += line
    assert len(entries) == len(BENCHMARKS)
    assert all(" ".join(e.split()).endswith(".") for e in entries), entries
