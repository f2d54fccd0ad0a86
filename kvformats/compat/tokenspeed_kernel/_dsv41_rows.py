"""tokenspeed-kernel 0.1.4's DeepSeek V4.1 row writers ``swa_rope_scatter`` and ``index_q_quantize``
(``tokenspeed_kernel.ops.attention.dsv41``; PyPI, https://github.com/lightseekorg/tokenspeed) under
their own names and signatures, on ``kvformats.deepseek_v41``'s model ops:

    # from tokenspeed_kernel.ops.attention.dsv41 import index_q_quantize, swa_rope_scatter
    from kvformats.compat.tokenspeed_kernel.dsv41 import index_q_quantize, swa_rope_scatter

``swa_rope_scatter(values, positions, cos_sin_cache, cache, slots, cache_format, out)`` writes the
paged field ``cache`` (uint8 ``[pages, 64, row_bytes]``, 'swa' or 'swa_v4') in place, and ``out``
when given, and returns ``out`` (None when None); ``index_q_quantize(q, cache_format, out)``
('index' or 'index_v4') writes ``out`` (or a new bf16 tensor for ``out=None``) and returns it.
Their bytes and values are tokenspeed's Triton solutions' (``triton_dsv41_swa_rope_scatter`` /
``_swa_rope_insert``, ``index_q_quantize``). The mapping onto the kvformats op:

* 'swa' is ``fmt="fp8_ds_mla_v41"``, 'swa_v4' ``fmt="fp8_ds_mla"`` (profile tokenspeed, pages of
  64 rows): the field's ``[pages, 64 * row_bytes]`` view is the kvformats cache (zero-copy).
* slots: tokenspeed writes slots in ``[64, pages * 64)`` only; page 0 is its null page. The
  drop-in passes ``first_slot=64``: the kvformats op writes every slot in ``[64, capacity)`` and
  skips the rest, as tokenspeed does below it and beyond the field.
* positions: tokenspeed clamps negative positions to 0 (they rotate by the table's row 0); the
  drop-in passes ``negative_positions="clamp"``, the op's rule for it. Both are the op's own
  arguments (its reference and its kernel apply them), not torch ops before it: the drop-in is
  checks, a view and the native call, replayed as the native call is (``replayed``), and adds no
  launch of its own. A position at or beyond the table is a device assertion in
  tokenspeed (the whole CUDA context fails); here it is kvformats' value check: InputError on CPU
  tensors and in strict mode before anything is written, on a GPU the token's cache row is not
  written, its ``out`` row holds its unrotated round trip, and the violation is recorded for
  ``kvformats.raise_pending`` (spec/checks.md).
* 'index' is ``fmt="mxfp4_indexer"`` (profile vllm's bytes), 'index_v4' ``fmt="fp8_indexer"``
  with tokenspeed's one-float32-scale rule (``kvformats.deepseek_v41.index_q_quantize``).

Where kvformats departs: CPU tensors run (tokenspeed's kernels take CUDA / ROCm tensors only);
refusals are kvformats' typed errors, raised before anything is written (``InputError``,
``InputTypeError``, ``LayoutError``: all ``ValueError``, as tokenspeed's); a slot named twice
among the written ones raises on CPU tensors and in strict mode (tokenspeed requires unique
slots and does not check); a cos/sin table whose columns are strided is accepted (tokenspeed
refuses it).
"""

from __future__ import annotations

import torch

from kvformats.compat.tokenspeed_kernel import _dsv41_fields as _ts
from kvformats.compat._replay import replayed
from kvformats.deepseek_v41 import rows as _ops
from kvformats.errors import InputError, InputTypeError, describe

__all__ = ["index_q_quantize", "swa_rope_scatter"]  # the released __all__'s order

SWA_FORMATS = {"swa": "fp8_ds_mla_v41", "swa_v4": "fp8_ds_mla"}  # cache_format -> kvformats fmt
INDEX_FORMATS = {"index": "mxfp4_indexer", "index_v4": "fp8_indexer"}


def _kvformats_fmt(cache_format, table: dict, what: str) -> str:
    fmt = table.get(cache_format) if isinstance(cache_format, str) else None
    if fmt is None:
        raise InputError(f"cache_format must be one of {sorted(table)} ({what}), got {describe(cache_format)}")
    return fmt


def _check_index(name: str, t, n: int, device: torch.device) -> None:
    """tokenspeed's int32 / int64 ``[T]`` argument, as a typed error (before any device work)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _ts.SLOT_DTYPES:
        raise InputTypeError(f"{name} must be an int32/int64 tensor [{n}], got {describe(t)}")
    if t.shape != (n,) or t.device != device:
        raise InputError(f"{name} must be int32/int64 with shape ({n},) on {device}, got {describe(t)}")


@replayed  # checks, a view of the field, then the native call: replayed as the native call is
def swa_rope_scatter(
    values: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    cache_format: str,
    out: torch.Tensor | None,
) -> torch.Tensor | None:
    """Rotate bf16 SWA rows ``values [T, 512]`` at ``positions [T]`` (dims 448.. by the float32
    ``cos_sin_cache [max_position, 64]``), round to bf16 and quantize them into the paged field
    ``cache`` at ``slots [T]`` (page 0, negative and out-of-capacity slots skipped); with ``out``
    (contiguous bf16 ``[T, 512]``) every row's dequantized value too. Returns ``out``."""
    fmt = _kvformats_fmt(cache_format, SWA_FORMATS, "a SWA row format")
    field = _ts.paged_field(cache, cache_format)
    if not isinstance(values, torch.Tensor) or values.dtype != torch.bfloat16:
        raise InputTypeError(f"SWA values must be BF16 [tokens, 512], got {describe(values)}")
    if values.dim() != 2 or values.shape[1] != 512 or values.device != cache.device:
        raise InputError(f"SWA values must be BF16 [tokens, 512] on the cache's device {cache.device}, "
                         f"got {describe(values)}")
    t = values.shape[0]
    _check_index("positions", positions, t, cache.device)
    _check_index("slots", slots, t, cache.device)
    # page 0 (tokenspeed's null page) skipped and negative positions clamped by the op itself
    _ops.swa_rope_scatter(values, positions, cos_sin_cache, field, slots, fmt=fmt, page_size=_ts.PAGE_ROWS, out=out,
                          first_slot=_ts.PAGE_ROWS, negative_positions="clamp")
    return out


@replayed  # checks, then the native call: replayed as the native call is
def index_q_quantize(
    q: torch.Tensor, cache_format: str, out: torch.Tensor | None
) -> torch.Tensor:
    """Quantize and dequantize bf16 index queries ``q [T, H, 128]`` as ``cache_format`` ('index'
    or 'index_v4') stores keys, into ``out`` (contiguous bf16, q's shape) or a new tensor for
    ``out=None``. Returns the destination."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise InputTypeError(f"index q must be BF16 [tokens, heads, 128], got {describe(q)}")
    if q.dim() != 3 or q.shape[2] != 128:
        raise InputError(f"index q must be BF16 [tokens, heads, 128], got {describe(q)}")
    fmt = _kvformats_fmt(cache_format, INDEX_FORMATS, "an index row format")
    return _ops.index_q_quantize(q, fmt=fmt, out=out)


