"""Per-page, per-region checksums of the bytes a plan moves, computed where the pages live.

For page p, region g and the rows [a, b) of p that move, take the region's bytes x_j in row
order (j = (row - a) * nbytes + byte) and form

    s1 = sum(x_j) mod 2**32,    s2 = sum((j + 1) * x_j) mod 2**32.

Any single changed byte changes s1; a moved or swapped byte changes s2 (j + 1 < 2**24 for any
page a layout allows in practice). It is a transfer check, not a cryptographic hash. The value
is defined by ``reference_checksums`` (torch, any device); the Triton kernel (the kernel
package's ("transfer", "page_checksums"), read through the registry) computes the same integers
on the GPU. Neither reads a value back to the host, so a sender can checksum right after its
prefill without a synchronization.

The page pad (a per-page region) counts only when whole pages move (``include_pad``).
"""

from __future__ import annotations

import torch

from kvformats.caches.regions import region_nbytes
from kvformats.codec import registry
from kvformats.errors import BackendUnavailableError, InputError
from kvformats.layout import Layout, storage_bytes

MASK32 = 0xFFFFFFFF
CHUNK_PAGES = 64  # pages per torch step: bounds the int64 workspace (64 pages x 64 rows x 656 B x 8 B)


def region_geometry(layout: Layout, cache: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(in-page offset, row stride, bytes per row, rows) of each region, the page pad as one row."""
    out = []
    for r in layout.regions:
        nbytes = region_nbytes(layout, cache, r)
        out.append((r.offset, 0, nbytes, 1) if r.per_page else (r.offset, r.row_stride, nbytes, layout.page_size))
    return out


def _row_bounds(rows: torch.Tensor, per_page: bool, include_pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not per_page:
        return rows[:, 0], rows[:, 1]
    zero = torch.zeros_like(rows[:, 0])
    return zero, zero + 1 if include_pad else zero


def reference_checksums(layout: Layout, cache: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor, *,
                        include_pad: bool = False) -> torch.Tensor:
    """int64 ``[P, regions, 2]`` (s1, s2) of ``pages [P]`` with moved rows ``rows [P, 2]``."""
    u8, stride = layout.byte_pages(cache)
    whole = storage_bytes(cache)
    start = u8.storage_offset()
    out = torch.zeros(pages.shape[0], len(layout.regions), 2, dtype=torch.int64, device=cache.device)
    for g, (region, (offset, row_stride, nbytes, n_rows)) in enumerate(zip(layout.regions,
                                                                           region_geometry(layout, cache))):
        if nbytes == 0:
            continue
        view = whole.as_strided((cache.shape[0], n_rows, nbytes), (stride, row_stride, 1), start + offset)
        a_all, b_all = _row_bounds(rows, region.per_page, include_pad)
        r = torch.arange(n_rows, device=cache.device)[None, :, None]
        k = torch.arange(nbytes, device=cache.device)[None, None, :]
        for c in range(0, pages.shape[0], CHUNK_PAGES):
            sl = slice(c, c + CHUNK_PAGES)
            x = view[pages[sl]].to(torch.int64)
            a, b = a_all[sl, None, None], b_all[sl, None, None]
            x = torch.where((r >= a) & (r < b), x, 0)
            weight = (r - a) * nbytes + k + 1
            out[sl, g, 0] = x.sum((1, 2)) & MASK32
            out[sl, g, 1] = (x * weight).sum((1, 2)) & MASK32
    return out


def page_checksums(layout: Layout, cache: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor, *,
                   include_pad: bool = False, backend: str = "auto") -> torch.Tensor:
    """``reference_checksums`` by ``backend``: "torch", "triton" (the kernel) or "auto" (the
    kernel for CUDA caches where Triton is installed, torch otherwise). ``pages`` and ``rows``
    are moved to the cache's device."""
    if backend not in ("auto", "torch", "triton"):
        raise InputError(f"backend must be auto, torch or triton, got {backend!r}")
    pages = pages.to(cache.device, torch.int64)
    rows = rows.to(cache.device, torch.int64)
    if backend == "auto":
        backend = "triton" if cache.is_cuda and _kernel() is not None else "torch"
    if backend == "torch":
        return reference_checksums(layout, cache, pages, rows, include_pad=include_pad)
    kernel = _kernel()
    if kernel is None:
        raise BackendUnavailableError("the Triton checksum needs triton: pip install 'kvformats[triton]'")

    u8, stride = layout.byte_pages(cache)
    geometry = tuple((offset + u8.storage_offset(), row_stride, nbytes, n_rows, r.per_page)
                     for r, (offset, row_stride, nbytes, n_rows) in zip(layout.regions,
                                                                        region_geometry(layout, cache)))
    return kernel(storage_bytes(cache), pages, rows, stride, geometry, include_pad)


def _kernel():
    """The Triton launcher, from the kernel package's table; None where Triton does not import."""
    return registry.library_kernel("transfer", "page_checksums")
