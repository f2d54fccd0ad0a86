"""Argument checks of the transfer checksums (spec/checks.md's convention).

Metadata (types, dtypes, shapes, devices, the cache against its layout) is checked on the host
before anything is read, always. Values (page ids, row bounds) are checked on the host when
they are on the host already (CPU tensors: free) or in strict mode; CUDA ``pages``/``rows`` in
the default mode are checked on the device: nothing outside the cache is read for an invalid
entry, its sums are -1 (no checksum is negative) and the first violation goes to the device's
error record (``kvformats.raise_pending``), with no host synchronization.
"""

from __future__ import annotations

import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.layout import Layout
from kvformats.runtime import deferred
from kvformats.validation import check_cache

INVALID = -1  # the sums of an entry the device path did not read


def _site() -> int:
    """The record site of page_checksums' pages (and rows)."""
    return deferred.site("page_checksums", "pages")


def check_backend(backend) -> None:
    if backend not in ("auto", "torch", "triton") or not isinstance(backend, str):
        raise InputError(f"backend must be auto, torch or triton, got {backend!r}")


def check_cache_tensor(layout, cache) -> None:
    """A real (not meta) cache that fits its layout."""
    if not isinstance(layout, Layout):
        raise InputTypeError(f"layout must be a kvformats Layout, got {describe(layout)}")
    check_cache(layout, cache)
    if cache.device.type == "meta":
        raise InputError(f"the cache is on the meta device: it has no bytes to checksum ({describe(cache)})")


def _index_tensor(what: str, t, cache: torch.Tensor, dims: int) -> torch.Tensor:
    if isinstance(t, (list, tuple)):
        if not all(type(v) is int for v in (t if dims == 1 else [v for row in t for v in row])):  # noqa: E721
            raise InputTypeError(f"{what} must be ints, got {t!r}")
        try:
            t = torch.tensor(t, dtype=torch.int64)
        except (OverflowError, RuntimeError, ValueError) as err:  # ints beyond int64, ragged rows
            raise InputError(f"{what} cannot be an int64 tensor: {err}") from None
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.dim() != dims:
        raise InputTypeError(f"{what} must be a {dims}-D int32/int64 tensor, got {describe(t)}")
    if t.device.type not in ("cpu", cache.device.type) or (t.device.type != "cpu" and t.device != cache.device):
        raise InputError(f"{what} must be on the CPU or the cache's device {cache.device}, got {describe(t)}")
    return t


def checksum_args(layout: Layout, cache: torch.Tensor, pages, rows, include_pad, check):
    """(pages int64 ``[P]``, rows int64 ``[P, 2]``, both on the cache's device) after the
    checks of the module doc; raises before any read."""
    check_cache_tensor(layout, cache)
    if not isinstance(include_pad, bool):
        raise InputTypeError(f"include_pad must be a bool, got {describe(include_pad)}")
    pages = _index_tensor("pages", pages, cache, 1)
    rows = _index_tensor("rows", rows, cache, 2)
    if rows.shape != (pages.shape[0], 2):
        raise InputError(f"rows must be [{pages.shape[0]}, 2] (one [start, stop) per page), got {describe(rows)}")
    n, size = cache.shape[0], layout.page_size
    if deferred.on_host(check, pages) and deferred.on_host(check, rows):  # raises for a bad check value
        p, r = pages.cpu().to(torch.int64), rows.cpu().to(torch.int64)
        bad = ((p < 0) | (p >= n)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise InputError(f"pages[{i}] = {int(p[i])} is not a page of the cache (valid: 0..{n - 1}); "
                             f"nothing was read")
        bad = ((r[:, 0] < 0) | (r[:, 0] > r[:, 1]) | (r[:, 1] > size)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise InputError(f"rows[{i}] = {r[i].tolist()} is not a row range [start, stop) of a {size}-row "
                             f"page (0 <= start <= stop <= {size}); nothing was read")
        return pages.to(cache.device, torch.int64), rows.to(cache.device, torch.int64)
    pages, rows = pages.to(cache.device, torch.int64), rows.to(cache.device, torch.int64)
    record_invalid(pages, rows, n, size)
    return pages, rows


def valid_entries(pages: torch.Tensor, rows: torch.Tensor, num_pages: int, page_size: int) -> torch.Tensor:
    """bool ``[P]``: entries whose page and rows are valid (no host read)."""
    return (pages >= 0) & (pages < num_pages) & (rows[:, 0] >= 0) & (rows[:, 0] <= rows[:, 1]) & \
        (rows[:, 1] <= page_size)


def record_invalid(pages: torch.Tensor, rows: torch.Tensor, num_pages: int, page_size: int) -> None:
    """Record the first invalid page, else the first invalid row bound, on the device's error
    record (torch operations, no host read). Already-checked arguments record nothing."""
    if pages.numel() == 0:
        return
    bad_page = (pages < 0) | (pages >= num_pages)
    deferred.record_where(bad_page, pages, num_pages, deferred.Check.SLOT_RANGE, _site())
    bad_rows = ((rows < 0) | (rows > page_size)) | torch.stack([rows[:, 0] > rows[:, 1]] * 2, 1)
    deferred.record_where(bad_rows, rows, page_size, deferred.Check.SLOT_RANGE, _site())
