"""tokenspeed-kernel 0.1.4's DeepSeek V4.1 cache codecs (``tokenspeed_kernel.ops.attention.dsv41``)
under their own names, on kvformats' layouts:

    # from tokenspeed_kernel.ops.attention.dsv41 import cache_gather, cache_pack, cache_scatter, cache_unpack
    from kvformats.compat.tokenspeed_kernel.dsv41 import cache_gather, cache_pack, cache_scatter, cache_unpack

``cache_pack(rows, cache_format, out)``, ``cache_unpack(packed, cache_format, out)``,
``cache_scatter(rows, cache, slots, cache_format)`` and ``cache_gather(cache, slots, cache_format,
out)`` take tokenspeed's parameters (names, order, no defaults: ``out`` is passed, ``None`` to
allocate), write where tokenspeed writes (``out`` or the paged field, in place) and return what it
returns (the destination; ``None`` from ``cache_scatter``). A paged field is tokenspeed's uint8
``[pages, 64, row_bytes]`` tensor: its page bytes are page-planar (64 data records, then 64 scale
records) and contiguous, so the ``[pages, 64 * row_bytes]`` view of it is a kvformats cache of the
layout below, with the field's page stride. A packed row matrix ``[N, row_bytes]`` is the same
layout with pages of one row.

============ ========= ===================================================================
cache_format row bytes kvformats layout (bytes equal to tokenspeed's ``_pack_kernel`` on bf16 rows)
============ ========= ===================================================================
'swa'        528       ``fp8_ds_mla_v41`` profile tokenspeed
'global'     288       ``fp4_ds_mla_v41`` profile tokenspeed
'index'      68        ``mxfp4_indexer`` profile vllm (head_dim 128); read as profile tokenspeed
'swa_v4'     584       ``fp8_ds_mla`` profile tokenspeed (a field of unpadded 37376 B pages)
'global_v4'  584       the same as 'swa_v4' (tokenspeed's one V4 row for both roles)
'index_v4'   132       no profile: the reference path below, on ``fp8_indexer``'s page geometry
============ ========= ===================================================================

Each call validates everything before anything is written (kvformats' typed errors:
``InputError``, ``InputTypeError``, ``LayoutError``, all ``ValueError``), then makes the native
calls (``layout.encode``, ``layout.decode``: the reference or the Triton kernels, as
``backend="auto"`` picks). Where tokenspeed's contract is explicit, it applies: negative and
out-of-capacity slots skip writes (scatter) or read zero rows (gather); ``out=None`` allocates
bf16 rows. Where kvformats departs:

* CPU tensors run (tokenspeed's kernels take CUDA / ROCm tensors only); tensors on different
  devices are refused.
* rows that are not bf16 / fp32, caches and packed rows that are not uint8: ``InputTypeError``
  (tokenspeed: ``ValueError``, or ``NoKernelFoundError``, a ``RuntimeError``, where its kernel
  selection keys on that tensor's dtype: ``rows`` of pack / scatter, ``packed``, gather's
  ``cache``).
* float32 rows are accepted. 'swa', 'global', 'swa_v4', 'global_v4' round them to bf16 first
  (kvformats' input rounding of the MLA rows); tokenspeed quantizes the float32 values, so rows
  that are not bf16 values can get other codes (and scales). 'index' quantizes float32 as given
  (profile vllm), which departs from tokenspeed only on 32-blocks whose ``amax / 6`` lies a few
  float32 ulps above a power of two (tests/interop/test_released_writers.py); 'index_v4' gives
  tokenspeed's bytes.
* a field whose page bytes are not contiguous (``cache.stride()[1:] != (row_bytes, 1)``), or whose
  pages overlap: ``LayoutError`` (tokenspeed's portable codec maps page-planar offsets onto any
  strides). ``slots=None`` (tokenspeed: slot = row index, undocumented): ``InputTypeError``.
* a non-negative slot named twice in one ``cache_scatter`` (tokenspeed requires unique slots and
  does not check): ``InputError`` on CPU tensors and in strict mode; on a GPU by default one of
  the rows is stored (kvformats' checks, spec/checks.md).
* scale byte 0xFF of a 'swa' record reads NaN (kvformats' ``fp8_ds_mla_v41`` reading; tokenspeed's
  kernel reads ``e4m3 * 2^128``: +-Inf, NaN for zero codes). No encoder writes that byte.
* float32 ``out`` of 'swa', 'swa_v4', 'global_v4': the bf16 decode widened (kvformats decodes
  these rows to bf16) where tokenspeed stores the float32 product ``e4m3 * 2^(s - 127)``; they
  differ only for scale bytes 0x00-0x02 (scales 2^-127 to 2^-125, whose subnormal products bf16
  cannot hold), which no encoder writes (their scales are at least 2^-22). 'global' and the
  indexer rows read tokenspeed's float32 values.

'index_v4' (tokenspeed's Hopper indexer row: 128 e4m3 values, one little-endian float32 scale
``fl32(max(amax, 1e-6) * fl32(1/448))``, values ``e4m3(clamp(x / scale, +-448))``) equals no
``fp8_indexer`` profile (deepgemm-ref divides ``max(amax, 1e-4)`` by 448; tokenspeed and vllm
round the scale up to a power of two). Its encode here is a small torch reference of that rule
(``index_v4_rows``, any device; ``cache_scatter`` reads the number of live slots on the host, one
synchronization on a GPU); its reads are ``fp8_indexer``'s decode (element times stored float32
scale, the same for any scale), through the normal dispatch.
"""

