"""The V4.1 formats against restatements of the published writers, written here from their rules
and sharing no code with the library (torch casts and float arithmetic only):

* FlashMLA's ``tests/quant.py`` V4.1 writer (upstream deepseek-ai/FlashMLA, token-interleaved;
  the vllm-project / sgl-project forks, page-planar): profile ``flashmla`` of all four formats,
  on seven input kinds (non-finite included);
* tokenspeed-kernel 0.1.4's ``_pack_kernel`` (page-planar ``swa`` / ``global``): the planar pair's
  default profile, on six finite kinds.

Pages are compared whole (every byte of the cache, untouched rows included); decode is compared
where the input is finite. The released code itself runs in tests/interop/test_released_writers.py.
"""

from __future__ import annotations

import math

import pytest
import torch

import kvformats as kvf

N, PAGE, PAGES = 96, 64, 3
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
TIES_TO_EVEN_UP = torch.tensor([0.75, 1.75, 3.5])  # midpoints whose even neighbour is the larger one


def _kind(kind: str, gen: torch.Generator) -> torch.Tensor:
    """float32 [N, 512] rows of one input kind."""
    x = torch.randn(N, 512, generator=gen)
    if kind == "normal":
        return x
    if kind == "small":
        return x * 0.02
    if kind == "zero":
        return torch.where(torch.rand(N, 512, generator=gen) < 0.5, 0.0, -0.0)
    if kind == "tiny":  # block maxima below 6 * 2^-9 and below 448 * 1e-4, some subnormal scales
        return x * 10.0 ** torch.randint(-8, -2, (N, 1), generator=gen).float()
    if kind == "mixed":  # every 32-value tile spans 1e-4 .. 1e2
        mag = 10.0 ** (torch.rand(N, 512, generator=gen) * 6 - 4)
        return torch.where(x < 0, -mag, mag)
    if kind == "ties":  # block maxima at the elements' largest code, the rest on midpoints
        mids = torch.cat([MIDPOINTS, MIDPOINTS * 64, torch.tensor([17.0, 19.0, 9.5, 4.75, 272.0, 304.0])])
        pick = mids[torch.randint(0, len(mids), (N, 512), generator=gen)]
        pick = torch.where(x < 0, -pick, pick)
        pick[:, ::16] = 6.0  # fp4 blocks of 16: s = 1
        pick[:, ::32] = 448.0  # fp8 blocks of 32: e = 0
        return pick * 2.0 ** torch.randint(-3, 4, (N, 1), generator=gen).float()
    if kind == "nonfinite":
        x[torch.rand(N, 512, generator=gen) < 0.01] = float("nan")
        x[torch.rand(N, 512, generator=gen) < 0.01] = float("inf")
        x[torch.rand(N, 512, generator=gen) < 0.01] = float("-inf")
        return x
    raise AssertionError(kind)


FINITE = ("normal", "small", "zero", "tiny", "mixed", "ties")


# ----------------------------------------------------------------------------- restatements
def _e4m3(y: torch.Tensor) -> torch.Tensor:
    return y.to(torch.float8_e4m3fn).view(torch.uint8)


def _e2m1_rne(y: torch.Tensor, nan_sign: bool = True) -> torch.Tensor:
    """e2m1 codes of float32 y: nearest, ties to the even code, saturating at 6, the sign bit of
    y as torch computed it, NaN included (FlashMLA's encoder: a NaN's magnitude code is 0; on this
    CPU x / NaN keeps the NaN operand, so a NaN element keeps its own sign); ``nan_sign=False``:
    NaN gives 0x0 (tokenspeed's rule, defined on finite input only)."""
    a = torch.nan_to_num(y.abs(), nan=0.0).clamp_max(6.0)
    code = (a.unsqueeze(-1) > MIDPOINTS).sum(-1) + (a.unsqueeze(-1) == TIES_TO_EVEN_UP).sum(-1)
    sign = torch.signbit(y) if nan_sign else torch.where(torch.isnan(y), False, torch.signbit(y))
    return (code | (sign.long() << 3)).to(torch.uint8)


def flashmla_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(value bytes [N, 512], scale bytes [N, 16]) by FlashMLA's V4.1 fp8 rule."""
    t = x.to(torch.bfloat16).float().reshape(-1, 16, 32)
    inv = torch.pow(2.0, torch.clamp_min(t.abs().amax(-1) / 448.0, 1e-4).log2().ceil())
    return _e4m3(t / inv.unsqueeze(-1)).reshape(-1, 512), inv.to(torch.float8_e8m0fnu).view(torch.uint8)


def flashmla_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed nibbles [N, 256], e4m3 scale bytes [N, 32]) by FlashMLA's V4.1 fp4 rule."""
    t = x.to(torch.bfloat16).float().reshape(-1, 32, 16)
    amax = torch.nan_to_num(t.abs(), nan=math.inf).amax(-1)
    sf = torch.clamp(amax / 6.0, 2.0**-9, 448.0).to(torch.float8_e4m3fn)
    sf = torch.where(torch.isinf(amax), torch.tensor(float("nan")).to(torch.float8_e4m3fn), sf)
    codes = _e2m1_rne(t / sf.float().unsqueeze(-1)).reshape(-1, 512)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), sf.view(torch.uint8)


