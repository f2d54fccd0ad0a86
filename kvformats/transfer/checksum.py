"""Per-page, per-region checksums of the bytes a plan moves, computed where the pages live.

The value (normative; ``reference_checksums`` computes it with torch on any device, the Triton
kernel ``kvformats_kernels/transfer.py`` the same integers on the GPU). For page p, region g and
the rows [a, b) of p that move, the region's bytes of those rows in row order form a stream of
n = (b - a) * nbytes bytes, zero-padded to a multiple of 4; word w is the little-endian uint32
of stream bytes 4w .. 4w + 3. With ``fmix32`` the MurmurHash3 finalizer (a bijection of the
32-bit integers: v ^= v >> 16; v *= 0x85EBCA6B; v ^= v >> 13; v *= 0xC2B2AE35; v ^= v >> 16,
mod 2**32), each of the two lanes l is

    lane_l = sum over w of fmix32(word_w XOR fmix32(w XOR SEED_l))  mod 2**32

(``SEEDS``; an empty stream gives 0). Why this shape: the old sums (sum x_j and sum (j+1) x_j)
were linear in the bytes and in the position, so two equal-length records of equal byte sum
swapped, or a (+d, -2d, +d) change of three bytes, changed neither. Here each word is mixed with
a pad that is a nonlinear function of its position, then mixed again, so a contribution depends
on value and position together. What that guarantees: any change confined to one word (every
single-byte change among them) changes both lanes, since fmix32 is a bijection. Any other change
goes unseen only if its per-word differences cancel mod 2**32 in both lanes at once: nothing
rules that out for a particular change, and for changes not crafted against this function it is
about as likely as two random 64-bit values being equal (an estimate, not a proof). It is a
transfer check, not a cryptographic hash: anyone who knows the function can build a collision.

Per word the mix costs a few integer operations (murmur3's finalizer constants; the seeds are
digits of pi); a stream position is at most 2**32 - 1 words (pages of up to 16 GiB per region).
Neither implementation reads a value back to the host, so a sender can checksum right after
its prefill without a synchronization. The page pad (a per-page region) counts only when whole
pages move (``include_pad``).

Across page geometries (``kvformats.transfer.geometry``) the entries are not pages but chunks of
token rows, each inside one page on both sides: ``row_checksums`` gives the same value (the
stream of a region's bytes of those rows, in row order) whatever page and row the chunk has on
each side, over the row regions only (the page pad is each side's own), so a source's
checksums keyed by (cache, token-row range, region) compare with the destination's.
"""

from __future__ import annotations

import functools
import sys

import torch

from kvformats.caches.regions import region_nbytes
from kvformats.codec import registry
from kvformats.errors import BackendUnavailableError, UnsupportedError
from kvformats.layout import Layout, storage_bytes
from kvformats.transfer import checks

MASK32 = 0xFFFFFFFF
SEEDS = (0x243F6A88, 0x85A308D3)  # the lanes' seeds: the first fractional words of pi, nothing hidden
C1, C2 = 0x85EBCA6B, 0xC2B2AE35  # fmix32's multipliers
CHUNK_PAGES = 64  # pages per torch step: bounds the workspace (64 pages x 64 rows x 656 B, a few copies)


def _signed(c: int) -> int:
    """The int32 holding the bits of uint32 ``c`` (torch has no uint32 arithmetic on every device)."""
    return c - (1 << 32) if c >= 1 << 31 else c


def fmix32(v: torch.Tensor) -> torch.Tensor:
    """fmix32 of an int32 tensor read as uint32 bits, in place (``v`` must be a fresh tensor).
    int32 products wrap mod 2**32 as uint32 ones do; an int32 right shift copies the sign bit,
    so each shift is masked to a logical one."""
    for shift, mul in ((16, C1), (13, C2), (16, None)):
        t = v >> shift
        t &= (1 << (32 - shift)) - 1
        v ^= t
        if mul is not None:
            v *= _signed(mul)
    return v


@functools.lru_cache(maxsize=64)
def word_pads(n_words: int, device: torch.device) -> torch.Tensor:
    """int32 ``[2, n_words]``: fmix32(w XOR SEED_l) of every word position, one row per lane
    (independent of the data, so made once per region size and device)."""
    w = torch.arange(n_words, dtype=torch.int64, device=device)
    return torch.stack([fmix32((w ^ seed).to(torch.int32)) for seed in SEEDS])  # wraps to int32 bits


