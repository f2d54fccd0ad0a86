"""The fp4_ds_mla_v41 lane paths' word helpers against the reference's arithmetic:
``e2m1_rne_words`` on x * (1 / s) for every bf16 x and every e4m3 scale of at least 2^-9 (the
encode's scales, subnormal ones included: the rule's floor is e4m3's smallest subnormal)
against e2m1(x / s), ``e2m1_bf16_words`` for every data byte in every byte of a word against
every scale byte, and the encode's scale byte (v41_jit.fp4_scale_byte) of every bf16 block
maximum against each profile's rule. On a GPU both the PTX / hardware conversions (HW) and the
Triton steps run on every such input; under the interpreter the Triton steps run on every bf16
x with a few scales (the full set would take minutes there)."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.formats.fp4_ds_mla_v41 import E4M3_MIN_SUBNORMAL
from kvformats.numerics import codes as nx

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from kvformats_kernels import numerics_jit as nj  # noqa: E402
from kvformats_kernels import v41, v41_jit  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
BLOCK = 256 if CUDA else 8192  # words per program; the interpreter pays per program
HW = [False, True] if CUDA else [False]


@triton.jit
def _rne_words(x_ptr, s_ptr, out_ptr, n_words, BLOCK: tl.constexpr, HW: tl.constexpr):
    w = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = w < n_words
    x = tl.load(x_ptr + 8 * w[:, None] + tl.arange(0, 8)[None, :], mask=m[:, None], other=0.0)
    s = tl.load(s_ptr + w, mask=m, other=1.0)
    tl.store(out_ptr + w, tl.reshape(nj.e2m1_rne_words(x * nj.fp4_reciprocal(s, HW)[:, None], HW), (BLOCK,)), mask=m)


@triton.jit
def _quotient(a_ptr, out_ptr, n, BLOCK: tl.constexpr, HW: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, nj.quotient_short(tl.load(a_ptr + i, mask=m, other=0.0), 6.0, HW), mask=m)


@triton.jit
def _bf16_words(w_ptr, s_ptr, out_ptr, n_words, BLOCK: tl.constexpr, HW: tl.constexpr):
    w = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = w < n_words
    words = tl.load(w_ptr + w[:, None] + tl.zeros((1, 1), tl.int64), mask=m[:, None], other=0)
    s = tl.load(s_ptr + w, mask=m, other=1.0)
    tl.store(out_ptr + 4 * w[:, None] + tl.arange(0, 4)[None, :], nj.e2m1_bf16_words(words, s, HW), mask=m[:, None])


@pytest.mark.parametrize("hw", HW)
def test_e2m1_rne_words_of_the_reciprocal_product_equal_the_division(hw):
    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    sbytes = torch.arange(0x01, 0x7F, dtype=torch.uint8)  # 2^-9 (the floor) .. 448, subnormals 0x01 - 0x07
    if not CUDA:
        sbytes = torch.tensor([0x01, 0x03, 0x06, 0x07, 0x08, 0x0F, 0x31, 0x3C, 0x7E], dtype=torch.uint8)
    s = nx.e4m3_decode(sbytes)
    x = every_bf16.repeat(s.numel())
    per_value = s.repeat_interleave(every_bf16.numel())
    y = x / per_value  # float32 division, correctly rounded: the reference's
    want = nx.pack_nibbles(nx.e2m1_encode(y, "rne", True).reshape(-1, 8)).view(torch.int32).reshape(-1)
    n = want.numel()
    got = torch.empty(n, dtype=torch.int32, device=DEV)
    _rne_words[(triton.cdiv(n, BLOCK),)](x.to(DEV), per_value[::8].contiguous().to(DEV), got, n, BLOCK=BLOCK, HW=hw)
    nan_word = torch.isnan(y).reshape(-1, 8).any(dim=1)  # unspecified there: the encode zeroes NaN blocks
    bad = ((got.cpu() != want) & ~nan_word).nonzero()
    first = None if bad.numel() == 0 else (x[8 * bad[0, 0]:8 * bad[0, 0] + 8].tolist(), float(per_value[8 * bad[0, 0]]))
    assert bad.numel() == 0, f"{bad.numel()} of {n} words differ; first (x, s) {first}"


@pytest.mark.parametrize("hw", HW)
def test_quotient_of_a_bf16_maximum_by_six_is_the_division(hw):
    """Every block maximum the encode can meet (a bf16 value with the sign bit clear, Inf and
    NaN included): bit-equal to the division from the least normal float32 up; below it, equal
    after the floor the encode applies (the rule's, 2^-9), whatever the GPU does with subnormals."""
    a = (torch.arange(0x8000, dtype=torch.int32) << 16).view(torch.float32)
    got = torch.empty_like(a, device=DEV)
    _quotient[(triton.cdiv(a.numel(), BLOCK),)](a.to(DEV), got, a.numel(), BLOCK=BLOCK, HW=hw)
    got, want = got.cpu(), a / 6.0
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    normal = ~nan & (a >= 2.0**-126)
    assert torch.equal(got[normal].view(torch.int32), want[normal].view(torch.int32))
    floor = torch.tensor(E4M3_MIN_SUBNORMAL)
    assert kvf.get_format("fp4_ds_mla_v41").scale_rule.floor == E4M3_MIN_SUBNORMAL
    assert torch.equal(torch.maximum(got[~normal & ~nan], floor), torch.maximum(want[~normal & ~nan], floor))


@pytest.mark.parametrize("hw", HW)
def test_e2m1_bf16_words_equal_the_reference_products(hw):
    b = torch.arange(256, dtype=torch.int64)
    words = (b | ((b + 1) % 256) << 8 | ((b + 2) % 256) << 16 | ((b + 3) % 256) << 24)  # every byte at every place
    words = words.to(torch.int32).repeat(256)  # wraps like the int32 it is stored as
    sbytes = torch.arange(256, dtype=torch.int32).repeat_interleave(256).to(torch.uint8)
    s = nx.e4m3_decode(sbytes)
    codes = nx.unpack_nibbles(words.view(torch.uint8).reshape(-1, 4)).reshape(-1, 8)
    want = (nx.e2m1_decode(codes) * s.unsqueeze(-1)).to(torch.bfloat16)
    got = torch.empty(words.numel() * 4, dtype=torch.int32, device=DEV)
    _bf16_words[(triton.cdiv(words.numel(), BLOCK),)](words.to(DEV), s.to(DEV), got, words.numel(), BLOCK=BLOCK, HW=hw)
    got = got.cpu().view(torch.bfloat16).reshape(-1, 8)
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    diff = (got.view(torch.int16) != want.view(torch.int16)) & ~nan
    first = None if not diff.any() else (hex(int(words[diff.nonzero()[0, 0]])), int(sbytes[diff.nonzero()[0, 0]]),
                                         got[diff.nonzero()[0, 0]].tolist(), want[diff.nonzero()[0, 0]].tolist())
    assert not diff.any(), f"{int(diff.sum())} values differ; first (word, scale byte, got, want) {first}"
    assert int((got.view(torch.int16) < 0).sum()) > 0  # signs reached both halves


@triton.jit
def _scale_bytes(a_ptr, out_ptr, n, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                 RECIPROCAL: tl.constexpr, RCP: tl.constexpr, SHORT: tl.constexpr, BLOCK: tl.constexpr,
                 HW: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    a = tl.load(a_ptr + i, mask=m, other=0.0)
    tl.store(out_ptr + i, v41_jit.fp4_scale_byte(a, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, RECIPROCAL, RCP, HW, SHORT),
             mask=m)


FP4_PROFILES = [(f, p) for f in ("fp4_ds_mla_v41", "fp4_ds_mla_v41_interleaved") for p in kvf.supported_profiles()[f]]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("short", [False, True], ids=["division", "short"])
@pytest.mark.parametrize("fmt,profile", FP4_PROFILES, ids=[f"{f}-{p}" for f, p in FP4_PROFILES])
def test_fp4_scale_byte_of_every_bf16_maximum_is_the_rules(fmt, profile, short, hw):
    """The encode's e4m3 scale byte of every block maximum it can meet (every bf16 value with the
    sign bit clear, Inf and NaN included), through the per-row kernel's division and the lane
    kernel's short quotient, against the profile's E4m3ScaleRule.scale_bytes: the floor 2^-9
    and the subnormal scales below 2^-6 (0x01 - 0x07), rounded as torch's float8_e4m3fn cast,
    the clamp at 448, NaN's 0x7F, and vLLM's product amax * fl32(1/6)."""
    layout = kvf.get_format(fmt, profile=profile)
    c = v41._rule_constants(layout)
    a = (torch.arange(0x8000, dtype=torch.int32) << 16).view(torch.float32)
    got = torch.empty(a.shape, dtype=torch.int32, device=DEV)
    _scale_bytes[(triton.cdiv(a.numel(), BLOCK),)](a.to(DEV), got, a.numel(), c["FLOOR"], c["ELEM_MAX"],
                                                   c["FLOOR_ON_SCALE"], c["RECIPROCAL"], c["RCP"], short,
                                                   BLOCK=BLOCK, HW=hw)
    want = layout.scale_rule.scale_bytes(a).to(torch.int32)
    bad = (got.cpu() != want).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} differ; first amax {a[bad[0, 0]].item()!r}: " \
                             f"{int(got[bad[0, 0]])} != {int(want[bad[0, 0]])}"
    assert set(range(1, 8)) <= set(want.tolist())  # the subnormal scales were reached