from __future__ import annotations


import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.compat.tokenspeed_kernel._dsv41_fields import (  # noqa: F401  (CACHE_FORMATS: the table, read here)
    CACHE_FORMATS, INT32_MAX, PAGE_ROWS, ROW_DTYPES, SLOT_DTYPES, CacheFormat, _spec, layout_of, paged_field)
from kvformats.compat._replay import aranged, replayed
from kvformats.deepseek_v41.rows import fp8_row_scales
from kvformats.numerics import codes as nx
from kvformats.validation import check_slots
from kvformats.runtime import deferred

# the released __all__'s order of the names mirrored here
__all__ = ["cache_pack", "cache_unpack", "cache_scatter", "cache_gather", "index_q_quantize",
           "compressor_tail_scatter", "compressor_pool", "swa_rope_scatter"]

# ----- argument checks (tokenspeed's, as typed errors; all before any write) -------------------
def _check_rows(rows, spec: CacheFormat) -> int:
    if not isinstance(rows, torch.Tensor):
        raise InputTypeError(f"rows must be a torch.Tensor, got {describe(rows)}")
    if rows.dtype not in ROW_DTYPES:
        raise InputTypeError(f"rows must be BF16/FP32 [rows, {spec.dim}], got {describe(rows)}")
    if rows.dim() != 2 or rows.shape[1] != spec.dim:
        raise InputError(f"rows must be BF16/FP32 [rows, {spec.dim}] for {spec.name!r}, got {describe(rows)}")
    return rows.shape[0]


def _check_slots(slots, shape: tuple | None, device: torch.device) -> None:
    if not isinstance(slots, torch.Tensor):
        raise InputTypeError(f"slots must be an int32/int64 tensor, got {describe(slots)}")
    if slots.dtype not in SLOT_DTYPES:
        raise InputTypeError(f"slots must be int32/int64, got {describe(slots)}")
    if shape is not None and slots.shape != shape:
        raise InputError(f"slots must be int32/int64 with shape {shape}, got {describe(slots)}")
    if slots.device != device:
        raise InputError(f"slots must be on the cache's device {device}, got {describe(slots)}")


def _out_dtype(out) -> torch.dtype:
    if out is None:
        return torch.bfloat16
    if not isinstance(out, torch.Tensor):
        raise InputTypeError(f"out must be a torch.Tensor or None, got {describe(out)}")
    if out.dtype not in ROW_DTYPES:
        raise InputTypeError(f"dequantized output must be BF16 or FP32, got {describe(out)}")
    return out.dtype


