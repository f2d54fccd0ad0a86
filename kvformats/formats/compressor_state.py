"""compressor_state: DeepSeek V4 compressor residual state (spec/upstream.md §5).

float32 cache ``[pages, page_size, 2W]``; one row per token position holds
``[kv (W) | score + ape[p % ratio] (W)]`` with ``W = halves(ratio) * head_dim``.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, one_of, positive
from kvformats.validation import FLOAT_DTYPES, INDEX_DTYPES, check_tensor

RATIOS = (4, 128)


def halves(ratio: int) -> int:
    """The halves of a state row: 2 for ratio 4, whose windows overlap (a window of 8 positions
    reads the first half of its older 4 rows and the second half of its newer 4), 1 for ratio
    128. A row is ``halves * head_dim`` wide and a window ``halves * ratio`` positions long."""
    return 2 if ratio == 4 else 1


def _encode_args(layout, n, values, gen):
    """``(kv, score)`` of N(0, 1) float32 values (the state keeps any value exactly, so no spread
    of magnitudes is needed), positions below 2^20 and an ape table; decode gives back
    ``[kv | score + ape[p % ratio]]`` exactly."""
    w = layout.width
    kv = torch.randn(n, w, generator=gen)
    score = torch.randn(n, w, generator=gen)
    ape = torch.randn(layout.ratio, w, generator=gen)
    pos = torch.randint(0, 1 << 20, (n,), generator=gen)
    return (kv, score), {"positions": pos, "ape": ape}, _reference(layout, (kv, score), positions=pos, ape=ape)


# encode takes the positions and APE rows as well (check_encode_input hands them over)
def _reference(layout, x, *, positions: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """``[kv | score + ape[p % ratio]]`` in float32, what decode gives back exactly."""
    kv, score = x
    ape = ape.reshape(layout.ratio, layout.width)  # the halves form, as one row per residue
    return torch.cat([kv.float(), score.float() + ape.float()[positions.long() % layout.ratio]], dim=1)


@attrs.frozen(kw_only=True)
class CompressorState(Layout):
    """``CompressorState(head_dim=512, ratio=4, page_size=4)``: float32 rows of 2W values.

    ``encode((kv, score), cache, slots, positions=..., ape=...)``: kv, score ``[N, W]``,
    positions int ``[N]``, ape ``[ratio, W]`` in checkpoint order (no reordering), or its halves
    ``[ratio, 2, W/2]`` with any strides (``ape[r] = cat(ape[r, 0], ape[r, 1])``); stores kv
    and ``score + ape[p % ratio]`` in float32. ``decode`` returns ``(kv, score_state)``.
    ``gather`` returns the rows' bytes (uint8 ``[N, 8W]``; ``.view(torch.float32)`` for values).
    """

    name = "compressor_state"
    container_dtype = torch.float32
    examples = Examples(
        params=tuple(dict(ratio=r, head_dim=h) for r in RATIOS for h in (1, 2, 3, 8, 16)),
        page_size_range=(1, 8), value_idempotent=True, small_params={"head_dim": 8, "page_size": 4},
        one_block={"head_dim": 1},  # no quantization blocks: the narrowest state
        encode_args_of=_encode_args, reference_of=_reference)


    head_dim: int = attrs.field(default=512, validator=positive)
    ratio: int = attrs.field(default=4, validator=one_of(*RATIOS))
    page_size: int = attrs.field(default=4, validator=positive)

    @property
    def overlap(self) -> bool:
        """Ratio 4 compresses overlapping windows, so each row carries two halves."""
        return halves(self.ratio) == 2

    @property
    def decode_dtype(self) -> None:
        return None  # decode returns (kv, score_state)

    @property
    def decode_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.float32)

    @property
    def width(self) -> int:
        """W, the width of the kv half and of the score half."""
        return halves(self.ratio) * self.head_dim

    def _segments(self):
        return (Segment("state", (
            Field("kv", "float32", self.width, doc="kv projection, exact"),
            Field("score", "float32", self.width, doc="score + ape[p % ratio]"),
        )),)

    def cache_shape(self, num_pages: int) -> tuple[int, ...]:
        return (num_pages, self.page_size, 2 * self.width)

    def check_encode_input(self, x, device, **kwargs):
        extra = set(kwargs) - {"positions", "ape"}
        if extra or "positions" not in kwargs or "ape" not in kwargs:
            raise InputError(f"compressor_state.encode needs keyword arguments positions= and ape=, "
                             f"got {sorted(kwargs)}")
        if not (isinstance(x, tuple) and len(x) == 2):
            raise InputTypeError(f"compressor_state.encode takes x = (kv, score), got {describe(x)}")
        kv, score = x
        w = self.width
        check_tensor("kv", kv, dtypes=FLOAT_DTYPES, shape=(None, w), device=device)
        n = kv.shape[0]
        check_tensor("score", score, dtypes=FLOAT_DTYPES, shape=(n, w), device=device)
        check_tensor("positions", kwargs["positions"], dtypes=INDEX_DTYPES, shape=(n,), device=device)
        ape = kwargs["ape"]
        if isinstance(ape, torch.Tensor) and ape.dim() == 3 and w % 2 == 0:
            # the halves form: ape[r] = cat(ape[r, 0], ape[r, 1]), any strides, so that an engine's
            # reordered table can be passed as a view of itself (no copy per call)
            check_tensor("ape", ape, dtypes=FLOAT_DTYPES, shape=(self.ratio, 2, w // 2), device=device)
        else:
            check_tensor("ape", ape, dtypes=FLOAT_DTYPES, shape=(self.ratio, w), device=device)
        return n, kwargs

    def encode_rows(self, x, *, positions: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # A cache write is not differentiable: inputs that require grad are read as plain values
        # (torch.add(out=) refuses them, and the byte formats accept them).
        kv, score = (t.detach() for t in x)
        w = self.width
        ape = ape.detach().reshape(self.ratio, w)  # the halves form [ratio, 2, W/2] as [ratio, W]
        rows = torch.empty((kv.shape[0], 2 * w), dtype=torch.float32, device=kv.device)
        rows[:, :w] = kv
        torch.add(score.float(), ape.float()[positions.long() % self.ratio], out=rows[:, w:])
        return rows.view(torch.uint8)

    def decode_rows(self, rows: torch.Tensor):
        values = rows.view(torch.float32)
        return values[:, :self.width], values[:, self.width:]
