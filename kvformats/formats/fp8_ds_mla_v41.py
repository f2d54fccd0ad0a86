"""fp8_ds_mla_v41: the DeepSeek V4.1 attention row of 528 bytes (spec/formats/fp8_ds_mla_v41.md).

Row = a 512 B data record (all 512 head dims as float8_e4m3fn: the 64 RoPE dims are quantized
too) + a 16 B scale record (one ue8m0 byte per 32 values). A page holds its ``page_size`` data
records, then its ``page_size`` scale records; no page pad. The layout is the one FlashMLA's
interface documents for DeepSeek V4.1 (528 B per token); no writer for it is published, so the
scale rule is ours (profile ``kvformats``): the V4 fp8_ds_mla rule applied per 32 values.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.formats._blocks import V41Rows
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, declare

QUANT_BLOCK = 32
# The V4 584 B row's rule (spec/upstream.md §2.2: amax floored at 1e-4, 2^ceil(log2(A / 448)),
# so no element saturates), on blocks of 32 as the MX formats group their ue8m0 scales.
SCALE_RULE = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="absmax")
PROFILES = declare(
    "fp8_ds_mla_v41",
    Profile(name="kvformats", scale_rule=SCALE_RULE,
            engine="kvformats' own writer (FlashMLA and tokenspeed publish no writer for the 528 B row)",
            source="spec/formats/fp8_ds_mla_v41.md 'Our choice': the fp8_ds_mla rule of spec/upstream.md §2.2 "
                   "per 32 values"),
)


@attrs.frozen(kw_only=True)
class Fp8DsMlaV41(V41Rows):
    """``Fp8DsMlaV41(head_dim=512, page_size=64)``: 528 B rows, 33792 B pages.

    ``encode(x [N, head_dim])`` rounds x to bf16 and quantizes every dim (RoPE included) per
    32-block with a power-of-two scale ``2^ceil(log2(max(amax, 1e-4) / 448))``. ``decode``
    returns bf16 ``[N, head_dim]`` (``bf16(e4m3 value * 2^(s - 127))``).
    """

    PROFILES = PROFILES
    QUANT_BLOCK = QUANT_BLOCK
    one_block_params = dict(head_dim=QUANT_BLOCK)
    VALUES = ("float8_e4m3fn", "every head dim (RoPE too), scaled by 2^-e per 32-block")
    SCALES = ("float8_e8m0fnu", "e + 127 per 32-block")

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        blocks = self._blocks(x)
        e = self.scale_rule.exponents(blocks)
        return self._rows(nx.e4m3_quantize_blocks(blocks, e), nx.ue8m0_encode(e))

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        # exact in float32 (4 significant bits times a power of two), then one RNE to bf16;
        # a NaN code or a NaN scale (0xFF) gives NaN
        values = nx.e4m3_decode(rows[:, self.row_span("values")])
        return self._scaled(values, nx.ue8m0_decode(rows[:, self.row_span("scale")])).to(torch.bfloat16)
