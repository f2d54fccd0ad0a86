"""What fp8_ds_mla and its V3.2 form share: rows of NoPE dims quantized in blocks of
``quant_block`` e4m3 values, followed by a RoPE tail kept in bf16."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvformats.errors import LayoutError

if TYPE_CHECKING:  # the mixin is only ever a base of a Layout: checked as one
    from kvformats.layout import Layout as _LayoutBase
else:
    _LayoutBase = object


class NopeRopeRows(_LayoutBase):
    """Mixin for attrs layouts with ``head_dim`` and ``rope_dim`` fields and a ``quant_block``
    class attribute: validates the dims and derives ``nope_dim``, ``num_blocks``, ``decode_dtype``."""

    __slots__ = ()
    quant_block: int
    rope_dim: int

    def _check_geometry(self) -> None:
        nope = self.head_dim - self.rope_dim
        if nope <= 0 or nope % self.quant_block or self.rope_dim % 2:
            raise LayoutError(f"{self.name} needs head_dim - rope_dim to be a positive multiple of "
                              f"{self.quant_block} and an even rope_dim, got head_dim={self.head_dim}, "
                              f"rope_dim={self.rope_dim}")

    @property
    def decode_dtype(self) -> torch.dtype:
        return torch.bfloat16

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def num_blocks(self) -> int:
        return self.nope_dim // self.quant_block
