"""RoPE, Hadamard, RMSNorm, the SWA insert, the indexer query preps and the inverse-RoPE FP8
output quantization, each against a plain-Python loop oracle."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import kvformats as kvf
import kvformats.deepseek_v4.rope
from kvformats import deepseek_v4 as dsv4
from tests.harness import dsv4_oracle as orc
from tests.harness.dsv4_scenarios import SENTINEL, sentinel_cache
from kvformats.testing.strategies import storage_bytes

_spec = importlib.util.spec_from_file_location(
    "kvf_vector_oracle", Path(__file__).resolve().parents[2] / "spec" / "vectors" / "oracle.py")
vo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vo)


def _bf16(values) -> list[float]:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32).to(torch.bfloat16).double().tolist()


def test_rope_is_the_library_rope():
    assert dsv4.rope_tail is kvformats.deepseek_v4.rope.rope_tail and dsv4.cos_sin_cache is kvformats.deepseek_v4.rope.cos_sin_cache


@pytest.mark.parametrize("inverse", [False, True])
def test_rope_tail_matches_loop(inverse):
    g = torch.Generator().manual_seed(1)
    x, cs = torch.randn(5, 3, 128, generator=g), dsv4.cos_sin_cache(64, 50)
    pos = torch.tensor([0, 7, 49, 3, 21])
    got = dsv4.rope_tail(x, pos, cs, inverse=inverse)
    table = orc.nested(cs)
    for t in range(5):
        for h in range(3):
            want = orc.rope(orc.nested(x[t, h]), int(pos[t]), table, inverse)
            assert torch.allclose(got[t, h].double(), torch.tensor(want, dtype=torch.float64), atol=1e-6)


def test_hadamard_exact_on_small_integers():
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-40, 41, (6, 128), generator=g).float() * 0.25
    got = dsv4.hadamard_transform(x)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    for i in range(6):
        assert got[i].double().tolist() == _bf16(orc.hadamard(x[i].double().tolist()))


def test_hadamard_random_within_one_bf16_ulp_and_self_inverse():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 128, generator=g).to(torch.bfloat16)
    got = dsv4.hadamard_transform(x).double()
    want = torch.tensor([orc.hadamard(r) for r in x.double().tolist()], dtype=torch.float64)
    assert ((got - want).abs() <= want.abs() * 2 ** -8 + 1e-30).all()
    back = dsv4.hadamard_transform(got.float())
    assert torch.allclose(back.double(), x.double(), rtol=2 ** -6, atol=2 ** -7)


def test_rms_norm_matches_loop():
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(4, 96, generator=g), torch.randn(96, generator=g)
    got = dsv4.rms_norm(x, w, 1e-6)
    for i in range(4):
        want = torch.tensor(orc.rms(x[i].double().tolist(), 1e-6, w.double().tolist()), dtype=torch.float64)
        assert torch.allclose(got[i].double(), want, rtol=1e-5, atol=1e-6)


# ----- SWA insert -------------------------------------------------------------------------------
def _swa_inputs(t=6, heads=2, d=512, seed=5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, heads, d, generator=g).to(torch.bfloat16)
    kv = torch.randn(t, d, generator=g).to(torch.bfloat16)
    return q, kv, torch.tensor([5, 64, 65, 200, 3, 9])[:t], dsv4.cos_sin_cache(64, 256)


def test_swa_insert_q_matches_loop():
    q, kv, pos, cs = _swa_inputs()
    layout = kvf.Fp8DsMla(page_size=64)
    cache = sentinel_cache(layout, 2)
    q0 = q.clone()
    out = dsv4.swa_insert(q, kv, cache, torch.tensor([0, 70, -1, 5]), pos, cs, 1e-6)
    assert out is q
    table = orc.nested(cs)
    for t in range(q.shape[0]):  # tokens 4, 5 lie beyond len(slots): q is still processed
        for h in range(q.shape[1]):
            want = orc.rope(orc.rms(q0[t, h].double().tolist(), 1e-6), int(pos[t]), table)
            assert torch.allclose(q[t, h].double(), torch.tensor(_bf16(want), dtype=torch.float64), rtol=2 ** -7, atol=1e-3)
    exact = dsv4.rope_tail(dsv4.rms_norm(q0, None, 1e-6), pos, cs).to(torch.bfloat16)
    assert torch.equal(q, exact)


def test_swa_insert_cache_bytes_and_skips():
    q, kv, pos, cs = _swa_inputs()
    layout = kvf.Fp8DsMla(page_size=64)
    cache = sentinel_cache(layout, 2)
    slots = torch.tensor([0, 70, -1, 128, 127])  # -1 and 128 (beyond 2 pages) are skipped
    dsv4.swa_insert(q, kv, cache, slots, pos, cs, 1e-6)
    want_cache = sentinel_cache(layout, 2)
    x = dsv4.rope_tail(kv, pos, cs).to(torch.bfloat16)
    keep = torch.tensor([0, 1, 4])
    layout.encode(x[keep], want_cache, slots[keep])
    assert torch.equal(storage_bytes(cache), storage_bytes(want_cache))
    # the row of token 0 against the independent oracle (rope in float32, bf16, ds_mla row)
    xo = [vo.bf16(v) for v in vo.rope_gptj(kv[0].double().tolist(), int(pos[0]))]
    row, _ = vo.ds_mla_row(xo, 512, 64)
    assert bytes(layout.gather(cache, slots[:1])[0].tolist()) == row
    assert int((storage_bytes(cache) != SENTINEL).sum()) <= 3 * layout.row_bytes


# ----- indexer query prep -----------------------------------------------------------------------
def _q_inputs(t=3, heads=4, seed=6):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, heads, 128, generator=g).to(torch.bfloat16)
    return q, torch.tensor([0, 17, 63])[:t], dsv4.cos_sin_cache(64, 64), torch.rand(t, heads, 1, generator=g)


def test_prepare_indexer_q_mxfp4_matches_oracle():
    q, pos, cs, w = _q_inputs()
    (packed, scales), wout = dsv4.prepare_indexer_q_mxfp4(q, pos, cs, w, 128 ** -0.5, 4 ** -0.5)
    assert packed.shape == (3, 4, 64) and scales.shape == (3, 4) and scales.dtype == torch.int32
    rot = dsv4.hadamard_transform(dsv4.rope_tail(q, pos, cs))
    for t in range(3):
        for h in range(4):
            row, _ = vo.mxfp4_row(rot[t, h].double().tolist())  # independent MXFP4 oracle
            assert bytes(packed[t, h].tolist()) == row[:64]
            assert int(scales[t, h]) & 0xFFFFFFFF == int.from_bytes(row[64:], "little")
    want_w = w.squeeze(-1).double() * 128 ** -0.5 * 0.5
    assert torch.allclose(wout.double(), want_w, rtol=1e-6) and wout.dtype == torch.float32


def test_prepare_indexer_q_fp8_matches_oracle_and_saturates():
    q, pos, cs, w = _q_inputs()
    qf, wout = dsv4.prepare_indexer_q_fp8(q, pos, cs, w[..., 0], 128 ** -0.5, 1.0)
    assert qf.dtype == torch.float8_e4m3fn and qf.shape == (3, 4, 128)
    rot = dsv4.hadamard_transform(dsv4.rope_tail(q, pos, cs)).float().numpy()
    want = rot.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(qf.view(torch.uint8).numpy(), want)
    big = torch.full((1, 1, 128), 0.0, dtype=torch.bfloat16)
    big[0, 0, 0] = 20000.0  # Hadamard spreads it: every output is ±20000/sqrt(128) ≈ ±1768 > 448
    qb, _ = dsv4.prepare_indexer_q_fp8(big, torch.tensor([0]), cs, torch.ones(1, 1), 1.0, 1.0)
    assert set(qb.view(torch.uint8).reshape(-1).tolist()) <= {0x7E, 0xFE}


# ----- inverse RoPE + FP8 output quant ----------------------------------------------------------
def _inv_rope_oracle(o, pos, cs):
    """Per (t, head, group): (bytes, exponent) from float32 inverse rope + the independent e4m3."""
    t_n, heads, d = o.shape
    cos, sin = cs.numpy(), cs.numpy()
    out_b, out_e = np.zeros((t_n, heads, d), np.uint8), np.zeros((t_n, heads, d // 128), np.int64)
    for t in range(t_n):
        c, s = cos[int(pos[t]), :32], sin[int(pos[t]), 32:]
        for h in range(heads):
            x = o[t, h].float().numpy().copy()
            e_, o_ = x[448::2].copy(), x[449::2].copy()
            x[448::2] = e_ * c + o_ * s
            x[449::2] = o_ * c - e_ * s
            for gi in range(d // 128):
                blk = [float(v) for v in x[128 * gi:128 * gi + 128]]
                e = vo.exponent(max(abs(v) for v in blk), 448.0, 1e-10, "absmax")
                out_e[t, h, gi] = e
                out_b[t, h, 128 * gi:128 * gi + 128] = [vo.e4m3_byte(v * 2.0 ** -e) for v in blk]
    return out_b, out_e


@pytest.mark.parametrize("tma", [True, False])
def test_inv_rope_fp8_quant_matches_loop(tma):
    g = torch.Generator().manual_seed(7)
    t, groups, hpg = 5, 2, 3
    o = (torch.randn(t, groups * hpg, 512, generator=g) * 3).to(torch.bfloat16)
    o[1, 2, :128] = 0  # an all-zero group: floor 1e-10
    pos, cs = torch.tensor([0, 5, 33, 7, 100]), dsv4.cos_sin_cache(64, 128)
    q, scales = dsv4.inv_rope_fp8_quant(o, pos, cs, n_groups=groups, heads_per_group=hpg, tma_aligned_scales=tma)
    want_b, want_e = _inv_rope_oracle(o, pos, cs)
    assert q.shape == (t, groups, hpg * 512) and q.dtype == torch.float8_e4m3fn
    assert q.transpose(0, 1).is_contiguous()
    assert np.array_equal(q.reshape(t, groups * hpg, 512).view(torch.uint8).numpy(), want_b)
    t_pad = 8
    assert scales.stride(0) == 1 and scales.untyped_storage().nbytes() == groups * scales.shape[2] * t_pad * 4
    full = torch.empty(0, dtype=scales.dtype).set_(scales.untyped_storage()).reshape(groups, scales.shape[2], t_pad)
    assert torch.equal(full[:, :, t:], torch.zeros_like(full[:, :, t:]))  # padding tokens zero
    if tma:
        assert scales.shape == (t, groups, hpg) and scales.dtype == torch.int32
        raw = scales.contiguous().view(torch.uint8).reshape(t, groups * hpg, 4).numpy()
        assert np.array_equal(raw.astype(np.int64), want_e + 127)
    else:
        assert scales.shape == (t, groups, hpg * 4) and scales.dtype == torch.float32
        assert np.array_equal(scales.reshape(t, groups * hpg, 4).numpy(), (2.0 ** want_e).astype(np.float32))
    assert math.isclose(2.0 ** float(want_e[1, 2, 0]), 2.0 ** math.ceil(math.log2(1e-10 / 448)))
