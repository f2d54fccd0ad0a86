"""The kvformats command line, run in-process through main(argv) (and once as python -m)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_list_names_every_format_with_row_and_page_bytes(capsys):
    code, out, err = run(capsys, "list")
    assert code == 0 and err == ""
    for name in kvf.list_formats():
        layout = kvf.get_format(name)
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [name])
        assert line.split()[1:3] == [str(layout.row_bytes), str(layout.page_bytes)]


def test_python_dash_m_lists_every_format(published_only):
    """A fresh process lists the package's formats (a test-registered one is not in it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "kvformats", "list"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in kvf.list_formats():
        assert name in proc.stdout


@pytest.mark.parametrize("name", kvf.list_formats())
def test_show_prints_every_region_and_the_sizes(capsys, name):
    code, out, err = run(capsys, "show", name)
    layout = kvf.get_format(name)
    assert code == 0 and err == ""
    assert f"row {layout.row_bytes} B, page {layout.page_bytes} B" in out
    for r in layout.regions:
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [r.name])
        assert str(r.offset) in line.split()
        assert str(r.page_nbytes) in line.split()


def test_show_takes_integer_params(capsys):
    code, out, _ = run(capsys, "show", "fp8_ds_mla", "--param", "page_size=2")
    assert code == 0
    assert "row 584 B, page 1728 B (min 1168 B)" in out
    assert re.search(r"^page_pad\s+uint8\s+page\s+1168\s+-\s+560$", out, re.M)


