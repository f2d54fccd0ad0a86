"""fp8_indexer: DeepSeek V4 CSA indexer keys in FP8 (formats.md §3).

Page = ``page_size`` value records (head_dim float8_e4m3fn bytes) then ``page_size`` scale
records (one little-endian float32 power-of-two multiplier per 128 dims).
"""

from __future__ import annotations

import attrs
import torch

from kvformats import numerics as nx
from kvformats.errors import LayoutError
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.ops import register_reference_ops
from kvformats.registry import register_format

QUANT_BLOCK = 128
SCALE_RULE = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-10, floor_on="scale")


@register_format
@attrs.frozen(kw_only=True)
class Fp8Indexer(Layout):
    """``Fp8Indexer(head_dim=128, page_size=64)``: 132 B rows, 8448 B pages.

    ``encode(x [N, head_dim])`` takes x as float32 (bf16/fp16 upcast exactly); per 128-block
    ``scale = 2^ceil(log2(max(amax / 448, 1e-10)))``, bytes = e4m3(x / scale).
    ``decode`` returns float32 ``[N, head_dim]``. head_dim 128 is the size tokenspeed uses;
    larger multiples of 128 get one scale per 128 dims.
    """

    name = "fp8_indexer"
    scale_rule = SCALE_RULE

    head_dim: int = attrs.field(default=128, validator=positive)
    page_size: int = attrs.field(default=64, validator=positive)

    def __attrs_post_init__(self):
        if self.head_dim % QUANT_BLOCK:
            raise LayoutError(f"fp8_indexer head_dim must be a multiple of {QUANT_BLOCK}, got {self.head_dim}")

    @property
    def num_blocks(self) -> int:
        return self.head_dim // QUANT_BLOCK

    def _segments(self):
        return (
            Segment("values", (Field("values", "float8_e4m3fn", self.head_dim, doc="x / scale",
                                     scale="scale", block=QUANT_BLOCK),)),
            Segment("scales", (Field("scale", "float32", self.num_blocks, role="scale",
                                     doc="power-of-two multiplier per 128 dims"),)),
        )

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        n, d, nb = x.shape[0], self.head_dim, self.num_blocks
        blocks = x.float().reshape(n, nb, QUANT_BLOCK)
        e = SCALE_RULE.exponents(blocks)
        out = torch.empty((n, self.row_bytes), dtype=torch.uint8, device=x.device)
        out[:, :d] = nx.e4m3_quantize_blocks(blocks, e).reshape(n, d)
        out[:, d:] = nx.pow2(e).view(torch.uint8).reshape(n, 4 * nb)
        return out

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        n, d, nb = rows.shape[0], self.head_dim, self.num_blocks
        scales = rows[:, d:].contiguous().view(torch.float32)
        values = nx.e4m3_decode(rows[:, :d]).reshape(n, nb, QUANT_BLOCK) * scales.unsqueeze(-1)
        return values.reshape(n, d)


register_reference_ops(Fp8Indexer.name)
