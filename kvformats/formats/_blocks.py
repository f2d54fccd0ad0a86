"""What the indexer rows and the DeepSeek V4.1 rows share: every head dim in one data record of
blocks of ``QUANT_BLOCK`` values, then each block's scale in a scale record (fp8_indexer: e4m3
values and float32 scales; mxfp4_indexer: e2m1 and ue8m0; fp8_ds_mla_v41: e4m3 and ue8m0;
fp4_ds_mla_v41: e2m1 and e4m3)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import torch

from kvformats.errors import LayoutError
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.numerics.profiles import ProfiledLayout, profile_field


if TYPE_CHECKING:  # the mixin is only ever a base of a Layout: checked as one
    _LayoutBase = Layout
else:
    _LayoutBase = object


class BlockScaledRows(_LayoutBase):
    """Mixin of the block-scaled layouts; a subclass sets QUANT_BLOCK, the name of its data
    segment and the (dtype, doc) of its values and of its scales. Encode takes its input in
    ``quant_input_dtype`` and decode returns that dtype."""

    __slots__ = ()
    QUANT_BLOCK: ClassVar[int]
    DATA_SEGMENT: ClassVar[str] = "data"
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
        return self.quant_input_dtype

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        """float32 ``[N, num_blocks, QUANT_BLOCK]`` of rows ``x``, rounded to ``quant_input_dtype`` first."""
        return x.to(self.quant_input_dtype).float().reshape(x.shape[0], self.num_blocks, self.QUANT_BLOCK)

    def _rows(self, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """uint8 ``[N, row_bytes]``: each row's data bytes (``values``, N leading) then its scale
        bytes (``scales``)."""
        n = values.shape[0]
        out = torch.empty((n, self.row_bytes), dtype=torch.uint8, device=values.device)
        for region, part in (("values", values), ("scale", scales)):
            span = self.row_span(region)
            out[:, span] = part.reshape(n, span.stop - span.start)
        return out

    def _scaled(self, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """float32 ``[N, head_dim]``: block values ``[N, num_blocks * QUANT_BLOCK]`` (any shape with
        N leading) times their block's scale ``scales [N, num_blocks]``."""
        n = values.shape[0]
        blocks = values.reshape(n, self.num_blocks, self.QUANT_BLOCK)
        return (blocks * scales.unsqueeze(-1)).reshape(n, self.head_dim)

    def _segments(self):
        return (
            Segment(self.DATA_SEGMENT, (Field("values", self.VALUES[0], self.head_dim, doc=self.VALUES[1],
                                              scale="scale", block=self.QUANT_BLOCK),)),
            Segment("scales", (Field("scale", self.SCALES[0], self.num_blocks, role="scale", doc=self.SCALES[1]),)),
        )


@attrs.frozen(kw_only=True)
class IndexerRows(BlockScaledRows, ProfiledLayout, Layout):
    """The CSA indexer keys (fp8_indexer, mxfp4_indexer): 128 dims a key by default, float32
    input; re-encoding decoded values gives the same values."""

    DATA_SEGMENT = "values"
    examples = Examples(value_idempotent=True)

    head_dim: int = attrs.field(default=128, validator=positive)
    page_size: int = attrs.field(default=64, validator=positive)
    profile: str = profile_field()


class TokenInterleaved(_LayoutBase):
    """Mixin: each token's data record is followed by its own scale record (one segment of
    ``values, scale`` records), instead of a page's data records followed by its scale records.
    The same bytes per token as the page-planar class it is mixed into, in another place."""

    __slots__ = ()

    def _segments(self):
        data, scales = super()._segments()
        return (Segment("token", data.fields + scales.fields),)


@attrs.frozen(kw_only=True)
class V41Rows(BlockScaledRows, ProfiledLayout, Layout):
    """The DeepSeek V4.1 rows (fp8_ds_mla_v41, fp4_ds_mla_v41): 512 dims a token, rounded to bf16
    first, decoded to bf16."""

    quant_input_dtype = torch.bfloat16  # the same bf16 KV rows for the 528 B and the 288 B caches
    examples = Examples(small_params={"head_dim": 64, "page_size": 4})

    head_dim: int = attrs.field(default=512, validator=positive)
    page_size: int = attrs.field(default=64, validator=positive)
    profile: str = profile_field()
