"""Element codecs and scale rules against independent oracles (ml_dtypes, torch dtypes, float64
math). spec/upstream.md §0, §2.2, §3.2, §4.2-§4.3, §7."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import kvformats as kvf
from kvformats.numerics import codes as nx

ALL_BYTES = torch.arange(256, dtype=torch.int32).to(torch.uint8)
ALL_BF16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
FINITE_BF16 = ALL_BF16[torch.isfinite(ALL_BF16)]
POSITIVE_BF16 = FINITE_BF16[FINITE_BF16 > 0]


def bits(t: torch.Tensor) -> torch.Tensor:
    """float32 values as int32 bit patterns (so -0.0 != 0.0 and NaN == NaN of equal payload)."""
    return t.float().contiguous().view(torch.int32)


def np_u8(t: torch.Tensor) -> np.ndarray:
    return t.numpy().astype(np.uint8)


# ----- float8_e4m3fn ----------------------------------------------------------------------------
def test_e4m3_decode_all_bytes_matches_ml_dtypes_and_torch():
    got = nx.e4m3_decode(ALL_BYTES)
    want_ml = torch.from_numpy(np_u8(ALL_BYTES).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    want_torch = ALL_BYTES.view(torch.float8_e4m3fn).float()
    nan = torch.isnan(want_ml)
    assert nan.nonzero().flatten().tolist() == [0x7F, 0xFF]
    assert torch.equal(torch.isnan(got), nan) and torch.equal(torch.isnan(want_torch), nan)
    assert torch.equal(bits(got[~nan]), bits(want_ml[~nan]))
    assert torch.equal(bits(got[~nan]), bits(want_torch[~nan]))
    assert got[0x7E] == 448 and got[0xFE] == -448 and got[1] == 2.0**-9


def _e4m3_oracle(y: torch.Tensor) -> torch.Tensor:
    clamped = y.clamp(-448, 448).numpy()
    return torch.from_numpy(clamped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).copy())


def test_e4m3_encode_every_bf16_pattern_matches_ml_dtypes():
    for scale in (1.0, 2.0**-9, 2.0**7):  # shift bf16 values onto e4m3 ties/subnormals/saturation
        y = FINITE_BF16 * scale
        assert torch.equal(nx.e4m3_encode(y), _e4m3_oracle(y))


def test_e4m3_encode_random_fp32_matches_ml_dtypes():
    g = torch.Generator().manual_seed(0)
    mant = torch.randint(0, 2**23, (200_000,), generator=g, dtype=torch.int32)
    expo = torch.randint(100, 140, (200_000,), generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, (200_000,), generator=g, dtype=torch.int32) << 31
    y = (sign | (expo << 23) | mant).view(torch.float32)
    assert torch.equal(nx.e4m3_encode(y), _e4m3_oracle(y))


@pytest.mark.parametrize("value, byte", [(400.0, 0x7C), (-400.0, 0xFC), (448.0, 0x7E), (1e9, 0x7E),
                                         (-1e9, 0xFE), (-0.0, 0x80), (0.0, 0x00), (2.0**-10, 0x00),
                                         (3 * 2.0**-10, 0x02), (17.0, 0x58), (19.0, 0x5A)])
def test_e4m3_encode_documented_cases(value, byte):
    assert int(nx.e4m3_encode(torch.tensor([value]))[0]) == byte


# ----- float4_e2m1fn ----------------------------------------------------------------------------
def test_e2m1_decode_all_codes_matches_ml_dtypes():
    codes = torch.arange(16, dtype=torch.uint8)
    want = torch.from_numpy(np_u8(codes).view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    assert torch.equal(bits(nx.e2m1_decode(codes)), bits(want))


def _rne_magnitude_code(a: torch.Tensor) -> torch.Tensor:
    """Independent RNE oracle on magnitudes in [0, 6]: nearest table value, ties to even code."""
    table = torch.tensor(nx.E2M1_VALUES, dtype=torch.float64)
    dist = (a.double().unsqueeze(-1) - table).abs()
    best = dist.min(dim=-1, keepdim=True).values
    candidates = (dist == best).to(torch.int64) * torch.arange(8)
    lowest = torch.where(dist == best, torch.arange(8), torch.full_like(candidates, 99)).min(dim=-1).values
    highest = candidates.max(dim=-1).values
    return torch.where(lowest % 2 == 0, lowest, highest).to(torch.uint8)


def test_e2m1_threshold_rule_vs_rne_oracle():
    y = torch.cat([FINITE_BF16[FINITE_BF16.abs() <= 8], torch.tensor(nx.E2M1_THRESHOLDS)])
    codes = nx.e2m1_encode(y)
    magnitude = _rne_magnitude_code(y.abs().clamp(max=6))
    assert torch.equal(_rne_magnitude_code(torch.tensor(nx.E2M1_VALUES)), torch.arange(8, dtype=torch.uint8))
    differ = (codes & 7) != magnitude
    # The rules disagree exactly at the ties RNE sends up (0.75, 1.75, 3.5), one code lower each.
    assert sorted(set(y[differ].abs().tolist())) == [0.75, 1.75, 3.5]
    assert torch.equal((codes & 7)[differ], magnitude[differ] - 1)
    # ml_dtypes' cast (RNE) agrees with the oracle wherever it is defined.
    ml = np.clip(y.numpy(), -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    assert torch.equal(torch.from_numpy(ml.copy()) & 7, magnitude)
    # Sign bit only for a non-zero code of a negative value.
    assert torch.equal((codes >> 3) == 1, (y < 0) & ((codes & 7) != 0))


@pytest.mark.parametrize("y, code", [(0.25, 0), (0.75, 1), (1.25, 2), (1.75, 3), (2.5, 4), (3.5, 5),
                                     (5.0, 6), (-0.25, 0), (-0.75, 9), (-1.75, 11), (-3.5, 13),
                                     (-5.0, 14), (6.0, 7), (100.0, 7), (-100.0, 15), (-0.0, 0),
                                     (-1e-30, 0), (-0.2, 0), (0.2500001, 1)])
def test_e2m1_documented_ties_and_signs(y, code):
    assert int(nx.e2m1_encode(torch.tensor([y]))[0]) == code


def test_nibble_packing_order():
    codes = torch.tensor([[1, 2, 3, 4, 0xF, 0x7]], dtype=torch.uint8)
    packed = nx.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x7F]]
    assert torch.equal(nx.unpack_nibbles(packed), codes)
    x = torch.zeros(1, 128)
    x[0, :2] = torch.tensor([6.0, -6.0])  # spec/upstream.md §12 E: byte 0 = f7
    row = kvf.Mxfp4Indexer().encode_rows(x)
    assert int(row[0, 0]) == 0xF7 and int(row[0, 64]) == 127


# ----- ue8m0 ------------------------------------------------------------------------------------
def test_ue8m0_decode_all_bytes_matches_ml_dtypes_and_torch():
    got = nx.ue8m0_decode(ALL_BYTES)
    want_ml = torch.from_numpy(np_u8(ALL_BYTES).view(ml_dtypes.float8_e8m0fnu).astype(np.float32))
    want_torch = ALL_BYTES.view(torch.float8_e8m0fnu).float()
    assert torch.isnan(got[255]) and torch.isnan(want_ml[255]) and torch.isnan(want_torch[255])
    assert torch.equal(bits(got[:255]), bits(want_ml[:255]))
    assert torch.equal(bits(got[:255]), bits(want_torch[:255]))


def test_ue8m0_encode_clamps():
    e = torch.tensor([-200, -127, -22, 0, 120, 128, 300])
    assert nx.ue8m0_encode(e).tolist() == [0, 0, 105, 127, 247, 255, 255]


def test_pow2_matches_ldexp():
    k = torch.arange(-160, 140)
    with np.errstate(over="ignore"):
        want = torch.from_numpy(np.array([math.ldexp(1.0, int(i)) if i < 1024 else math.inf for i in k],
                                         dtype=np.float64).astype(np.float32))
    assert torch.equal(bits(nx.pow2(k)), bits(want))


# ----- ceil_log2: tokenspeed's float32 arithmetic -----------------------------------------------
def _ceil_log2_oracle(q: torch.Tensor) -> torch.Tensor:
    """ceil of the float32-rounded float64 log2 of each float32 q."""
    log = np.log2(q.double().numpy()).astype(np.float32)
    return torch.from_numpy(np.ceil(log).astype(np.int32))


def test_ceil_log2_all_exponents_and_small_mantissas():
    expo = torch.arange(0, 255, dtype=torch.int32)
    mant = torch.cat([torch.arange(0, 2048), 2**23 - torch.arange(1, 257), torch.tensor([2**22])]).to(torch.int32)
    q = ((expo[:, None] << 23) | mant[None, :]).flatten().view(torch.float32)
    q = q[q > 0]
    got = nx.ceil_log2(q)
    assert torch.equal(got, _ceil_log2_oracle(q))
    # The quirk: one ulp above 2^10 the float32 log2 rounds onto 10; exact math would give 11.
    assert int(nx.ceil_log2(torch.tensor([2.0**10]).nextafter(torch.tensor([math.inf])))[0]) == 10
    assert int(nx.ceil_log2(torch.tensor([1.0]).nextafter(torch.tensor([math.inf])))[0]) == 1


@pytest.mark.parametrize("element_max", [448.0, 6.0])
def test_ceil_log2_every_positive_bf16_matches_torch_log2(element_max):
    q = POSITIVE_BF16 / element_max
    assert torch.equal(nx.ceil_log2(q), torch.ceil(torch.log2(q)).to(torch.int32))


def test_ceil_log2_random_fp32_matches_oracle():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(1, 0x7F800000, (300_000,), generator=g, dtype=torch.int32).view(torch.float32)
    assert torch.equal(nx.ceil_log2(q), _ceil_log2_oracle(q))


# ----- scale rules (spec/upstream.md §2.2, §3.2, §4.3, §7) --------------------------------------------
def _exponent(layout_cls, values, block):
    blocks = torch.zeros(1, block)
    blocks[0, :len(values)] = torch.tensor(values, dtype=torch.float32)
    return int(layout_cls.scale_rule.exponents(blocks)[0])


def test_fp8_ds_mla_scale_rule_absmax_floor():
    rule = kvf.Fp8DsMla.scale_rule
    assert (rule.element_max, rule.floor, rule.floor_on) == (448.0, 1e-4, "absmax")
    assert _exponent(kvf.Fp8DsMla, [], 64) == -22
    assert _exponent(kvf.Fp8DsMla, [-0.9e-4], 64) == -22
    assert _exponent(kvf.Fp8DsMla, [448 * 2.0**-22 * 1.01], 64) == -21
    assert _exponent(kvf.Fp8DsMla, [448 * 2.0**5], 64) == 5
    assert _exponent(kvf.Fp8DsMla, [-0.1953125, 0.1328125], 64) == -11  # §12 A block 0
    assert int(nx.ue8m0_encode(torch.tensor(-22))) == 0x69


def test_fp8_indexer_scale_rule_floor_on_scale():
    rule = kvf.Fp8Indexer.scale_rule
    assert (rule.element_max, rule.floor, rule.floor_on) == (448.0, 1e-10, "scale")
    assert _exponent(kvf.Fp8Indexer, [], 128) == -33
    assert _exponent(kvf.Fp8Indexer, [448e-10 * 0.99], 128) == -33
    assert _exponent(kvf.Fp8Indexer, [0.75], 128) == -9  # §12 D
    zero_scale = nx.pow2(torch.tensor([-33])).view(torch.uint8).tolist()
    assert zero_scale == [0x00, 0x00, 0x00, 0x2F]


def test_mxfp4_scale_rule_floor_and_clamp():
    rule = kvf.Mxfp4Indexer.scale_rule
    assert (rule.element_max, rule.floor, rule.floor_on) == (6.0, 1e-4, "absmax")
    assert (rule.exponent_min, rule.exponent_max) == (-127, 127)
    assert _exponent(kvf.Mxfp4Indexer, [], 32) == -15
    assert _exponent(kvf.Mxfp4Indexer, [7.0], 32) == 1  # §12 E block 1
    assert _exponent(kvf.Mxfp4Indexer, [6.0], 32) == 0
    assert _exponent(kvf.Mxfp4Indexer, [math.inf], 32) == 127
    assert _exponent(kvf.Mxfp4Indexer, [3e38], 32) == 126
