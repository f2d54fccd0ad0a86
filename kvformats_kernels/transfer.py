"""Launcher of the transfer checksum: one launch per region, one program per page; no host read."""

from __future__ import annotations

import torch
import triton

from kvformats.errors import BackendUnavailableError
from kvformats_kernels import transfer_jit as jit
from kvformats_kernels.settings import SETTINGS

BLOCK = 1024  # words per step of a program


def page_checksums(storage: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor, page_stride: int,
                   geometry: tuple, include_pad: bool, num_pages: int, page_rows: int) -> torch.Tensor:
    """int64 ``[P, regions, 2]``: ``storage`` is the uint8 alias of the cache's whole storage;
    ``geometry`` one (byte offset from the storage start, row stride, bytes per row, rows,
    per_page) per region; ``pages [P]`` and ``rows [P, 2]`` int64 on the storage's device (their
    values need no check: the kernel masks every load by the page's and rows' validity against
    ``num_pages`` and ``page_rows`` and stores -1 for an invalid entry)."""
    if not storage.is_cuda and not SETTINGS.interpret:  # only Triton's interpreter reads CPU tensors
        raise BackendUnavailableError(f"the Triton checksum runs on CUDA caches, got a cache on {storage.device}; "
                                      f"pass backend='torch' (or 'auto')")
    out = torch.zeros(pages.shape[0], len(geometry), 2, dtype=torch.int64, device=storage.device)
    if pages.shape[0] == 0:
        return out
    pages, rows = pages.contiguous(), rows.contiguous()
    for g, (offset, row_stride, nbytes, n_rows, per_page) in enumerate(geometry):
        if nbytes == 0 or num_pages == 0:  # nothing to read: the sums of an empty stream, or -1 below
            continue
        words = (n_rows * nbytes + 3) // 4
        jit.region_checksum_kernel[(pages.shape[0],)](
            storage, pages, rows, out[:, g], page_stride, offset, row_stride, out.stride(0), num_pages, page_rows,
            NBYTES=nbytes, N_ROWS=n_rows, PER_PAGE=per_page, INCLUDE_PAD=include_pad,
            BLOCK=min(BLOCK, triton.next_power_of_2(words)))
    if num_pages == 0 or any(g[2] == 0 for g in geometry):  # regions not launched: mark invalid entries
        ok = (pages >= 0) & (pages < num_pages) & (rows[:, 0] >= 0) & (rows[:, 0] <= rows[:, 1]) & \
            (rows[:, 1] <= page_rows)
        out = torch.where(ok[:, None, None], out, -1)
    return out
