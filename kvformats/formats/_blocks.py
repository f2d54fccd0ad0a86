"""What the two DeepSeek V4.1 rows share: every head dim in one data record of blocks of
``QUANT_BLOCK`` values, then each block's scale in a scale record (fp8_ds_mla_v41: e4m3 values
and ue8m0 scales; fp4_ds_mla_v41: e2m1 values and e4m3 scales)."""

from __future__ import annotations

from typing import ClassVar

import torch

from kvformats.errors import LayoutError
from kvformats.layout import Field, Segment


class BlockScaledRows:
    """Mixin of the V4.1 layouts; a subclass sets QUANT_BLOCK and the (dtype, doc) of its values
    and of its scales."""

    QUANT_BLOCK: ClassVar[int]
    VALUES: ClassVar[tuple[str, str]]
    SCALES: ClassVar[tuple[str, str]]

    def _check_geometry(self) -> None:
        if self.head_dim % self.QUANT_BLOCK:
            raise LayoutError(f"{self.name} head_dim must be a multiple of {self.QUANT_BLOCK}, got {self.head_dim}")

    @property
    def num_blocks(self) -> int:
        return self.head_dim // self.QUANT_BLOCK

    @property
    def decode_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        """float32 ``[N, num_blocks, QUANT_BLOCK]`` of rows ``x``, rounded to bf16 first."""
        return x.to(torch.bfloat16).float().reshape(x.shape[0], self.num_blocks, self.QUANT_BLOCK)

    def _segments(self):
        return (
            Segment("data", (Field("values", self.VALUES[0], self.head_dim, doc=self.VALUES[1], scale="scale",
                                   block=self.QUANT_BLOCK),)),
            Segment("scales", (Field("scale", self.SCALES[0], self.num_blocks, role="scale", doc=self.SCALES[1]),)),
        )
