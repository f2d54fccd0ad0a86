"""The Triton kernels of the DeepSeek V4 query / output side (swa_insert, the indexer query preps,
inv_rope_fp8_quant, hadamard_transform) against the reference implementations.

Without CUDA the launchers run under the Triton interpreter (conftest sets TRITON_INTERPRET) on
small CPU tensors: adversarial values (zeros, -0.0, huge, tiny, rounding ties, NaN / Inf),
several positions, sentinel-filled padded caches. The ``gpu`` tests run the public API with
backend="triton" at production sizes, both e4m3 paths, and CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4 import query as rq
from kvformats.deepseek_v4 import swa as rs
from kvformats.deepseek_v4.transforms import hadamard_reference
from kvformats.errors import BackendUnavailableError
from kvformats.numerics import codes as nx
from kvformats.testing.strategies import storage_bytes

triton = pytest.importorskip("triton")
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels.dsv4 import query as kq
from kvformats_kernels.dsv4 import query_jit as qj
from kvformats_kernels.dsv4 import swa as ks

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SENTINEL = 0xA5


# ----------------------------------------------------------------------------- inputs

def values(shape, seed: int, dtype=torch.bfloat16, nonfinite: bool = False, huge: bool = True) -> torch.Tensor:
    """Rows (by row index mod 9) at magnitudes 1e-38 .. 1e30; of zeros; of -0.0 and 0.0; tiny
    (bf16 subnormals); with ``huge``, ±3e38 (sums overflow; else random); a few large among
    small values; on bf16 rounding ties (half a bf16 ulp above bf16 values, for float32 input);
    with ``nonfinite``, one NaN or Inf in rows 7 mod 9. On the CPU; callers move it.

    Without huge and nonfinite rows every value on the way stays finite, so the kernels that
    redo non-finite programs the long way keep to their fast path: tests run both data sets."""
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    rows = max(1, torch.Size(shape[:-1]).numel())
    kind = (torch.arange(rows) % 9)[:, None]
    noise = torch.randn(rows, d, generator=g)
    x = noise * 10.0 ** torch.randint(-38, 31, (rows, 1), generator=g).float()
    x = torch.where(kind == 1, 0.0, x)
    x = torch.where(kind == 2, torch.where(torch.rand(rows, d, generator=g) < 0.5, -0.0, 0.0), x)
    x = torch.where(kind == 3, noise * 1e-39, x)
    if huge:
        x = torch.where(kind == 4, noise.sign() * 3e38, x)
    few = torch.where(torch.arange(d)[None, :] % max(1, d // 5) == 0, 1e4, noise * 1e-3)
    x = torch.where(kind == 5, few, x)
    ties = (noise.to(torch.bfloat16).float().view(torch.int32) | 0x8000).view(torch.float32)
    x = torch.where(kind == 6, ties, x)
    top = torch.finfo(dtype).max
    x = x.clamp(-top, top).to(dtype)
    if nonfinite:
        bad = torch.arange(rows)[torch.arange(rows) % 9 == 7]
        col = torch.randint(0, d, (bad.numel(),), generator=g)
        x[bad, col] = torch.where(bad % 2 == 1, float("nan"), float("inf")).to(dtype)
    return x.reshape(shape)


def same_e4m3(a: torch.Tensor, b: torch.Tensor) -> None:
    """e4m3 bytes equal, any NaN byte (0x7F / 0xFF) matching any other (spec/nan-policy.md §1.3)."""
    a, b = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    nan_a, nan_b = (a & 0x7F) == 0x7F, (b & 0x7F) == 0x7F
    assert torch.equal(nan_a, nan_b)
    assert torch.equal(a[~nan_a], b[~nan_b])


def same_cache(a: torch.Tensor, b: torch.Tensor, nans: int = 0) -> None:
    """Cache storages equal byte for byte, except at most ``nans`` e4m3 NaN bytes whose sign
    differs (0x7F against 0xFF: a NaN's sign is not specified)."""
    a, b = storage_bytes(a), storage_bytes(b)
    differ = a != b
    nan_sign = differ & ((a & 0x7F) == 0x7F) & ((b & 0x7F) == 0x7F)
    assert torch.equal(differ, nan_sign) and int(nan_sign.sum()) <= nans


def same_bf16(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = a.reshape(-1).float(), b.reshape(-1).float()
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    keep = ~torch.isnan(a)
    assert torch.equal(a[keep].view(torch.int32), b[keep].view(torch.int32))


def rope_table(rope: int = 64, n: int = 300):
    return dsv4.cos_sin_cache(rope, n).to(DEV)


# ----------------------------------------------------------------------------- element helpers

@triton.jit
def _helper_kernel(x_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    r = nj.e2m1_code_short(x) if OP == 0 else qj.e4m3_finite(x)
    tl.store(out_ptr + offs, r, mask=offs < n)


def _helper(op: int, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.int32, device=x.device)
    _helper_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), OP=op, BLOCK=4096)
    return out


def test_e2m1_code_short_on_every_scaled_bf16_value():
    """Every bf16 value below 7 in magnitude (what a block scaled by its exponent holds)."""
    x = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    x = x[x.abs() < 7]
    th = torch.tensor(nx.E2M1_THRESHOLDS)
    x = torch.cat([x, th, -th]).to(DEV)
    assert torch.equal(_helper(0, x).cpu(), nx.e2m1_encode(x.cpu()).to(torch.int32))


def test_e4m3_finite_matches_numerics():
    g = torch.Generator().manual_seed(3)
    bf = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    rand = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 16,), generator=g, dtype=torch.int64).to(torch.int32)
    grid = nx.e4m3_decode(torch.arange(0, 0x7F, dtype=torch.uint8))
    x = torch.cat([bf, rand.view(torch.float32), (grid[1:] + grid[:-1]) / 2, torch.tensor([float("inf"), -1e39])])
    x = x[~torch.isnan(x)]
    assert torch.equal(_helper(1, x.to(DEV)).cpu(), nx.e4m3_encode(x).to(torch.int32))