@pytest.mark.parametrize("argv", [
    ("show", "no_such_format"),
    ("show", "fp8_indexer", "--param", "head_dim=100"),   # validator rejects it
    ("show", "fp8_indexer", "--param", "nonsense=1"),     # unknown parameter
    ("show", "fp8_indexer", "--param", "head_dim=big"),   # not an int
    ("show", "fp8_indexer", "--param", "head_dim"),       # no '='
    ("frobnicate",),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("kvformats: error:")


def check_demo_output(out: str) -> None:
    ratios = re.findall(r"max err / bound ([0-9.]+|inf) \((ok|BOUND VIOLATED)\)", out)
    assert len(ratios) == len(kvf.list_formats())
    assert all(float(r) <= 1.0 and tag == "ok" for r, tag in ratios)
    for name in kvf.list_formats():
        assert f"{name}(" in out
    assert "rows/s" in out
    lines = out.splitlines()
    too_wide = [line for line in lines if len(line) > 100]
    assert not too_wide, too_wide  # every line fits a 100-column terminal
    assert lines[-1] == f"verdict: all {len(kvf.list_formats())} formats round-trip within their bounds"
    assert "k uniform in -8..7" in out  # the input range is said
    assert len(re.findall(r"relative: max \|err\| / its row's max \|x\| [0-9.]+%", out)) == len(kvf.list_formats())
    # a few lines of one slot's bytes, not a page of them (each format: a line per region and 7 others)
    assert len(lines) < 24 + sum(7 + len(kvf.get_format(name).regions) for name in kvf.list_formats())
    assert "scale scale" not in out


def test_demo_holds_every_bound_and_writes_nothing_by_default(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "demo", "--rows", "256", "--device", "cpu")
    assert code == 0 and err == "", out + err
    check_demo_output(out)
    assert "read back byte-identical" in out and "slot" in out
    assert list(tmp_path.iterdir()) == []  # the file round trip ran in a removed temporary directory


def test_demo_save_keeps_the_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "demo", "--rows", "64", "--device", "cpu", "--save", "demo.safetensors")
    assert code == 0, out + err
    check_demo_output(out)
    from kvformats.caches.files import load_caches
    assert sorted(load_caches(tmp_path / "demo.safetensors")) == kvf.list_formats()
    assert "next: kvformats check demo.safetensors" in out


@pytest.mark.parametrize("target", ["{d}", "{d}/missing/demo.safetensors", "{d}/afile/demo.safetensors"])
def test_demo_refuses_an_unwritable_save_path_before_running(capsys, tmp_path, target):
    (tmp_path / "afile").write_text("x")
    code, out, err = run(capsys, "demo", "--rows", "64", "--device", "cpu", "--save", target.format(d=tmp_path))
    assert code == 2 and out == ""  # nothing ran
    assert err.startswith("kvformats: error: --save: cannot write") and err.count("\n") == 1


def test_demo_runs_without_the_io_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    code, out, err = run(capsys, "demo", "--rows", "64", "--device", "cpu")
    assert code == 0 and err == "", out + err
    assert "file: skipped (cache files need the io extra: pip install 'kvformats[io]')" in out
    assert out.splitlines()[-1].startswith("verdict: all")
    code, out, err = run(capsys, "demo", "--rows", "64", "--device", "cpu", "--save", "x.safetensors")
    assert code == 2 and out == "" and "pip install 'kvformats[io]'" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("layout", [kvf.Fp8DsMla(head_dim=256, rope_dim=64, page_size=4),
                                    kvf.Fp8DsMlaV32(page_size=4), kvf.Fp8Indexer(head_dim=256, page_size=4),
                                    kvf.Mxfp4Indexer(head_dim=64, page_size=4)], ids=lambda layout: layout.name)
def test_demo_bounds_come_from_the_regions(layout):
    import torch

    from kvformats.cli.demo import _ratio, element_bound

    g = torch.Generator().manual_seed(1)
    x = (torch.randn(32, layout.head_dim, generator=g) * torch.exp2(torch.randint(-8, 8, (32, 1), generator=g))
         ).to(torch.bfloat16).float()
    cache = layout.allocate(8)
    slots = torch.arange(32)
    layout.encode(x, cache, slots)
    bound = element_bound(layout, x)
    err = (layout.decode(cache, slots).float() - x).abs()
    assert _ratio(err, bound) <= 1
    at = 0
    for region in (r for r in layout.regions if r.role == "data"):
        n = region.shape[0] * (2 if region.dtype == "float4_e2m1fn_x2" else 1)
        assert bool((bound[:, at:at + n] > 0).all()) == bool(region.scale), region.name
        at += n
    assert at == layout.head_dim


def test_demo_says_when_a_bound_is_violated(capsys, tmp_path, monkeypatch):
    import kvformats.cli.demo

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(kvformats.cli.demo, "_ratio", lambda err, bound: 2.0)
    code, out, _ = run(capsys, "demo", "--rows", "16", "--device", "cpu")
    assert code == 1
    assert out.splitlines()[-1].startswith(f"verdict: FAILED: BOUND VIOLATED by {', '.join(kvf.list_formats()[:2])}")


def test_spec_write_then_check_then_drift(capsys, tmp_path):
    root = tmp_path / "formats"
    assert run(capsys, "spec", "--write", "--dir", str(root))[0] == 0
    files = sorted(root.glob("*.json"))
    assert files
    code, out, _ = run(capsys, "spec", "--check", "--dir", str(root))
    assert code == 0, out
    files[0].write_text(files[0].read_text().replace("1", "2", 1))
    code, out, _ = run(capsys, "spec", "--check", "--dir", str(root))
    assert code == 1
    assert files[0].stem in out


def test_spec_needs_a_mode(capsys):
    assert run(capsys, "spec")[0] == 2


def test_no_command_prints_the_help_and_exits_2(capsys):
    code, out, err = run(capsys)
    assert code == 2 and err == ""
    assert out.startswith("usage: kvformats") and "COMMAND" in out and "With no command: this help" in out


@pytest.mark.parametrize("command", ["show", "diagram"])
def test_params_are_parsed_by_their_declared_type(capsys, command):
    # issue #25 item 15: profile is a string parameter, page_size an int one
    code, out, err = run(capsys, command, "fp8_ds_mla", "--param", "profile=vllm", "--param", "page_size=2")
    assert code == 0 and err == "", err
    assert "profile=vllm" in out and "page_size=2" in out
    code, out, err = run(capsys, command, "fp8_ds_mla", "--param", "profile=nope")
    assert code == 2 and out == "" and "unknown profile 'nope'" in err and err.count("\n") == 1
    code, out, err = run(capsys, command, "fp8_ds_mla", "--param", "page_size=two")
    assert code == 2 and "page_size must be an integer" in err
    code, out, err = run(capsys, command, "fp8_ds_mla", "--param", "bogus=1")
    assert code == 2 and "has no parameter 'bogus'" in err and "profile" in err


def test_list_json_matches_the_table(capsys):
    import json

    code, out, err = run(capsys, "list", "--json")
    formats = json.loads(out)["formats"]
    assert code == 0 and err == ""
    assert [f["name"] for f in formats] == kvf.list_formats()
    for f in formats:
        layout = kvf.get_format(f["name"])
        assert (f["row_bytes"], f["page_bytes"], f["min_page_bytes"], f["params"]) == \
               (layout.row_bytes, layout.page_bytes, layout.min_page_bytes, layout.params)


def test_docs_check_says_ok_and_writes_refuse_unwritable_places(capsys, tmp_path, published_only):
    code, out, err = run(capsys, "docs", "--check", "--root", str(ROOT))
    assert code == 0 and err == "" and out.strip().endswith("every generated page is up to date")
    (tmp_path / "afile").write_text("x")
    checkout = tmp_path / "checkout"  # a checkout whose docs/ is a file
    (checkout / "spec").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "kvformats"\n')
    (checkout / "docs").write_text("x")
    for argv in (["spec", "--write", "--dir", str(tmp_path / "afile")],
                 ["spec", "--write", "--dir", str(tmp_path / "afile" / "sub")],
                 ["docs", "--write", "--root", str(checkout)]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.startswith("kvformats: error: cannot write") and err.count("\n") == 1


def test_spec_and_docs_writers_raise_output_errors(tmp_path):
    from kvformats.cli import build_parser
    from kvformats.errors import OutputError
    from kvformats.spec import docgen
    from kvformats.spec import formats as spec

    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match="not a directory"):
        spec.write_specs(tmp_path / "afile")
    with pytest.raises(OutputError, match="cannot write"):
        docgen.write_docs(tmp_path / "afile", build_parser())


class _ClosedPipe:
    """A stdout whose reader has gone away."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["show", "fp8_ds_mla", "--json"]])
def test_a_closed_stdout_ends_quietly(monkeypatch, capsys, argv):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(argv) == 141
    assert capsys.readouterr().err == ""


def test_a_closed_pipe_ends_quietly_in_a_real_process(tmp_path):
    # issue #25 item 12: `kvformats show --json | head` ended in a BrokenPipeError traceback
    lib = Path(kvf.__file__).resolve().parents[1]  # the kvformats under test
    env = dict(os.environ, PYTHONPATH=str(lib) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        proc = subprocess.run([sys.executable, "-m", "kvformats", "show", "fp8_ds_mla", "--json"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=lib, env=env, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


@pytest.fixture
def demo_never_runs(monkeypatch):
    import kvformats.cli.demo as demo

    monkeypatch.setattr(demo, "run_demo", lambda **kw: pytest.fail("the demo ran"))


def _usage_line(code, out, err, *words):
    assert code == 2 and out == "" and err.startswith("kvformats: error:") and err.count("\n") == 1, out + err
    for w in words:
        assert w in err, err


def test_demo_refuses_more_rows_than_the_memory_here(capsys, demo_never_runs):
    """Issue 44 item 13: ``--rows 100000000`` (about 11 TB) went on to allocate until the
    allocator or the machine gave out."""
    code, out, err = run(capsys, "demo", "--rows", "100000000", "--device", "cpu")
    _usage_line(code, out, err, "--rows 100000000", "cpu memory", "fewer --rows")


def test_demo_sizes_its_run_against_the_memory_available(capsys, demo_never_runs, monkeypatch):
    import kvformats.cli.args as args
    from kvformats.cli.demo import memory_needed

    assert 0 < memory_needed(64) < memory_needed(4096) < 2 << 30  # the default run: under 2 GiB
    monkeypatch.setattr(args, "available_memory", lambda device="cpu": memory_needed(64) - 1)
    code, out, err = run(capsys, "demo", "--rows", "64", "--device", "cpu")
    _usage_line(code, out, err, "available here")


def test_demo_says_an_allocator_refusal_in_one_line(capsys, monkeypatch):
    import torch

    import kvformats.cli.demo as demo

    def refuse(**kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 TiB")

    monkeypatch.setattr(demo, "run_demo", refuse)
    code, out, err = run(capsys, "demo", "--rows", "64", "--device", "cpu")
    _usage_line(code, out, err, "ran out of cpu memory")


def test_demo_refuses_an_empty_save_name(capsys, tmp_path, monkeypatch, demo_never_runs):
    """``--save ''`` ran the demo, wrote nothing and exited 0 without saying so."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "demo", "--rows", "64", "--device", "cpu", "--save", "")
    _usage_line(code, out, err, "--save", "empty")
    assert list(tmp_path.iterdir()) == []


def test_demo_says_why_fp4_error_is_expected(capsys, tmp_path, monkeypatch):
    """fp4's ~30 % relative error reads "ok": the demo says that is e2m1's bound, for the fp4
    formats only (issue 44 item 17)."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "demo", "--rows", "64", "--device", "cpu")
    assert code == 0
    blocks = {b.split("(")[0].strip(): b for b in out.split("\n\n") if "(" in b.split("\n")[0]}
    fp4 = [n for n in blocks if "fp4" in n]
    assert fp4 and all("that is fp4's bound" in blocks[n] for n in fp4)
    assert not any("that is fp4's bound" in b for n, b in blocks.items() if "fp4" not in n)
