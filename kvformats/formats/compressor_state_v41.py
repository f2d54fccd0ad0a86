"""compressor_state_v41: DeepSeek V4.1 compressor ring state (spec/formats/compressor_state_v41.md).

float32 cache ``[pages, page_size, 2W]``; one row per ring slot holds ``[kv (W) | score (W)]``
exactly as given (no APE, no positions; W = head_dim). The caller computes the slots
(``block * capacity + p % capacity`` in vLLM 0.33.0, pages of 2 rows in tokenspeed-kernel 0.1.4).
"""

from __future__ import annotations

import attrs
import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.examples import Examples
from kvformats.formats.compressor_state import CompressorState
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.validation import FLOAT_DTYPES, check_tensor


def _encode_args(layout, n, values, gen):
    """``(kv, score)`` of N(0, 1) float32 values; decode gives back ``[kv | score]`` exactly."""
    kv = torch.randn(n, layout.width, generator=gen)
    score = torch.randn(n, layout.width, generator=gen)
    return (kv, score), {}, _reference(layout, (kv, score))


def _reference(layout, x, **kwargs) -> torch.Tensor:
    """``[kv | score]`` in float32, what decode gives back exactly."""
    kv, score = x
    return torch.cat([kv.float(), score.float()], dim=1)


@attrs.frozen(kw_only=True)
class CompressorStateV41(Layout):
    """``CompressorStateV41(head_dim=512, page_size=8)``: float32 rows ``[kv | score]`` of 2W values.

    ``encode((kv, score), cache, slots)``: kv, score ``[N, W]`` (W = head_dim), stored in float32
    as given (-0.0, NaN and Inf included). ``decode`` returns ``(kv, score)``. ``gather`` returns
    the rows' bytes (uint8 ``[N, 8W]``; ``.view(torch.float32)`` for values). ``page_size`` is the
    ring capacity of vLLM's one block per request (at least 8) or tokenspeed's 2 rows a page.
    """

    name = "compressor_state_v41"
    container_dtype = torch.float32
    examples = Examples(
        params=tuple(dict(head_dim=h) for h in (1, 2, 3, 8, 16)),
        page_size_range=(1, 8), value_idempotent=True, small_params={"head_dim": 8, "page_size": 4},
        one_block={"head_dim": 1},  # no quantization blocks: the narrowest state
        encode_args_of=_encode_args, reference_of=_reference)

    head_dim: int = attrs.field(default=512, validator=positive)
    page_size: int = attrs.field(default=8, validator=positive)

    # the state row's shape and decode are CompressorState's (W wide halves, two float32 tensors)
    decode_dtype = CompressorState.decode_dtype
    decode_dtypes = CompressorState.decode_dtypes
    cache_shape = CompressorState.cache_shape
    decode_rows = CompressorState.decode_rows

    @property
    def width(self) -> int:
        """W, the width of the kv half and of the score half: head_dim (no overlapping halves)."""
        return self.head_dim

    def _segments(self):
        return (Segment("state", (
            Field("kv", "float32", self.width, doc="kv projection, exact"),
            Field("score", "float32", self.width, doc="score as computed, exact (no APE)"),
        )),)

    def check_encode_input(self, x, device, **kwargs):
        if kwargs:
            raise InputError(f"compressor_state_v41.encode takes no keyword arguments (no positions, no ape), "
                             f"got {sorted(kwargs)}")
        if not (isinstance(x, tuple) and len(x) == 2):
            raise InputTypeError(f"compressor_state_v41.encode takes x = (kv, score), got {describe(x)}")
        kv, score = x
        check_tensor("kv", kv, dtypes=FLOAT_DTYPES, shape=(None, self.width), device=device)
        n = kv.shape[0]
        check_tensor("score", score, dtypes=FLOAT_DTYPES, shape=(n, self.width), device=device)
        return n, {}

    def encode_rows(self, x) -> torch.Tensor:
        # A cache write is not differentiable: inputs that require grad are read as plain values.
        kv, score = (t.detach() for t in x)
        w = self.width
        rows = torch.empty((kv.shape[0], 2 * w), dtype=torch.float32, device=kv.device)
        rows[:, :w] = kv
        rows[:, w:] = score
        return rows.view(torch.uint8)