def _single_value_rows(bits: torch.Tensor, heads: int = 64):
    """One row per bf16 pattern: the value at dim 0 (NoPE), zeros elsewhere, so that every output
    of the Hadamard transform is +-v * 128^-0.5 and each block's maximum is bf16(|v| 128^-0.5):
    every 8-bit significand at every exponent, the floor, the rule's boundaries (1.5 * 2^k) and
    the largest exponents a finite row reaches (e = 122: the fast path's limit, 2^-e * 128^-0.5
    below 2^-126, lies beyond them)."""
    n = -(-bits.numel() // heads) * heads
    q = torch.zeros(n, 128, dtype=torch.int16)
    q[:bits.numel(), 0] = bits.to(torch.int16)
    return q.view(torch.bfloat16).reshape(n // heads, heads, 128)


def _mxfp4_rows_agree(q):
    t = q.shape[0]
    pos = torch.arange(t, dtype=torch.int64) % 300
    args = (q.to(DEV), pos.to(DEV), rope_table(64), torch.ones(q.shape[:2], device=DEV), 128 ** -0.5, 1.0)
    (p, s), _ = kq.prepare_indexer_q_mxfp4(*args)
    (rp, rs_), _ = rq.prepare_indexer_q_mxfp4_reference(*args)
    assert torch.equal(s, rs_)
    assert torch.equal(p, rp)


def test_prepare_indexer_q_mxfp4_single_value_rows():
    """Positive and negative values at the floor, at 1.5 * 2^k and its neighbours, and at the
    top of the range (a subset: the interpreter is slow; the GPU test takes every pattern)."""
    k = torch.arange(0, 0x80, dtype=torch.int32)
    bits = torch.cat([k + (e << 7) for e in (0x60, 0x71, 0x80, 0x81, 0xFC, 0xFD, 0xFE)])
    _mxfp4_rows_agree(_single_value_rows(torch.cat([bits, bits | 0x8000]), heads=32))


@gpu
@pytest.mark.gpu
def test_gpu_prepare_indexer_q_mxfp4_every_single_value_row():
    bits = torch.arange(0, 0x7F80, dtype=torch.int32)
    _mxfp4_rows_agree(_single_value_rows(torch.cat([bits, bits | 0x8000])))


# ----------------------------------------------------------------------------- swa_insert

def _swa_case(t, heads, d, rope, page_size, pages, slots, dtype, seed, nonfinite=False):
    q = values((t, heads, d), seed, dtype, nonfinite).to(DEV)
    kv = values((t, d), seed + 1, dtype).to(DEV)
    if nonfinite:  # NaN / Inf in the kv NoPE dims only: a NaN tail's bf16 payload is not specified
        kv[0, 3], kv[2, 70] = float("nan"), float("-inf")
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 300, (t,), generator=g).to(DEV)
    layout = kvf.Fp8DsMla(head_dim=d, rope_dim=rope, page_size=page_size)
    caches = []
    for _ in range(2):
        c = layout.allocate(pages, page_stride=layout.page_bytes + 40).to(DEV)
        storage_bytes(c).fill_(SENTINEL)
        caches.append(c)
    s = torch.tensor(slots, dtype=torch.int64 if seed % 2 else torch.int32).to(DEV)
    return q, kv, caches, s, pos, rope_table(rope), layout


def _q_agreement(got: torch.Tensor, want: torch.Tensor) -> float:
    """Fraction of q elements whose bits differ from the reference's. Each may differ by one bf16
    ulp of the row's largest value at most: the kernel sums x^2 in another order, so the RMS
    factor, and after RoPE's products and subtraction the result, may move by a float32 ulp."""
    g, w = got.reshape(-1, got.shape[-1]).float(), want.reshape(-1, want.shape[-1]).float()
    nan = torch.isnan(w)
    assert torch.equal(torch.isnan(g), nan)
    g, w = g.masked_fill(nan, 0), w.masked_fill(nan, 0)
    top = w.abs().amax(dim=1, keepdim=True)
    assert bool(((g - w).abs() <= top * 2.0**-8).all())
    return float((g.view(torch.int32) != w.view(torch.int32)).float().mean())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("geometry", [(512, 64, 4), (256, 64, 3), (352, 32, 2)])
def test_swa_insert_matches_reference(dtype, geometry):
    d, rope, page_size = geometry
    t, heads, pages = 7, 3, 2
    cap = pages * page_size
    slots = [0, cap + 5, -1, cap - 1, 2, cap, 1][: t - 1]  # -1 and beyond the cache: skipped; token 6 has none
    q, kv, (c_tri, c_ref), s, pos, cs, layout = _swa_case(t, heads, d, rope, page_size, pages, slots, dtype,
                                                          seed=d + rope, nonfinite=True)
    q_tri, q_ref = q.clone(), q.clone()
    ks.swa_insert(q_tri, kv, c_tri, C.ds_mla_layout(c_tri, d, rope, page_size), s, pos, cs, 1e-6)
    rs.swa_insert_reference(q_ref, kv, c_ref, C.ds_mla_layout(c_ref, d, rope, page_size), s, pos, cs, 1e-6)
    same_cache(c_tri, c_ref, nans=1)
    assert int((storage_bytes(c_tri) != SENTINEL).sum()) <= 4 * layout.row_bytes
    frac = _q_agreement(q_tri, q_ref)
    if dtype == torch.bfloat16:  # float32 q keeps the last bits, so most of it may differ
        assert frac < 0.05, f"q differs from the reference in {frac:.2%} of its elements"


def test_swa_insert_unaligned_bf16_q_and_strided_kv():
    """q whose rows start at odd bf16 offsets (no int32 pairs) and kv rows with a padded stride."""
    t, heads, d, rope = 5, 2, 512, 64
    q, kv, (c_tri, c_ref), s, pos, cs, _ = _swa_case(t, heads, d, rope, 4, 2, [1, 6, -1, 0, 7],
                                                          torch.bfloat16, seed=11)
    arena = torch.zeros(q.numel() + 1, dtype=torch.bfloat16, device=DEV)
    q_tri = arena[1:].view(t, heads, d)
    q_tri.copy_(q)
    kv_wide = torch.zeros(t, d + 6, dtype=kv.dtype, device=DEV)
    kv_wide[:, 2:2 + d] = kv
    kvs = kv_wide[:, 2:2 + d]
    q_ref = q.clone()
    ks.swa_insert(q_tri, kvs, c_tri, C.ds_mla_layout(c_tri, d, rope, 4), s, pos, cs, 1e-6)
    rs.swa_insert_reference(q_ref, kv, c_ref, C.ds_mla_layout(c_ref, d, rope, 4), s, pos, cs, 1e-6)
    same_cache(c_tri, c_ref)
    assert _q_agreement(q_tri, q_ref) < 0.05


# ----------------------------------------------------------------------------- indexer query preps

def _indexer_inputs(t, heads, seed, dtype=torch.bfloat16, rope=64, nonfinite=True):
    """nonfinite: NaN / Inf / overflowing rows (the exact path); else finite values only (the
    fast path)."""
    q = values((t, heads, 128), seed, dtype, nonfinite, huge=nonfinite).to(DEV)
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 300, (t,), generator=g)
    pos[0] = 0
    w = (torch.randn(t, heads, 1, generator=g) * 3).to(DEV)
    return q, pos.to(torch.int32 if seed % 2 else torch.int64).to(DEV), rope_table(rope), w


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("dtype,rope", [(torch.bfloat16, 64), (torch.float32, 64), (torch.float16, 32),
                                        (torch.bfloat16, 128)])