def tokenspeed_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokenspeed-kernel 0.1.4 ``swa``: amax floored at 1e-4, times fl32(1/448), the exponent
    ceil(log2) read off the float32 bits, x / 2^e clamped to 448."""
    t = x.to(torch.bfloat16).float().reshape(-1, 16, 32)
    q = torch.clamp_min(t.abs().amax(-1), 1e-4) * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    bits = q.view(torch.int32)
    e = ((bits >> 23) & 255) - 127 + ((bits & 0x7FFFFF) != 0).int()
    scale = ((e + 127) << 23).view(torch.float32)
    return _e4m3((t / scale.unsqueeze(-1)).clamp(-448.0, 448.0)).reshape(-1, 512), (e + 127).to(torch.uint8)


def tokenspeed_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokenspeed-kernel 0.1.4 ``global``: s = e4m3(max(amax, 6 * 2^-9) / 6), x / s, e2m1."""
    t = x.to(torch.bfloat16).float().reshape(-1, 32, 16)
    sf = (torch.clamp_min(t.abs().amax(-1), 6 * 2.0**-9) / 6.0).to(torch.float8_e4m3fn)
    codes = _e2m1_rne(t / sf.float().unsqueeze(-1)).reshape(-1, 512)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), sf.view(torch.uint8)


def pages(values: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """uint8 [PAGES, PAGE * row] pages holding token i's record at slot ``slots[i]`` (< 0: none)."""
    vb, sb = values.shape[1], scales.shape[1]
    out = torch.zeros(PAGES, PAGE * (vb + sb), dtype=torch.uint8)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        page, row = divmod(slot, PAGE)
        v = row * (vb + sb) if interleaved else row * vb
        s = v + vb if interleaved else PAGE * vb + row * sb
        out[page, v:v + vb], out[page, s:s + sb] = values[i], scales[i]
    return out


def same_bytes(got: torch.Tensor, want: torch.Tensor, e4m3: bool) -> bool:
    """Byte equality, an e4m3 NaN code of either sign (0x7F / 0xFF) matching the other
    (spec/nan-policy.md §1.3)."""
    if e4m3:
        got, want = got.clone(), want.clone()
        got[got == 0xFF], want[want == 0xFF] = 0x7F, 0x7F
    return torch.equal(got, want)


WRITERS = {("fp8", "flashmla"): flashmla_fp8, ("fp4", "flashmla"): flashmla_fp4,
           ("fp8", "tokenspeed"): tokenspeed_fp8, ("fp4", "tokenspeed"): tokenspeed_fp4}


def _check(fmt: str, profile: str, kind: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = _kind(kind, gen).to(torch.bfloat16)
    slots = torch.randperm(PAGES * PAGE, generator=gen)[:N]
    slots[::7] = -1
    layout = kvf.get_format(fmt, profile=profile, page_size=PAGE)
    cache = layout.allocate(PAGES)
    layout.encode(x, cache, slots)
    values, scales = WRITERS[fmt[:3], profile](x)
    want = pages(values, scales, slots, interleaved=fmt.endswith("_interleaved"))
    assert same_bytes(cache, want, e4m3=fmt.startswith("fp8")), (fmt, profile, kind)
    if kind != "nonfinite":  # decode: the stored value times its scale, rounded once to bf16
        valid = slots >= 0
        got = layout.decode(cache, slots)[valid].float()
        if fmt.startswith("fp8"):
            ref = values.view(torch.float8_e4m3fn).float().reshape(-1, 16, 32) * \
                scales.view(torch.float8_e8m0fnu).float().unsqueeze(-1)
        else:
            codes = torch.stack((values & 15, values >> 4), -1).reshape(-1, 512).long()
            mag = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
            ref = mag.reshape(-1, 32, 16) * scales.view(torch.float8_e4m3fn).float().unsqueeze(-1)
        assert torch.equal(got, ref.reshape(-1, 512).to(torch.bfloat16).float()[valid])


V41 = ("fp8_ds_mla_v41", "fp4_ds_mla_v41", "fp8_ds_mla_v41_interleaved", "fp4_ds_mla_v41_interleaved")


@pytest.mark.parametrize("kind", (*FINITE, "nonfinite"))
@pytest.mark.parametrize("fmt", V41)
def test_flashmla_profile_is_flashmlas_writer(fmt, kind):
    for seed in range(3):
        _check(fmt, "flashmla", kind, seed)


@pytest.mark.parametrize("kind", FINITE)
@pytest.mark.parametrize("fmt", V41)
def test_tokenspeed_profile_is_tokenspeeds_writer(fmt, kind):
    """The planar pair's default (and the interleaved pair's tokenspeed profile, the same rule
    in the other layout) on finite input, where tokenspeed's writer is defined."""
    for seed in range(3):
        _check(fmt, "tokenspeed", kind, seed)


def test_the_fp4_default_changed_from_the_retired_rule():
    """The retired rule floored the fp4 scale at 2^-6: at N(0, 0.02) most scale bytes were
    other than tokenspeed's; now none are."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(N, 512, generator=gen) * 0.02).to(torch.bfloat16)
    layout = kvf.get_format("fp4_ds_mla_v41")
    rows = layout.encode_rows(x)
    _, want = tokenspeed_fp4(x)
    assert torch.equal(rows[:, 256:], want)
    assert (want < 0x08).float().mean() > 0.5  # below 2^-6: where the retired floor wrote 0x08
