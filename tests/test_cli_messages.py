"""CLI messages and tables (issue 35 item 18): what a reader needs to act on, in the CLI's terms."""

from __future__ import annotations

import re

import pytest
import torch

import kvformats as kvf
from kvformats.spec.diagram import layout_svg


@pytest.mark.parametrize("name", kvf.list_formats())
def test_diagram_labels_the_page_end_and_the_row_end(name):
    """The fp8_ds_mla page map once stopped at 36864: its end, 37440, collided with other labels."""
    layout = kvf.get_format(name)
    labels = re.findall(r'class="off">(\d+)<', layout_svg(layout))
    assert str(layout.page_bytes) in labels and str(layout.row_bytes) in labels, labels


@pytest.fixture
def files(tmp_path):
    from kvformats.caches.files import save_caches

    a, b = kvf.Fp8DsMla(page_size=4), kvf.Mxfp4Indexer(page_size=4)
    ca, cb = a.allocate(3), b.allocate(2)
    a.encode(torch.randn(6, 512, generator=torch.Generator().manual_seed(0)), ca, torch.arange(6))
    save_caches(tmp_path / "two.safetensors", {"swa": (a, ca), "idx": (b, cb)})
    bad = ca.clone()
    bad[2, 4 * 576 + 1] = 0xFF  # page 2 row 0 scale byte 1: one bad page
    save_caches(tmp_path / "bad.safetensors", {"swa": (a, bad)})
    small = kvf.Fp8DsMla(page_size=2)
    save_caches(tmp_path / "other.safetensors", {"swa": (small, small.allocate(1))})
    return tmp_path


def run(capsys, *argv):
    from kvformats.cli import main

    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_dump_of_a_file_of_several_caches_names_the_option(files, capsys):
    code, out, err = run(capsys, "dump", files / "two.safetensors")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--tensor" in err and "idx, swa" in err


def test_reversed_rows_are_called_empty_not_outside(files, capsys):
    code, _, err = run(capsys, "dump", files / "two.safetensors", "--tensor", "swa", "--rows", "3:1")
    assert code == 2 and "empty" in err and "outside" not in err
    code, _, err = run(capsys, "dump", files / "two.safetensors", "--tensor", "swa", "--rows", "1:9")
    assert code == 2 and "outside 0:4" in err


def test_check_writes_parameters_as_show_does_and_counts_in_english(files, capsys):
    code, out, _ = run(capsys, "check", files / "bad.safetensors")
    assert code == 1 and "{" not in out and "'" not in out
    assert "swa: fp8_ds_mla(head_dim=512, rope_dim=64, page_size=4, profile=tokenspeed), 3 pages: VIOLATIONS" in out
    assert re.search(r"ue8m0_not_ff\s+1 bad page \(first: 2\)$", out, re.M)
    assert re.search(r"pad_zero\s+0 bad pages$", out, re.M)


def test_diff_of_two_layouts_names_them_as_show_does(files, capsys):
    code, out, err = run(capsys, "diff", files / "two.safetensors", files / "other.safetensors", "--tensor", "swa")
    assert code == 2 and out == "" and "{" not in err
    assert "fp8_ds_mla(head_dim=512, rope_dim=64, page_size=4, profile=tokenspeed)" in err
    assert "fp8_ds_mla(head_dim=512, rope_dim=64, page_size=2, profile=tokenspeed)" in err


@pytest.mark.parametrize("command", ["show", "diagram"])
def test_a_multi_gib_page_is_a_usage_error(capsys, command):
    code, out, err = run(capsys, command, "fp8_ds_mla", "--param", "page_size=100000000")
    assert code == 2 and out == "" and err.count("\n") == 1 and "58400000064 B" in err


def test_show_tables_stay_aligned_for_wide_offsets(capsys):
    code, out, _ = run(capsys, "show", "fp8_ds_mla", "--param", "page_size=3000000")
    lines = out.splitlines()
    table = lines[1:lines.index("")]
    header = table[0]
    for column in ("offset", "row B", "page B"):  # right-aligned: every value ends where its header ends
        end = header.index(column) + len(column)
        for line in table[1:]:
            assert line[end - 1] != " " and (end == len(line) or line[end] == " "), (column, line)
    assert code == 0