def test_prepare_indexer_q_mxfp4_matches_reference(dtype, rope, nonfinite):
    q, pos, cs, w = _indexer_inputs(5, 40, seed=rope, dtype=dtype, rope=rope, nonfinite=nonfinite)
    args = (q, pos, cs, w.squeeze(-1), 128 ** -0.5, 40 ** -0.5)
    (p, s), wo = kq.prepare_indexer_q_mxfp4(*args)
    (rp, rs_), rwo = rq.prepare_indexer_q_mxfp4_reference(*args)
    assert torch.equal(p, rp) and torch.equal(s, rs_)
    assert torch.equal(wo.view(torch.int32), rwo.view(torch.int32))
    # the data met the e2m1 ties (a magnitude on a threshold after scaling by the block exponent)
    rot = hadamard_reference(dsv4.rope_tail(q, pos, cs), 128 ** -0.5).float().reshape(-1, 4, 32)
    e = rq._MXFP4.scale_rule.exponents(rot)
    scaled = (rot * nx.pow2(-e).unsqueeze(-1)).abs()
    assert int(torch.isin(scaled, torch.tensor(nx.E2M1_THRESHOLDS, device=DEV)).sum()) > 0


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prepare_indexer_q_fp8_matches_reference(dtype, nonfinite):
    q, pos, cs, w = _indexer_inputs(4, 33, seed=8, dtype=dtype, nonfinite=nonfinite)
    w = w.squeeze(-1).to(torch.bfloat16)  # bf16 weights, read as bits
    args = (q, pos, cs, w, 0.125, 3.0)
    f, wo = kq.prepare_indexer_q_fp8(*args)
    rf, rwo = rq.prepare_indexer_q_fp8_reference(*args)
    same_e4m3(f, rf)
    assert torch.equal(wo.view(torch.int32), rwo.view(torch.int32))


