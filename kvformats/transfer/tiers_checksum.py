"""Checksums of offloaded rows, geometry-free: per chunk of ``CHUNK_ROWS`` rows and per region.

A tier holds a cache's rows in request order, not pages, so its checksums are taken over rows:
for chunk c (rows ``c * CHUNK_ROWS`` up to the next chunk or the end) and region g (the bytes
``[offset, offset + nbytes)`` of every row), the stream is that region's bytes of the chunk's
rows in row order, and the two lanes are the normative sums of ``kvformats.transfer.checksum``
(position-mixed fmix32 words). So a chunk's checksum equals ``page_checksums`` of a page of
``CHUNK_ROWS`` rows holding the same rows, whatever the page size the rows came from or go to;
tests/transfer/test_tiers_host.py checks that equality. Computed on the rows' device without a
host read.
"""

from __future__ import annotations

import sys
from typing import Sequence

import torch

from kvformats.errors import UnsupportedError
from kvformats.transfer.checksum import MASK32, fmix32, word_pads

CHUNK_ROWS = 64  # rows per checksum: a mismatch names 64 rows, as a V4 page of 64 would
CHUNKS_PER_STEP = 256  # chunks per torch step: bounds the workspace (256 x 64 rows x 8 KiB at most)


def row_spans(layout) -> tuple[tuple[str, int, int], ...]:
    """(region, offset in the gathered row, bytes) of each region of ``layout``'s rows (the page
    pad has no row bytes)."""
    return tuple((r.name, r.row_offset, r.nbytes) for r in layout.regions if not r.per_page)


def checksum_rows(rows: torch.Tensor, spans: Sequence[tuple[str, int, int]], chunk: int = CHUNK_ROWS) -> torch.Tensor:
    """int64 ``[ceil(N / chunk), len(spans), 2]``: the checksum of each chunk of rows (uint8
    ``[N, row_bytes]``) and region (module doc), on the rows' device."""
    if sys.byteorder != "little":  # the int32 views below read words in host order
        raise UnsupportedError("the torch checksum reads little-endian words: a big-endian host is not supported")
    n = rows.shape[0]
    full, rest = divmod(n, chunk)
    out = torch.zeros((full + (rest > 0), len(spans), 2), dtype=torch.int64, device=rows.device)
    for g, (_, offset, nbytes) in enumerate(spans):
        if nbytes == 0:
            continue
        for c0 in range(0, full, CHUNKS_PER_STEP):  # whole chunks, a bounded number at a time
            c1 = min(full, c0 + CHUNKS_PER_STEP)
            out[c0:c1, g] = _sums(rows[c0 * chunk:c1 * chunk, offset:offset + nbytes].reshape(c1 - c0, -1))
        if rest:  # the last chunk, shorter: its own stream, no padding rows to mix
            out[full, g] = _sums(rows[full * chunk:, offset:offset + nbytes].reshape(1, -1))[0]
    return out


def _sums(streams: torch.Tensor) -> torch.Tensor:
    """int64 ``[S, 2]``: both lanes of each stream (uint8 ``[S, length]``), zero-padded to whole
    words as the normative stream is."""
    length = streams.shape[1]
    words = -(-length // 4)
    if 4 * words != length or not streams.is_contiguous() or streams.storage_offset() % 4:  # no int32 view
        padded = torch.zeros((streams.shape[0], 4 * words), dtype=torch.uint8, device=streams.device)
        padded[:, :length] = streams
        streams = padded
    w = streams.view(torch.int32)
    pads = word_pads(words, streams.device)
    return torch.stack([fmix32(w ^ pads[lane]).sum(1, dtype=torch.int64) & MASK32 for lane in range(2)], 1)


def first_mismatch(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int, int] | None:
    """(chunk, region, chunks that differ) of the first difference between two checksum tensors,
    or None (a host read: only after a comparison found one)."""
    bad = (got != want).any(-1)
    if not bool(bad.any()):
        return None
    c, g = (int(v) for v in bad.nonzero()[0])
    return c, g, int(bad.any(-1).sum())
