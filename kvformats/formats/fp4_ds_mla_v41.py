"""fp4_ds_mla_v41: the DeepSeek V4.1 fp4 record, 288 bytes per token, in its two layouts
(spec/formats/fp4_ds_mla_v41.md, fp4_ds_mla_v41_interleaved.md).

A token is a 256 B data record (512 e2m1 values, element 2k in the low nibble) and a 32 B scale
record (one float8_e4m3fn scale per 16 values): NVFP4's block scale without its global scale.

* ``fp4_ds_mla_v41`` (page-planar): a page's data records, then its scale records; no page pad.
  tokenspeed-kernel 0.1.4's paged ``global`` field and the FlashMLA forks store it so. Default
  profile ``tokenspeed``.
* ``fp4_ds_mla_v41_interleaved``: each token's data record, then its own scale record. Upstream
  FlashMLA (``V41_FP4``) and vLLM 0.33.0 store it so. Default profile ``flashmla``.

Every published writer takes ``s = e4m3(clamp(amax / 6, 2^-9, 448))`` (2^-9 is e4m3's smallest
subnormal) and codes ``x / s`` in e2m1, round-half-even, saturating, sign of zero kept. They
differ in how amax / 6 is computed (vLLM multiplies by fl32(1/6)) and in non-finite blocks.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.errors import LayoutError
from kvformats.formats._blocks import TokenInterleaved, V41Rows
from kvformats.formats.fp8_ds_mla_v41 import FLASHMLA_FORK_URL, TOKENSPEED_URL
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, declare

QUANT_BLOCK = 16
# The scale's floor: e4m3's smallest subnormal, 2^-9, as every published writer floors it.
E4M3_MIN_SUBNORMAL = 2.0**-9


@attrs.frozen(kw_only=True)
class E4m3ScaleRule(nx.ScaleRule):
    """A block scale stored as a float8_e4m3fn byte: ``s = e4m3_rne(clamp(q, floor, scale_max))``
    with ``q = fl32(amax / element_max)`` (``reciprocal``: ``fl32(amax * fl32(1 / element_max))``,
    vLLM's product), the sign bit cleared (a NaN amax gives 0x7F). Elements are ``fl32(x / s)``
    (one correctly rounded division) in the element codec."""

    scale_dtype: str = "float8_e4m3fn"
    scale_max: float = nx.FP8_E4M3_MAX
    reciprocal: bool = False

    def _q(self, amax: torch.Tensor) -> torch.Tensor:
        if not self.reciprocal:
            return super()._q(amax)
        inv = torch.full((), nx._f32(1.0 / self.element_max), dtype=torch.float32, device=amax.device)
        return (amax * inv).clamp_min(nx._f32(self.floor))

    def scale_bytes(self, amax: torch.Tensor) -> torch.Tensor:
        """uint8 e4m3 scale bytes of block maxima ``amax [...]`` (float32, >= 0 or NaN)."""
        q = self._q(amax.to(torch.float32)).clamp_max(self.scale_max)  # NaN stays NaN through both clamps
        return nx.e4m3_encode(q) & 0x7F  # q >= 0: the sign bit only ever came from a NaN's

    def scales_of_amax(self, amax: torch.Tensor) -> torch.Tensor:
        return nx.e4m3_decode(self.scale_bytes(amax))


SCALE_RULE = E4m3ScaleRule(element_max=nx.E2M1_MAX, floor=E4M3_MIN_SUBNORMAL, floor_on="scale", power_of_two=False)
VLLM_RULE = E4m3ScaleRule(element_max=nx.E2M1_MAX, floor=E4M3_MIN_SUBNORMAL, floor_on="scale", power_of_two=False,
                          reciprocal=True)
BOUND = ("|x_bf16 - x_hat| <= max(s, |x_bf16| - 6 s) per element, <= s/4 where |x_bf16| <= 2 s (s = the block's "
         "stored e4m3 scale; |x_bf16| - 6 s > 0 only where the scale rounded down or was clamped to 448)")
TOKENSPEED = Profile(
    name="tokenspeed", scale_rule=SCALE_RULE, e2m1_rounding="rne", e2m1_signed_zero=True, error_bound=BOUND,
    engine="tokenspeed-kernel 0.1.4 tokenspeed_kernel/ops/attention/dsv41/triton.py _pack_kernel (format 'global')",
    source=f"{TOKENSPEED_URL}: e4m3(max(amax, 6 * 2^-9) / 6), x / s, e2m1 ties to the even code, saturating, "
           "sign of zero kept; finite input (spec/formats/fp4_ds_mla_v41.md)")
# FlashMLA's fp4 writer takes amax over nan_to_num(|x|, nan=inf): a NaN makes the scale NaN (as
# the clamp rule does), while an Inf becomes the largest float (nan_to_num's posinf default), so
# an Inf block stores 448 and saturates: the same scale bytes as tokenspeed's rule on every input.
# Its encoder copies the sign bit of x / s into the nibble, NaN included: a NaN element keeps
# its own sign there (e2m1_nan_sign), where tokenspeed's NaN-free rule writes 0x0.
FLASHMLA = Profile(
    name="flashmla", scale_rule=SCALE_RULE, e2m1_rounding="rne", e2m1_signed_zero=True, e2m1_nan_sign=True,
    error_bound=BOUND,
    engine="FlashMLA tests/quant.py quantize_k_cache (V41_FP4; upstream and the vllm-project fork)",
    source=f"{FLASHMLA_FORK_URL}: e4m3(clamp(amax / 6, 2^-9, 448)); a NaN in a block makes its scale NaN "
           "(0x7F) and its codes 0 (a NaN element: its sign bit), an Inf stores 448 and saturates; e2m1 "
           "round-half-even, saturating (spec/formats/fp4_ds_mla_v41.md)")
VLLM = Profile(
    name="vllm", scale_rule=VLLM_RULE, e2m1_rounding="rne", e2m1_signed_zero=True, error_bound=BOUND,
    engine="vLLM 0.33.0 vllm/models/deepseek_v41/common/ops/fused_compress_quant_cache.py "
           "_rope_quant_insert_nvfp4_kernel",
    source="vllm 0.33.0 (PyPI): e4m3(clamp(amax * (1/6), 2^-9, 448)), div_rn, PTX cvt.rn.satfinite.e2m1x2; "
           "finite input (spec/formats/fp4_ds_mla_v41_interleaved.md)")
PROFILES = declare("fp4_ds_mla_v41", TOKENSPEED, FLASHMLA)
INTERLEAVED_PROFILES = declare("fp4_ds_mla_v41_interleaved", FLASHMLA, VLLM, TOKENSPEED)


@attrs.frozen(kw_only=True)
class Fp4DsMlaV41(V41Rows):
    """``Fp4DsMlaV41(head_dim=512, page_size=64)``: 288 B rows, 18432 B pages, page-planar; the
    fp4 extra cache that sits beside an fp8_ds_mla_v41 cache of the same page_size.

    ``encode(x [N, head_dim])`` rounds x to bf16; per 16-block ``s = e4m3(clamp(amax / 6, 2^-9,
    448))``, elements ``e2m1(x / s)`` round-half-even, saturating at 6, sign of zero kept.
    ``decode`` returns bf16 ``[N, head_dim]`` (``e2m1 value * s``, exact).
    """

    PROFILES = PROFILES
    QUANT_BLOCK = QUANT_BLOCK
    examples = attrs.evolve(V41Rows.examples, one_block=dict(head_dim=QUANT_BLOCK))
    VALUES = ("float4_e2m1fn_x2", "e2m1 codes of x / s, element 2k in the low nibble")
    SCALES = ("float8_e4m3fn", "e4m3 scale s per 16-block")

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        blocks, prof = self._blocks(x), self.numerics
        rule = prof.scale_rule
        if not isinstance(rule, E4m3ScaleRule):  # every profile of this format stores e4m3 scales
            raise LayoutError(f"{self.name} profile {prof.name!r} needs an E4m3ScaleRule, got {type(rule).__name__}")
        sbytes = rule.scale_bytes(nx.absmax(blocks))
        y = blocks / nx.e4m3_decode(sbytes).unsqueeze(-1)
        codes = nx.e2m1_encode(y, prof.e2m1_rounding, prof.e2m1_signed_zero)
        codes = codes.masked_fill_(torch.isnan(y), 0)  # NaN has no e2m1 code: 0, whatever its sign bit
        if prof.e2m1_nan_sign:  # FlashMLA: a NaN element's nibble carries that NaN's sign bit
            nan = torch.isnan(blocks)
            codes = torch.where(nan, torch.signbit(blocks).to(torch.uint8) << 3, codes)
        return self._rows(nx.pack_nibbles(codes.reshape(x.shape[0], self.head_dim)), sbytes)

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        # exact in float32 and in bf16 (at most 6 significant bits, magnitudes >= 2^-10 or 0)
        values = nx.e2m1_decode(nx.unpack_nibbles(rows[:, self.row_span("values")]))
        return self._scaled(values, nx.e4m3_decode(rows[:, self.row_span("scale")])).to(torch.bfloat16)


@attrs.frozen(kw_only=True)
class Fp4DsMlaV41Interleaved(TokenInterleaved, Fp4DsMlaV41):
    """``Fp4DsMlaV41Interleaved(head_dim=512, page_size=64)``: the same 288 B per token as
    fp4_ds_mla_v41, token-interleaved (each token's 256 value bytes, then its 32 scale bytes);
    pages of ``page_size * 288`` bytes. Profiles: ``flashmla`` (default), ``vllm``, ``tokenspeed``."""

    PROFILES = INTERLEAVED_PROFILES