def _check_out(out, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise InputTypeError(f"out must be a torch.Tensor or None, got {describe(out)}")
    if out.dtype != dtype:
        raise InputTypeError(f"out must be a {dtype} tensor {list(shape)}, got {describe(out)}")
    if out.shape != shape or out.device != device or not out.is_contiguous():
        raise InputError(f"out must be a contiguous {dtype} tensor {list(shape)} on {device}, got {describe(out)}"
                         + ("" if out.is_contiguous() else " (not contiguous)"))


def _live(slots: torch.Tensor, capacity: int) -> torch.Tensor:
    """``slots`` with those at or beyond the capacity turned into -1 (skipped / zero rows), as
    tokenspeed's kernels treat them; on the device, no host read."""
    if slots.dtype == torch.int32 and capacity > INT32_MAX:
        return slots
    return slots.masked_fill(slots >= capacity, -1)


def _rows_out(values: torch.Tensor, out, shape: tuple):
    """The decoded rows delivered as tokenspeed returns them: into ``out`` (rounded to its dtype),
    or a new bf16 tensor of ``shape``."""
    if out is None:
        values = values.to(torch.bfloat16)
        return values if len(shape) == 2 else values.reshape(shape)  # [N, D] rows: already that shape
    (out if len(shape) == 2 else out.view(-1, shape[-1])).copy_(values)
    return out


# ----- 'index_v4': tokenspeed's Hopper FP8 indexer row, which no fp8_indexer profile writes -------
def index_v4_rows(rows: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, 132]`` 'index_v4' rows of float ``rows [N, 128]``, tokenspeed-kernel 0.1.4's rule
    in float32: ``scale = fl32(max(amax, 1e-6) * fl32(1/448))`` (one scale per row, not a power of
    two), values ``e4m3(clamp(fl32(x / scale), -448, 448))`` (round to nearest even), then the
    scale's four little-endian bytes. Finite rows only, as tokenspeed requires."""
    x = rows.float()
    scale = fp8_row_scales(x)  # the rule index_q_quantize's 'index_v4' queries use too
    return torch.cat([nx.e4m3_quantize_by_scale(x, scale), scale.unsqueeze(1).view(torch.uint8)], dim=1)


def _scatter_index_v4(rows: torch.Tensor, cache_2d: torch.Tensor, live: torch.Tensor) -> None:
    lay = layout_of("index_v4")
    check_slots(lay, live, rows.shape[0], cache_2d, check_range=True, unique=True)
    packed = index_v4_rows(rows)
    keep = (live >= 0).nonzero().squeeze(1)  # the one host read of this path
    if keep.numel() == 0:
        return
    slot = live.index_select(0, keep).to(torch.int64)
    page, row = slot // PAGE_ROWS, slot % PAGE_ROWS
    packed = packed.index_select(0, keep)
    lay.segment_view(cache_2d, "values")[page, row] = packed[:, :128]
    lay.segment_view(cache_2d, "scales")[page, row] = packed[:, 128:]


# ----- the four codecs ----------------------------------------------------------------------------
def _encodes(args, kwargs) -> bool:
    """Whether a ``cache_pack`` call is one native encode (every format but 'index_v4', whose torch
    reference is not replayed)."""
    return (args[1] if len(args) > 1 else kwargs.get("cache_format")) != "index_v4"


def _scatters(args, kwargs) -> bool:
    """Whether a ``cache_scatter`` call is one native encode (its rows' slots on the device)."""
    return (args[3] if len(args) > 3 else kwargs.get("cache_format")) != "index_v4"


def _no_out(position: int):
    """Whether a ``cache_unpack`` / ``cache_gather`` call is one native decode: ``out`` (at
    ``position``) None, so no copy into it."""
    return lambda args, kwargs: (args[position] if len(args) > position else kwargs.get("out")) is None


@replayed(plain=_encodes)  # checks, an allocation, the native encode (slots: a kept arange)
def cache_pack(
    rows: torch.Tensor, cache_format: str, out: torch.Tensor | None
) -> torch.Tensor:
    """Quantize BF16/FP32 ``rows [N, D]`` into packed uint8 rows ``[N, row_bytes]`` (each row's
    data bytes, then its scale bytes) written into ``out`` (contiguous uint8), or a new tensor
    for ``out=None``. Returns the destination."""
    spec = _spec(cache_format)
    n = _check_rows(rows, spec)
    shape = (n, spec.row_bytes)
    _check_out(out, shape, torch.uint8, rows.device)
    dest = torch.empty(shape, dtype=torch.uint8, device=rows.device) if out is None else out
    if spec.write is None:
        dest.copy_(index_v4_rows(rows))
    else:  # the packed matrix is a cache of one-row pages; every slot is in it
        layout_of(spec.name, 1).encode(rows, dest, aranged(n, rows.device), check=False)
    return dest


@replayed(plain=_no_out(2))  # checks, views, the native decode
def cache_unpack(
    packed: torch.Tensor, cache_format: str, out: torch.Tensor | None
) -> torch.Tensor:
    """Decode uint8 ``packed [N, row_bytes]`` (any strides) into ``out`` (contiguous BF16/FP32
    ``[N, D]``, values rounded to its dtype), or a new bf16 tensor for ``out=None``. Returns the
    destination."""
    spec = _spec(cache_format)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise InputTypeError(f"packed must be a uint8 row matrix [N, {spec.row_bytes}], got {describe(packed)}")
    if packed.dim() != 2 or packed.shape[1] != spec.row_bytes:
        raise InputError(f"packed must be a uint8 row matrix [N, {spec.row_bytes}] for {spec.name!r}, "
                         f"got {describe(packed)}")
    n = packed.shape[0]
    shape = (n, spec.dim)
    _check_out(out, shape, _out_dtype(out), packed.device)
    if packed.stride(1) != 1 or (n > 1 and packed.stride(0) < spec.row_bytes):
        packed = packed.contiguous()  # kvformats reads rows of contiguous bytes
    values = layout_of(spec.name, 1, read=True).decode(packed, aranged(n, packed.device), check=False)
    return _rows_out(values, out, shape)


@replayed(plain=_scatters)  # checks, a view, the native encode (a host-checked call does more: not recorded)
def cache_scatter(
    rows: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    cache_format: str,
) -> None:
    """Quantize BF16/FP32 ``rows [N, D]`` into the paged ``cache`` field (uint8 ``[pages, 64,
    row_bytes]``, contiguous page bytes) at ``slots [N]`` (int32/int64); negative and
    out-of-capacity slots skip writes, live slots must be unique. Mutates ``cache`` only; returns
    None."""
    spec = _spec(cache_format)
    cache_2d = paged_field(cache, spec.name)
    n = _check_rows(rows, spec)
    if rows.device != cache.device:
        raise InputError(f"rows must be on the cache's device {cache.device}, got {describe(rows)}")
    _check_slots(slots, (n,), cache.device)
    if spec.write is None:
        _scatter_index_v4(rows, cache_2d, _live(slots, cache.shape[0] * PAGE_ROWS))
    elif deferred.on_host(True, slots):  # the host checks (repeats included) see the skipped slots as -1
        layout_of(spec.name).encode(rows, cache_2d, _live(slots, cache.shape[0] * PAGE_ROWS))
    else:
        # on the device the kernel skips slots beyond the capacity itself; check=False leaves them
        # out of the error record, the only check the device makes (no host read, no masking op)
        layout_of(spec.name).encode(rows, cache_2d, slots, check=False)
    return None


@replayed(plain=_no_out(3))  # checks, views, the native decode
def cache_gather(
    cache: torch.Tensor,
    slots: torch.Tensor,
    cache_format: str,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Dequantize the rows at ``slots`` (int32/int64, any shape) of the paged ``cache`` field into
    ``out`` (contiguous BF16/FP32 ``[*slots.shape, D]``), or a new bf16 tensor for ``out=None``;
    negative and out-of-capacity slots give zero rows. Returns the destination."""
    spec = _spec(cache_format)
    cache_2d = paged_field(cache, spec.name)
    _check_slots(slots, None, cache.device)
    shape = (*slots.shape, spec.dim)
    _check_out(out, shape, _out_dtype(out), cache.device)
    # check=False: a slot beyond the capacity reads as a zero row, as tokenspeed's kernel reads it
    values = layout_of(spec.name, read=True).decode(cache_2d, slots if slots.dim() == 1 else slots.reshape(-1),
                                                     check=False)
    return _rows_out(values, out, shape)


# V4.1's model ops (kvformats.deepseek_v41) under tokenspeed's names
from kvformats.compat.tokenspeed_kernel._dsv41_compressor import (  # noqa: E402
    compressor_pool, compressor_tail_scatter)
from kvformats.compat.tokenspeed_kernel._dsv41_rows import index_q_quantize, swa_rope_scatter  # noqa: E402
