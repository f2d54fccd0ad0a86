"""Golden examples of spec/upstream.md §12 for the DeepSeek V4 operations: F (indexer query MXFP4) byte
for byte, and the pooling numbers of C."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.spec.vectors import load_vector, run_vector, tensor_from_spec
from tests.harness.dsv4_scenarios import state_c

ROOT = Path(__file__).resolve().parents[2]
F_PATH = ROOT / "spec" / "vectors" / "F.json"
F_PACKED = (  # spec/upstream.md §12 F, literal
    "1c b1 09 1c 64 02 3c be 1c 11 c1 ae f7 ba e0 1b ee bc ec 1c 1f 02 c4 be 65 11 4d ae b3 ba 0e 1b "
    "63 00 a4 b0 19 ab c0 92 f9 aa 0b 92 c0 09 2a b0 53 00 10 90 3a 99 0a 01 61 99 a1 01 c2 00 91 90")


def _q_f():
    q = torch.tensor([(((11 * i) % 23) - 11) * 0.0625 for i in range(128)]).to(torch.bfloat16)
    return q.reshape(1, 1, 128)


def test_f_packed_bytes_and_scales_literal():
    (packed, scales), weights = dsv4.prepare_indexer_q_mxfp4(
        _q_f(), torch.tensor([5]), dsv4.cos_sin_cache(64, 8), torch.ones(1, 1), 128 ** -0.5, 1.0)
    want = bytes.fromhex(F_PACKED)
    assert packed.shape == (1, 1, 64) and packed.dtype == torch.uint8
    assert bytes(packed.reshape(-1).tolist()) == want
    assert scales.dtype == torch.int32 and scales.shape == (1, 1)
    assert int(scales[0, 0]) == 0x7E7D7C7C
    assert bytes(scales.view(torch.uint8).reshape(-1).tolist()) == bytes.fromhex("7c7c7d7e")
    assert weights.dtype == torch.float32 and weights.shape == (1, 1)
    assert float(weights[0, 0]) == pytest.approx(128 ** -0.5, rel=1e-7)


def test_f_vector_file_pipeline():
    vec = load_vector(F_PATH)
    pipe = vec["pipeline"]
    ins = {k: tensor_from_spec(v) for k, v in pipe["inputs"].items()}
    cs = dsv4.cos_sin_cache(pipe["cos_sin_cache"]["rope_dim"], pipe["cos_sin_cache"]["max_positions"],
                            pipe["cos_sin_cache"]["base"])
    (packed, scales), weights = dsv4.prepare_indexer_q_mxfp4(ins["index_q"], ins["positions"], cs, ins["weights"],
                                                             pipe["softmax_scale"], pipe["head_scale"])
    exp = pipe["expected"]
    assert bytes(packed.reshape(-1).tolist()).hex() == exp["q_packed"]
    assert torch.equal(scales, tensor_from_spec(exp["q_scale"]))
    assert weights.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes().hex() == exp["weights"]


def test_f_vector_file_generic_harness():
    """F is also a plain encode vector (x = the Hadamard output), so the generic harness runs it."""
    assert [c for c in run_vector(load_vector(F_PATH)) if not c.ok] == []


def test_c_state_rows():
    rows = state_c().reshape(8, 8)
    assert torch.allclose(rows[0], torch.tensor([0, 1, 2, 3, 0, 0.11, 0.22, 0.33]), atol=1e-7)
    assert torch.allclose(rows[5], torch.tensor([2.5, 3.5, 4.5, 5.5, 0.10, 0.21, 0.32, 0.43]), atol=1e-7)


def test_c_pooling_numbers():
    out = dsv4.pool_compressor_state(state_c(), ratio=4, positions=torch.tensor([3, 7]),
                                     req_indices=torch.tensor([0, 0]), block_table=torch.tensor([[0, 1]]),
                                     rms_weight=torch.tensor([1.0, 0.5]), rms_eps=1e-6)
    want = torch.tensor([[0.83951861, 0.56903607], [0.83646274, 0.57016009]], dtype=torch.float64)
    assert (out.double() - want).abs().max().item() < 2e-7
