"""``kvformats quality`` on tiny shapes: JSON report shape, user activations, usage errors."""

from __future__ import annotations

import json

import pytest
import torch

from kvformats.cli import main
from kvformats.dsv4_layer.quality import recall


def _run(argv, capsys):
    rc = main(argv)
    return rc, capsys.readouterr()


def test_quality_json_tiny_synthetic(capsys, tmp_path):
    rc, cap = _run(["quality", "--tiny", "--json", "--decode", "4", "--out", str(tmp_path / "q.json")], capsys)
    assert rc == 0
    rep = json.loads(cap.out)
    assert rep == json.loads((tmp_path / "q.json").read_text())
    runs = {r["run"]: r for r in rep["rows"]}
    pipe = runs["pipeline, mxfp4_indexer (default profiles)"]
    assert 0 < pipe["swa"] < 0.2 and 0 < pipe["layer"] < 0.2
    assert 0 < pipe["recall"] <= 1
    # the pipeline's MXFP4 cache is written with the default profile: same recall as re-encoding
    assert pipe["recall"] == runs["mxfp4_indexer profile tokenspeed"]["recall"]
    assert rep["tokens_measured"] == 2 * 4


def test_quality_reads_user_activations(capsys, tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    path = tmp_path / "act.safetensors"
    safetensors.save_file({"x": torch.randn(1, 150, 32)}, str(path))
    rc, cap = _run(["quality", "--tiny", "--json", "--decode", "2", "--activations", str(path)], capsys)
    assert rc == 0
    rep = json.loads(cap.out)
    assert rep["config"]["hidden"] == 32 and rep["config"]["requests"] == 1 and rep["input"] == str(path)


def test_quality_usage_errors(capsys, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    rc, cap = _run(["quality", "--tiny", "--activations", str(bad)], capsys)
    assert rc == 2 and "cannot read" in cap.err
    rc, cap = _run(["quality", "--tiny", "--topk", "1000"], capsys)
    assert rc == 2 and "topk" in cap.err


def test_recall_counts_overlap():
    assert recall(torch.tensor([[1, 2, -1]]), torch.tensor([[2, 3, -1]])) == 0.5


def _one_line(rc, cap, *words):
    assert rc == 2 and cap.out == "" and cap.err.startswith("kvformats: error:") and cap.err.count("\n") == 1, cap
    for w in words:
        assert w in cap.err, cap.err


@pytest.fixture
def nothing_runs(monkeypatch):
    """The report and its inputs fail the test if they are reached (and allocate nothing)."""
    import kvformats.dsv4_layer.quality as quality
    import kvformats.dsv4_layer.synthetic as synthetic

    monkeypatch.setattr(synthetic, "activations", lambda *a, **k: pytest.fail("the activations were drawn"))
    monkeypatch.setattr(quality, "report", lambda *a, **k: pytest.fail("the report ran"))


@pytest.mark.parametrize("seed", ["99999999999999999999999", str(-(1 << 63) - 1), str(1 << 64)])
def test_quality_refuses_a_seed_torch_cannot_take(capsys, nothing_runs, seed):
    """Issue 44 item 13: a seed beyond 64 bits was a traceback from torch's generator."""
    rc, cap = _run(["quality", "--tiny", "--seed", seed], capsys)
    _one_line(rc, cap, "--seed", seed)


def test_quality_refuses_a_run_larger_than_the_memory_here(capsys, nothing_runs):
    """``--requests 100000`` (about 20 TB) went on to allocate until the allocator or the machine gave out."""
    rc, cap = _run(["quality", "--requests", "100000"], capsys)
    _one_line(rc, cap, "100000 requests", "memory", "--requests")


def test_quality_sizes_its_run_against_the_memory_available(capsys, nothing_runs, monkeypatch):
    import kvformats.cli.args as args

    monkeypatch.setattr(args, "available_memory", lambda device="cpu": 64 << 20)  # 64 MiB left
    rc, cap = _run(["quality", "--tiny"], capsys)
    _one_line(rc, cap, "0.1 GiB available", "cpu memory")


def test_quality_says_an_allocator_refusal_in_one_line(capsys, monkeypatch):
    import kvformats.dsv4_layer.quality as quality

    def refuse(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 4503599627370496 bytes.")

    monkeypatch.setattr(quality, "report", refuse)
    rc, cap = _run(["quality", "--tiny"], capsys)
    _one_line(rc, cap, "ran out of memory")
    monkeypatch.setattr(quality, "report", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("another failure")))
    with pytest.raises(RuntimeError, match="another failure"):  # any other error is not disguised
        main(["quality", "--tiny"])


def test_quality_says_when_top_k_takes_every_row(capsys):
    """A top-k that covers every compressed row a token sees selects them whatever the scores:
    recall 1.0 says nothing there, and the table says so (issue 44 item 17)."""
    rc, cap = _run(["quality", "--tiny", "--decode", "4", "--topk", "60"], capsys)
    assert rc == 0 and "note: top-k 60 covers every compressed row of some measured tokens" in cap.out
    rc, cap = _run(["quality", "--tiny", "--decode", "4", "--json", "--topk", "60"], capsys)
    assert 0 < json.loads(cap.out)["fewest_visible_rows"] <= 60
    rc, cap = _run(["quality", "--tiny", "--decode", "4"], capsys)  # top-k 8
    assert rc == 0 and "note:" not in cap.out
