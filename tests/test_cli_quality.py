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
