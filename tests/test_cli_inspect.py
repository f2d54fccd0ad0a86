"""kvformats dump / diff / check / diagram / show --json, and their usage errors (exit 2, nothing written)."""

import json

import pytest
import torch

import kvformats as kvf
from kvformats.caches.files import save_caches
from kvformats.cli import main


@pytest.fixture
def files(tmp_path):
    g = torch.Generator().manual_seed(0)
    a, b = kvf.Fp8DsMla(page_size=4), kvf.Mxfp4Indexer(page_size=4)
    ca, cb = a.allocate(3), b.allocate(2)
    a.encode(torch.randn(6, 512, generator=g), ca, torch.arange(6))
    b.encode(torch.randn(5, 128, generator=g), cb, torch.arange(5))
    save_caches(tmp_path / "one.safetensors", {"swa": (a, ca), "idx": (b, cb)})
    ca2 = ca.clone()
    ca2[1, 3] ^= 0x01  # page 1 row 0 nope[3]
    save_caches(tmp_path / "two.safetensors", {"swa": (a, ca2), "idx": (b, cb)})
    bad = ca.clone()
    bad[2, 4 * 576 + 1] = 0xFF  # page 2 row 0 scale byte 1
    save_caches(tmp_path / "bad.safetensors", {"swa": (a, bad)})
    return tmp_path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dump_page_and_slot(files, capsys):
    code, out, _ = run(capsys, "dump", files / "one.safetensors", "--tensor", "swa", "--page", 1)
    # by default a summary: one line per region (the full page is thousands of lines)
    regions = [line.split()[0] for line in out.splitlines()[2:-1]]
    assert code == 0 and regions == ["nope", "rope", "scale", "scale_pad", "page_pad"] and "--full" in out
    assert "row 0 nope[0] block 0" not in out and len(out.splitlines()) == 8
    code, full, _ = run(capsys, "dump", files / "one.safetensors", "--tensor", "swa", "--page", 1, "--full")
    assert code == 0 and "row 0 nope[0] block 0" in full and "scale_pad" in full and "page_pad" in full
    assert len(full.splitlines()) > 100
    code, out, _ = run(capsys, "dump", files / "one.safetensors", "--tensor", "swa", "--slot", 5, "--json")
    rec = json.loads(out)
    assert code == 0 and rec["slot"] == 5 and rec["page"] == 1 and rec["row"] == 1
    assert [r["name"] for r in rec["regions"]] == ["nope", "rope", "scale", "scale_pad"]
    decoded = kvf.Fp8DsMla(page_size=4)  # values beside bytes equal what decode returns
    from kvformats.caches.files import load_cache
    entry = load_cache(files / "one.safetensors", "swa")
    want = decoded.decode(entry.cache, torch.tensor([5]))[0, :448].float()
    assert torch.equal(torch.tensor(rec["regions"][0]["values"]), want)
    code, out, _ = run(capsys, "dump", files / "one.safetensors", "--tensor", "idx", "--rows", "0:1", "--json")
    assert code == 0 and {line["row"] for line in json.loads(out)["lines"]} == {0}


def test_diff_exit_codes_and_report(files, capsys):
    code, out, _ = run(capsys, "diff", files / "one.safetensors", files / "one.safetensors", "--tensor", "swa")
    assert code == 0 and out.startswith("equal")
    code, out, _ = run(capsys, "diff", files / "one.safetensors", files / "two.safetensors", "--tensor", "swa", "--json")
    report = json.loads(out)
    assert code == 1 and not report["equal"]
    assert report["regions"]["nope"]["bytes_differ"] == 1
    first = report["first"][0]
    assert (first["region"], first["page"], first["row"], first["byte"], first["block"]) == ("nope", 1, 0, 3, 0)
    code, out, _ = run(capsys, "diff", files / "one.safetensors", files / "two.safetensors", "--tensor", "swa",
                       "--page", 2)
    assert code == 0
    code, out, _ = run(capsys, "diff", files / "one.safetensors", files / "two.safetensors", "--tensor", "swa")
    assert code == 1 and "nope: page 1 row 0 byte 3" in out