@pytest.mark.parametrize("mxfp4", [True, False])
def test_prepare_indexer_q_nan_bits_that_carry_into_the_sign(mxfp4):
    """float32 NaN 0x7FFFFFFF (what GPU arithmetic makes) in the NoPE and RoPE dims: rounded
    without a NaN test it would become -0.0, so these rows must take the exact path."""
    q, pos, cs, w = _indexer_inputs(3, 4, seed=5, dtype=torch.float32, nonfinite=False)
    nan = torch.tensor(0x7FFFFFFF, dtype=torch.int32).view(torch.float32)
    q[0, 1, 5], q[1, 2, 100], q[2, 0, 64] = nan, nan, -nan
    fn, ref = ((kq.prepare_indexer_q_mxfp4, rq.prepare_indexer_q_mxfp4_reference) if mxfp4 else
               (kq.prepare_indexer_q_fp8, rq.prepare_indexer_q_fp8_reference))
    got, want = fn(q, pos, cs, w, 1.0, 1.0), ref(q, pos, cs, w, 1.0, 1.0)
    if mxfp4:
        assert torch.equal(got[0][0], want[0][0]) and torch.equal(got[0][1], want[0][1])
    else:
        same_e4m3(got[0], want[0])


def test_prepare_indexer_q_strided_unaligned_input():
    """index_q as a view at an odd element offset with padded head and token strides."""
    q, pos, cs, w = _indexer_inputs(3, 5, seed=21)
    wide = torch.zeros(3, 6, 131, dtype=q.dtype, device=DEV)
    wide[:, :5, 1:129] = q
    view = wide[:, :5, 1:129]
    (p, s), _ = kq.prepare_indexer_q_mxfp4(view, pos, cs, w.squeeze(-1), 1.0, 1.0)
    (rp, rs_), _ = rq.prepare_indexer_q_mxfp4_reference(q, pos, cs, w.squeeze(-1), 1.0, 1.0)
    assert torch.equal(p, rp) and torch.equal(s, rs_)


# ----------------------------------------------------------------------------- inv_rope_fp8_quant

