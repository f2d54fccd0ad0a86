"""tokenspeed-kernel 0.1.4's V4.1 paged fields as kvformats layouts: each ``cache_format`` name,
its row, and the kvformats layout (and profile) that writes and reads it as tokenspeed does; the
``[pages, 64, row_bytes]`` field seen as a kvformats cache. Shared by the ``dsv41`` drop-ins (the
codecs in ``dsv41``, the model ops in ``_dsv41_rows`` / ``_dsv41_compressor``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvformats.codec.registry import get_format
from kvformats.errors import InputError, InputTypeError, LayoutError, describe
from kvformats.layout import Layout

PAGE_ROWS = 64  # rows of a page of tokenspeed's paged fields ([pages, 64, row_bytes])
ROW_DTYPES = (torch.bfloat16, torch.float32)
SLOT_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class CacheFormat:
    """One of tokenspeed's ``cache_format`` names and the kvformats layout of its rows: ``fmt`` with
    ``params``; ``write`` the profile whose encode is tokenspeed's (None: ``index_v4_rows``),
    ``read`` the profile whose decode reads scale bytes as tokenspeed's gather does."""

    name: str
    dim: int
    row_bytes: int
    fmt: str
    write: str | None
    read: str
    params: dict = field(default_factory=dict)


CACHE_FORMATS = {f.name: f for f in (
    CacheFormat("swa", 512, 528, "fp8_ds_mla_v41", "tokenspeed", "tokenspeed", {"head_dim": 512}),
    CacheFormat("global", 512, 288, "fp4_ds_mla_v41", "tokenspeed", "tokenspeed", {"head_dim": 512}),
    CacheFormat("index", 128, 68, "mxfp4_indexer", "vllm", "tokenspeed", {"head_dim": 128}),
    CacheFormat("swa_v4", 512, 584, "fp8_ds_mla", "tokenspeed", "tokenspeed", {"head_dim": 512, "rope_dim": 64}),
    CacheFormat("global_v4", 512, 584, "fp8_ds_mla", "tokenspeed", "tokenspeed", {"head_dim": 512, "rope_dim": 64}),
    CacheFormat("index_v4", 128, 132, "fp8_indexer", None, "deepgemm-ref", {"head_dim": 128}),
)}
_LAYOUTS: dict = {}


def layout_of(cache_format: str, page_size: int = PAGE_ROWS, read: bool = False) -> Layout:
    """The kvformats layout of ``cache_format``'s rows in pages of ``page_size`` rows, with the
    profile that writes (or, ``read``, reads) them as tokenspeed does."""
    key = (cache_format, page_size, read)
    lay = _LAYOUTS.get(key)
    if lay is None:
        spec = _spec(cache_format)
        profile = spec.read if read or spec.write is None else spec.write
        lay = _LAYOUTS[key] = get_format(spec.fmt, page_size=page_size, profile=profile, **spec.params)
    return lay


def _spec(cache_format) -> CacheFormat:
    spec = CACHE_FORMATS.get(cache_format) if isinstance(cache_format, str) else None
    if spec is None:
        raise InputError(f"cache_format must be one of {sorted(CACHE_FORMATS)}, got {describe(cache_format)}")
    return spec


def paged_field(cache, cache_format: str) -> torch.Tensor:
    """tokenspeed's uint8 ``[pages, 64, row_bytes]`` field as the kvformats cache it is: the
    ``[pages, 64 * row_bytes]`` view with the field's page stride (zero-copy; writes go to ``cache``)."""
    spec = _spec(cache_format)
    if not isinstance(cache, torch.Tensor):
        raise InputTypeError(f"cache must be a torch.Tensor, got {describe(cache)}")
    want = f"{spec.name} cache must be uint8 [pages, {PAGE_ROWS}, {spec.row_bytes}]"
    if cache.dtype != torch.uint8:
        raise InputTypeError(f"{want}, got {describe(cache)}")
    if cache.dim() != 3 or tuple(cache.shape[1:]) != (PAGE_ROWS, spec.row_bytes):
        raise LayoutError(f"{want}, got {describe(cache)}")
    if cache.stride(2) != 1 or cache.stride(1) != spec.row_bytes:
        raise LayoutError(f"{want} with contiguous page bytes (strides [page, {spec.row_bytes}, 1]), got strides "
                          f"{list(cache.stride())}")
    return cache.as_strided((cache.shape[0], PAGE_ROWS * spec.row_bytes), (cache.stride(0), 1),
                            cache.storage_offset())