def region_geometry(layout: Layout, cache: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(in-page offset, row stride, bytes per row, rows) of each region, the page pad as one row."""
    out = []
    for r in layout.regions:
        nbytes = region_nbytes(layout, cache, r)
        out.append((r.offset, 0, nbytes, 1) if r.per_page else (r.offset, r.row_stride, nbytes, layout.page_size))
    return out


def _row_bounds(rows: torch.Tensor, n_rows: int, per_page: bool, include_pad: bool):
    """(a, b) int64 ``[P]`` of one region, clamped to [0, n_rows] with a <= b: a no-op on valid
    rows; an invalid entry of the device path then indexes inside the page, and its sums are
    replaced by -1 afterwards."""
    if per_page:
        zero = torch.zeros_like(rows[:, 0])
        return zero, zero + 1 if include_pad else zero
    a = rows[:, 0].clamp(0, n_rows)
    return a, torch.maximum(rows[:, 1].clamp(0, n_rows), a)


def _streams(x: torch.Tensor, a: torch.Tensor, n: torch.Tensor, nbytes: int, whole: bool) -> torch.Tensor:
    """int32 ``[p, words]``: each page's stream (its rows from a, n bytes, zero beyond) as
    little-endian words. ``x``: uint8 ``[p, rows, nbytes]``; ``whole``: every stream is the whole
    page (known on the host for CPU tensors): no shift, no mask."""
    p, length = x.shape[0], x.shape[1] * nbytes
    flat = x.reshape(p, length)
    words = -(-length // 4)
    if whole and length == 4 * words:
        # through 1-D: a single page may carry any stride, which view(int32) refuses
        return flat.contiguous().view(-1).view(torch.int32).view(p, words)
    if not whole:
        start = a * nbytes
        idx = (start[:, None] + torch.arange(length, device=x.device)).clamp(max=length - 1)
        flat = torch.where((torch.arange(length, device=x.device)[None, :] < n[:, None]), flat.gather(1, idx), 0)
    out = torch.zeros(p, 4 * words, dtype=torch.uint8, device=x.device)
    out[:, :length] = flat
    return out.view(torch.int32)  # little-endian words (checked in _reference)


def _cpu_streams(view: torch.Tensor, pages: torch.Tensor, a: torch.Tensor, n: torch.Tensor, nbytes: int):
    """(int32 ``[p, words]`` streams, whether each is whole) of CPU entries: only the rows
    ``[a, a + span)`` of each page, ``span`` the longest entry, so an entry of a few rows (a chunk
    of a plan across geometries) reads a few rows, not its page."""
    span = -(-int(n.max()) // nbytes) if n.numel() else 0
    rows = (a[:, None] + torch.arange(span)).clamp(max=view.shape[1] - 1)
    x = view[pages[:, None], rows]  # [p, span, nbytes]
    full = bool((n == span * nbytes).all())
    return _streams(x, torch.zeros_like(a), n, nbytes, full), full


def reference_checksums(layout: Layout, cache: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor, *,
                        include_pad: bool = False, check=True) -> torch.Tensor:
    """int64 ``[P, regions, 2]`` (the two lanes) of ``pages [P]`` with moved rows ``rows [P, 2]``
    (torch; any device). Arguments are checked as ``page_checksums`` checks them."""
    pages, rows = checks.checksum_args(layout, cache, pages, rows, include_pad, check)
    return _reference(layout, cache, pages, rows, include_pad)


def _reference(layout, cache, pages, rows, include_pad) -> torch.Tensor:
    if sys.byteorder != "little":  # the int32 view below reads words in host order
        raise UnsupportedError("the torch checksum reads little-endian words: a big-endian host is not supported")
    u8, stride = layout.byte_pages(cache)
    whole = storage_bytes(cache)
    start = u8.storage_offset()
    out = torch.zeros(pages.shape[0], len(layout.regions), 2, dtype=torch.int64, device=cache.device)
    valid = checks.valid_entries(pages, rows, cache.shape[0], layout.page_size)
    safe = torch.where(valid, pages, 0)  # an invalid entry reads page 0 (if any), then its sums become -1
    for g, (region, (offset, row_stride, nbytes, n_rows)) in enumerate(zip(layout.regions,
                                                                           region_geometry(layout, cache))):
        if nbytes == 0 or cache.shape[0] == 0:
            continue
        view = whole.as_strided((cache.shape[0], n_rows, nbytes), (stride, row_stride, 1), start + offset)
        a_all, b_all = _row_bounds(rows, n_rows, region.per_page, include_pad)
        pads = word_pads(-(-n_rows * nbytes // 4), cache.device)
        for c in range(0, pages.shape[0], CHUNK_PAGES):
            sl = slice(c, c + CHUNK_PAGES)
            a, n = a_all[sl], (b_all[sl] - a_all[sl]) * nbytes
            if cache.device.type == "cpu":  # host reads are free here: read only the rows that count
                words, full = _cpu_streams(view, safe[sl], a, n, nbytes)
            else:
                words, full = _streams(view[safe[sl]], a, n, nbytes, False), False
            live = None if full else torch.arange(words.shape[1], device=cache.device)[None, :] * 4 < n[:, None]
            for lane in range(2):
                h = fmix32(words ^ pads[lane, :words.shape[1]])
                if live is not None:
                    h = torch.where(live, h, 0)
                out[sl, g, lane] = h.sum(1, dtype=torch.int64) & MASK32
    return torch.where(valid[:, None, None], out, checks.INVALID)


def page_checksums(layout: Layout, cache: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor, *,
                   include_pad: bool = False, backend: str = "auto", check=True) -> torch.Tensor:
    """int64 ``[P, regions, 2]``: the checksum (module doc) of each region over the rows
    ``rows [P, 2]`` ([start, stop) in the page) of ``pages [P]``, by ``backend``: "torch",
    "triton" (the kernel) or "auto" (the kernel for CUDA caches where Triton is installed,
    torch otherwise). ``pages`` and ``rows``: int32/int64 tensors on the CPU or the cache's
    device (moved there).

    Checks (spec/checks.md): the layout, cache and argument types, shapes and devices always,
    before anything is read (InputError, InputTypeError, LayoutError). Page ids in
    [0, num_pages) and 0 <= start <= stop <= page_size: on the host before any read for CPU
    ``pages``/``rows`` (free: they are on the host already) and in strict mode
    (``check="strict"``, ``kvformats.strict_checks()``), raising InputError; for CUDA
    ``pages``/``rows`` otherwise no host read: nothing outside the cache is read for an entry
    with an invalid page or rows (the kernel masks all its loads), its sums are -1 (no checksum
    is negative), and the first violation is recorded on the device for
    ``kvformats.raise_pending``. ``check=False`` records on every device."""
    checks.check_backend(backend)
    pages, rows = checks.checksum_args(layout, cache, pages, rows, include_pad, check)
    if backend == "auto":
        backend = "triton" if cache.is_cuda and _kernel() is not None else "torch"
    if backend == "torch":
        return _reference(layout, cache, pages, rows, include_pad)
    kernel = _kernel()
    if kernel is None:
        raise BackendUnavailableError("the Triton checksum needs triton: pip install 'kvformats[triton]'")

    u8, stride = layout.byte_pages(cache)
    geometry = tuple((offset + u8.storage_offset(), row_stride, nbytes, n_rows, r.per_page)
                     for r, (offset, row_stride, nbytes, n_rows) in zip(layout.regions,
                                                                        region_geometry(layout, cache)))
    return kernel(storage_bytes(cache), pages, rows, stride, geometry, include_pad, cache.shape[0], layout.page_size)


def _kernel():
    """The Triton launcher, from the kernel package's table; None where Triton does not import."""
    return registry.library_kernel("transfer", "page_checksums")


def row_regions(layout: Layout) -> tuple[str, ...]:
    """The regions ``row_checksums`` covers, in order: every region but the page pad (a
    per-page region, whose size depends on the page geometry)."""
    return tuple(r.name for r in layout.regions if not r.per_page)


def row_checksums(layout: Layout, cache: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor, *,
                  backend: str = "auto", check=True) -> torch.Tensor:
    """int64 ``[C, len(row_regions(layout)), 2]``: the checksum of each row region over chunk
    ``c``'s rows ``rows[c]`` ([start, stop) in page ``pages[c]``; a page may hold several
    chunks). The value depends on the chunk's bytes only, not on where its page lies, so two
    caches of one record in pages of different sizes compare chunk by chunk. Checks and devices
    as ``page_checksums``, whose per-page regions it leaves out."""
    sums = page_checksums(layout, cache, pages, rows, include_pad=False, backend=backend, check=check)
    return sums[:, :len(row_regions(layout))]  # the page pad is the last region (Layout.regions): a view