def _scale_storage(s: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=s.dtype, device=s.device).set_(s.untyped_storage())


def _check_inv_rope(got, want):
    same_e4m3(got[0], want[0])
    assert got[0].shape == want[0].shape and got[0].transpose(0, 1).is_contiguous()
    assert got[1].shape == want[1].shape and got[1].stride() == want[1].stride()
    assert torch.equal(_scale_storage(got[1]), _scale_storage(want[1]))  # padding tokens: zeros


@pytest.mark.parametrize("t,groups,hpg,d,group,rope,dtype", [
    (5, 2, 3, 512, 128, 64, torch.bfloat16),
    (7, 1, 2, 512, 128, 64, torch.float32),
    (3, 2, 1, 384, 128, 64, torch.bfloat16),  # 3 groups per head
    (6, 1, 2, 96, 32, 16, torch.float16),
    (1, 1, 1, 512, 64, 64, torch.bfloat16),  # the tail fills the last group
])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_inv_rope_fp8_quant_matches_reference(t, groups, hpg, d, group, rope, dtype, nonfinite):
    o = values((t, groups * hpg, d), seed=d + t, dtype=dtype, nonfinite=nonfinite).to(DEV)
    g = torch.Generator().manual_seed(t)
    pos = torch.randint(0, 300, (t,), generator=g).to(DEV)
    cs = rope_table(rope)
    for tma in ([True, False] if d // group == 4 else [False]):
        args = (o, pos, cs, groups, hpg, group, tma)
        _check_inv_rope(kq.inv_rope_fp8_quant(*args), rq.inv_rope_fp8_quant_reference(*args))


def test_inv_rope_fp8_quant_unaligned_and_refused_shapes():
    """A bf16 view at an odd offset (element loads), and group sizes the kernel leaves to the
    reference (not a power of two; the tail wider than a group): the launcher refuses them."""
    t, d = 5, 512
    o = values((t, 2, d), seed=5).to(DEV)
    arena = torch.zeros(o.numel() + 1, dtype=o.dtype, device=DEV)
    view = arena[1:].view(t, 2, d)
    view.copy_(o)
    pos, cs = torch.arange(t).to(DEV) * 7, rope_table()
    _check_inv_rope(kq.inv_rope_fp8_quant(view, pos, cs, 1, 2, 128, True),
                    rq.inv_rope_fp8_quant_reference(o, pos, cs, 1, 2, 128, True))
    for group in (96, 32):
        args = (o[:, :, :384], pos, cs, 2, 1, group, False)
        assert kq.inv_rope_fp8_quant.unsupported(*args)
        with pytest.raises(BackendUnavailableError, match=f"quant_group_size {group}"):
            kq.inv_rope_fp8_quant(*args)


# ----------------------------------------------------------------------------- hadamard_transform

@pytest.mark.parametrize("d,dtype", [(d, dt) for d in (1, 2, 8, 64, 128, 256)
                                     for dt in (torch.bfloat16, torch.float32, torch.float16)]
                         + [(1024, torch.bfloat16)])
def test_hadamard_transform_matches_reference(d, dtype):
    x = values((3, 11, d), seed=d, dtype=dtype, nonfinite=True).to(DEV)
    for scale in (d ** -0.5, 1.0, 0.3):
        got = kq.hadamard_transform(x, scale)
        assert got.dtype == torch.bfloat16 and got.shape == x.shape
        same_bf16(got, hadamard_reference(x, scale))


def test_hadamard_transform_refuses_wide_rows():
    x = values((2, 2048), seed=1).to(DEV)
    with pytest.raises(BackendUnavailableError, match="rows of 2048 elements"):
        kq.hadamard_transform(x, 1.0)


# ----------------------------------------------------------------------------- GPU, public API

@pytest.fixture
def hw_e4m3(request, launch_settings):
    launch_settings("hw_e4m3", "enabled", request.param)
    return request.param


@gpu
@pytest.mark.gpu
def test_gpu_swa_insert_production_size():
    t, heads, d, rope, page_size, pages = 1024, 64, 512, 64, 64, 12
    g = torch.Generator().manual_seed(0)
    slots = torch.randperm(pages * page_size + 40, generator=g)[:t] - 20  # negatives and beyond the cache
    q, kv, (c_tri, c_ref), s, pos, cs, _ = _swa_case(t, heads, d, rope, page_size, pages, slots.tolist()[:t - 24],
                                                          torch.bfloat16, seed=2)
    q_tri, q_ref = q.clone(), q.clone()
    dsv4.swa_insert(q_tri, kv, c_tri, s, pos, cs, 1e-6, backend="triton")
    dsv4.swa_insert(q_ref, kv, c_ref, s, pos, cs, 1e-6, backend="reference")
    same_cache(c_tri, c_ref)
    frac = _q_agreement(q_tri, q_ref)
    print(f"swa_insert q: {frac:.2e} of the elements one bf16 ulp from the reference")
    assert frac < 1e-3


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("hw_e4m3", [False, True], indirect=True)
def test_gpu_indexer_q_production_size(hw_e4m3, nonfinite):
    q, pos, cs, w = _indexer_inputs(2048, 64, seed=4, nonfinite=nonfinite)
    for fn in (dsv4.prepare_indexer_q_mxfp4, dsv4.prepare_indexer_q_fp8):
        got = fn(q, pos, cs, w, 128 ** -0.5, 64 ** -0.5, backend="triton")
        want = fn(q, pos, cs, w, 128 ** -0.5, 64 ** -0.5, backend="reference")
        if fn is dsv4.prepare_indexer_q_mxfp4:
            assert torch.equal(got[0][0], want[0][0]) and torch.equal(got[0][1], want[0][1])
        else:
            same_e4m3(got[0], want[0])
        assert torch.equal(got[1], want[1])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("hw_e4m3", [False, True], indirect=True)
@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_gpu_inv_rope_fp8_quant_production_size(hw_e4m3, tma, nonfinite):
    t = 1027
    o = values((t, 8 * 16, 512), seed=9, nonfinite=nonfinite, huge=nonfinite).to(DEV)
    pos = torch.randint(0, 300, (t,), generator=torch.Generator().manual_seed(1)).to(DEV)
    cs = rope_table()
    kw = dict(n_groups=8, heads_per_group=16, tma_aligned_scales=tma)
    _check_inv_rope(dsv4.inv_rope_fp8_quant(o, pos, cs, backend="triton", **kw),
                    dsv4.inv_rope_fp8_quant(o, pos, cs, backend="reference", **kw))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 512, 1024])
