"""fp4_ds_mla_v41: the DeepSeek V4.1 fp4 extra cache, 288 bytes per token
(spec/formats/fp4_ds_mla_v41.md).

Row = a 256 B data record (512 e2m1 values, element 2k in the low nibble) + a 32 B scale record
(one float8_e4m3fn scale per 16 values). A page holds its ``page_size`` data records, then its
``page_size`` scale records; no page pad. FlashMLA's interface documents this layout for an
extra cache beside a 528 B cache (fp8_ds_mla_v41: same page geometry); no writer is published,
so the scale rule is ours (profile ``kvformats``): NVFP4's block scale without its global scale
(a row has no field for one): ``s = e4m3(amax / 6)``, elements ``e2m1(x / s)``.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.errors import LayoutError
from kvformats.formats._blocks import V41Rows
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, declare

QUANT_BLOCK = 16
# The scale's floor: e4m3's smallest normal (torch.finfo(torch.float8_e4m3fn).tiny).
# Scales stay normal, so s is within 1/16 of amax / 6 and decode is a projection (a subnormal s,
# 2^-9 steps, could give a block maximum of 4 s that re-encodes to another scale)
E4M3_MIN_NORMAL = 2.0**-6


@attrs.frozen(kw_only=True)
class E4m3ScaleRule(nx.ScaleRule):
    """A block scale stored as a float8_e4m3fn byte: ``s = e4m3_rne(clamp(fl32(amax /
    element_max), floor, scale_max))`` with the sign bit cleared (a NaN amax gives 0x7F).
    Elements are ``fl32(x / s)`` (one correctly rounded division) in the element codec."""

    scale_dtype: str = "float8_e4m3fn"
    scale_max: float = nx.FP8_E4M3_MAX

    def scale_bytes(self, amax: torch.Tensor) -> torch.Tensor:
        """uint8 e4m3 scale bytes of block maxima ``amax [...]`` (float32, >= 0 or NaN)."""
        q = self._q(amax.to(torch.float32)).clamp_max(self.scale_max)  # NaN stays NaN through both clamps
        return nx.e4m3_encode(q) & 0x7F  # q >= 0: the sign bit only ever came from a NaN's

    def scales_of_amax(self, amax: torch.Tensor) -> torch.Tensor:
        return nx.e4m3_decode(self.scale_bytes(amax))


SCALE_RULE = E4m3ScaleRule(element_max=nx.E2M1_MAX, floor=E4M3_MIN_NORMAL, floor_on="scale", power_of_two=False)
PROFILES = declare(
    "fp4_ds_mla_v41",
    Profile(name="kvformats", scale_rule=SCALE_RULE, e2m1_rounding="rne", e2m1_signed_zero=True,
            engine="kvformats' own writer (FlashMLA and tokenspeed publish no writer for the 288 B row)",
            source="spec/formats/fp4_ds_mla_v41.md 'Our choice': NVFP4's e4m3 block scale amax/6 (no global "
                   "scale), e2m1 round-half-even, saturating",
            error_bound="|x_bf16 - x_hat| <= max(s, |x_bf16| - 6 s) per element, <= s/4 where |x_bf16| <= 2 s "
                        "(s = the block's stored e4m3 scale; |x_bf16| - 6 s > 0 only where the scale rounded "
                        "down (then < s) or was clamped to 448); NaN elements store code 0"),
)


@attrs.frozen(kw_only=True)
class Fp4DsMlaV41(V41Rows):
    """``Fp4DsMlaV41(head_dim=512, page_size=64)``: 288 B rows, 18432 B pages; the fp4 extra
    cache that sits beside an fp8_ds_mla_v41 cache of the same page_size.

    ``encode(x [N, head_dim])`` rounds x to bf16; per 16-block ``s = e4m3(max(amax / 6,
    2^-6))`` (saturating at 448), elements ``e2m1(x / s)`` round-half-even, saturating at 6,
    sign of zero kept. ``decode`` returns bf16 ``[N, head_dim]`` (``e2m1 value * s``, exact).
    """

    PROFILES = PROFILES
    QUANT_BLOCK = QUANT_BLOCK
    one_block_params = dict(head_dim=QUANT_BLOCK)
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
        return self._rows(nx.pack_nibbles(codes.reshape(x.shape[0], self.head_dim)), sbytes)

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        # exact in float32 and in bf16 (at most 6 significant bits, magnitudes >= 2^-7 or 0)
        values = nx.e2m1_decode(nx.unpack_nibbles(rows[:, self.row_span("values")]))
        return self._scaled(values, nx.e4m3_decode(rows[:, self.row_span("scale")])).to(torch.bfloat16)