def test_check_reports_rules(files, capsys):
    code, out, _ = run(capsys, "check", files / "one.safetensors")
    assert code == 0 and "swa:" in out and "idx:" in out
    code, out, _ = run(capsys, "check", files / "bad.safetensors", "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    swa = report["tensors"][0]
    assert swa["rules"]["ue8m0_not_ff"]["first_pages"] == [2]
    assert swa["bad_pages"][0]["page"] == 2


def test_diagram_and_show_json(tmp_path, capsys):
    code, out, _ = run(capsys, "diagram", "fp8_ds_mla", "--param", "page_size=2", "-o", tmp_path / "d.svg")
    assert code == 0 and (tmp_path / "d.svg").read_text().startswith("<svg")
    assert "page: 1728 B" in (tmp_path / "d.svg").read_text()
    code, out, _ = run(capsys, "show", "fp8_indexer", "--json")
    spec = json.loads(out)
    assert code == 0 and spec["row_bytes"] == 132 and spec["page_bytes"] == 8448


@pytest.mark.parametrize("argv", [
    ["dump", "{d}/missing.safetensors"],
    ["dump", "{d}/one.safetensors"],  # two caches, none named
    ["dump", "{d}/one.safetensors", "--tensor", "nope"],
    ["dump", "{d}/one.safetensors", "--tensor", "swa", "--page", "3"],
    ["dump", "{d}/one.safetensors", "--tensor", "swa", "--slot", "12"],
    ["dump", "{d}/one.safetensors", "--tensor", "swa", "--slot", "-1"],
    ["dump", "{d}/one.safetensors", "--tensor", "swa", "--rows", "3:9"],
    ["diff", "{d}/one.safetensors", "{d}/missing.safetensors", "--tensor", "swa"],
    ["check", "{d}/foreign.safetensors"],
    ["diagram", "no_such_format"],
    ["diagram", "fp8_ds_mla", "--param", "head_dim=100"],
    ["diagram", "fp8_ds_mla", "-o", "{d}/no_such_dir/x.svg"],
    ["diagram", "fp8_ds_mla", "-o", "{d}"],
    ["diagram", "fp8_ds_mla", "-o", "{d}/one.safetensors/x.svg"],
    ["check", "{d}"],
    ["dump", "/dev/null"],
])
def test_usage_errors_exit_2_with_one_line(files, capsys, argv):
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(2)}, str(files / "foreign.safetensors"))
    before = sorted(p.name for p in files.iterdir())
    code, out, err = run(capsys, *[a.format(d=files) for a in argv])
    assert code == 2 and out == ""
    assert err.startswith("kvformats: error: ") and err.count("\n") == 1
    assert sorted(p.name for p in files.iterdir()) == before


def test_diff_of_different_formats_is_a_usage_error(files, capsys):
    a, b = kvf.Fp8Indexer(page_size=4), kvf.Fp8Indexer(page_size=8)
    save_caches(files / "p4.safetensors", {"x": (a, a.allocate(2))})
    save_caches(files / "p8.safetensors", {"x": (b, b.allocate(1))})
    code, _, err = run(capsys, "diff", files / "p4.safetensors", files / "p8.safetensors")
    assert code == 2 and "only caches of one layout compare" in err


def test_diff_of_one_page_names_that_page_everywhere(files, capsys):
    # issue #25 item 9: the largest difference was reported "at page 0" under --page 1
    argv = ["diff", files / "one.safetensors", files / "two.safetensors", "--tensor", "swa", "--page", 1]
    code, out, _ = run(capsys, *argv, "--json")
    report = json.loads(out)
    assert code == 1 and report["regions"]["nope"]["max_at"] == {"page": 1, "row": 0, "element": 3}
    assert [item["page"] for item in report["first"]] == [1]
    code, out, _ = run(capsys, *argv)
    assert code == 1 and "at" in out
    table = next(line for line in out.splitlines() if line.startswith("nope "))
    assert table.endswith("page 1 row 0 element 3")


def test_diff_pad_differences_have_no_row_and_bad_max_items_is_a_usage_error(files, capsys, tmp_path):
    from kvformats.caches.files import load_cache

    entry = load_cache(files / "one.safetensors", "swa")
    dirty = entry.cache.clone()
    dirty[2, -1] = 5  # the last page-pad byte of page 2
    save_caches(tmp_path / "pad.safetensors", {"swa": (entry.layout, dirty)})
    code, out, _ = run(capsys, "diff", files / "one.safetensors", tmp_path / "pad.safetensors", "--tensor", "swa",
                       "--json")
    pad = json.loads(out)["regions"]["page_pad"]
    assert code == 1 and pad["max_at"]["page"] == 2 and pad["max_at"]["row"] is None
    code, out, err = run(capsys, "diff", files / "one.safetensors", files / "two.safetensors", "--tensor", "swa",
                         "--max-items", -1)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--max-items" in err and "max_items" not in err


def test_check_of_a_file_without_caches_says_so(tmp_path, capsys):
    save_caches(tmp_path / "empty.safetensors", {})
    code, out, err = run(capsys, "check", tmp_path / "empty.safetensors")
    assert code == 0 and err == ""
    assert out == f"{tmp_path / 'empty.safetensors'}: the file holds no caches; nothing to check\n"
    code, out, _ = run(capsys, "check", tmp_path / "empty.safetensors", "--json")
    assert code == 0 and json.loads(out)["tensors"] == []
    code, out, err = run(capsys, "dump", tmp_path / "empty.safetensors")
    assert code == 2 and "holds no caches" in err


def test_dump_into_a_closed_pipe_ends_quietly(files):
    import os
    import subprocess
    import sys
    from pathlib import Path

    lib = Path(kvf.__file__).resolve().parents[1]  # the kvformats under test
    env = dict(os.environ, PYTHONPATH=str(lib) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "kvformats", "dump", str(files / "one.safetensors"), "--tensor",
                               "swa", "--page", "1"], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              env=env, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == ""