def test_gpu_hadamard_transform(d):
    x = values((4096, d), seed=d, nonfinite=True).to(DEV)
    same_bf16(dsv4.hadamard_transform(x, backend="triton"), dsv4.hadamard_transform(x, backend="reference"))


def _flat(r) -> list:
    return [u for v in r for u in (_flat(v) if isinstance(v, tuple) else [v])]


@gpu
@pytest.mark.gpu
def test_gpu_cuda_graph_replay_equals_eager():
    t, heads = 64, 64
    q, kv, (c_eager, c_graph), s, pos, cs, _ = _swa_case(t, heads, 512, 64, 64, 2, [-1] * 8 + list(range(56)),
                                                              torch.bfloat16, seed=6)
    qi, _, _, w = _indexer_inputs(t, heads, seed=6, nonfinite=False)
    o = values((t, 128, 512), seed=7).to(DEV)
    x = values((t * heads, 128), seed=8).to(DEV)
    q_eager, q_graph = q.clone(), q.clone()

    def run(qq, cache):
        dsv4.swa_insert(qq, kv, cache, s, pos, cs, 1e-6, backend="triton", check=False)
        return (dsv4.prepare_indexer_q_mxfp4(qi, pos, cs, w, 0.1, 0.2, backend="triton"),
                dsv4.prepare_indexer_q_fp8(qi, pos, cs, w, 0.1, 0.2, backend="triton"),
                dsv4.inv_rope_fp8_quant(o, pos, cs, n_groups=8, heads_per_group=16, backend="triton"),
                dsv4.inv_rope_fp8_quant(o, pos, cs, n_groups=8, heads_per_group=16, tma_aligned_scales=False,
                                        backend="triton"),
                dsv4.hadamard_transform(x, backend="triton"))

    eager = run(q_eager, c_eager)
    run(q_graph.clone(), c_graph)  # compile outside the capture
    storage_bytes(c_graph).fill_(SENTINEL)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(q_graph, c_graph)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q_graph.view(torch.int16), q_eager.view(torch.int16))
    assert torch.equal(storage_bytes(c_graph), storage_bytes(c_eager))
    for a, b in zip(_flat(captured), _flat(eager)):
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
