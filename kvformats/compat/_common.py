"""What the tokenspeed drop-ins share: layout objects built once per geometry, the length rule of
tokenspeed's multi-tensor ops (the first ``n`` entries of longer tensors), outputs of another
integer dtype, and the switch to the ``torch.library`` ops under torch.compile."""

from __future__ import annotations

from typing import Any

import torch

import kvformats.codec.torch_ops  # noqa: F401  (registers torch.ops.kvformats.*, called under torch.compile)
import kvformats.deepseek_v4.torch_ops as _dops
from kvformats.compat import tokenspeed_spec as spec
from kvformats.errors import InputError, InputTypeError, LayoutError, describe
from kvformats.formats import Fp8DsMla, Fp8Indexer, Mxfp4Indexer
from kvformats.validation import check_tensor

__all__ = ["INT_DTYPES", "check_int_out", "compiling", "cut", "dops", "ds_mla", "head",
           "indexer_head_dim", "indexer_of_cache", "indexer_of_rows", "mxfp4_indexer", "rows_of",
           "same_pages", "store_cast"]

# the custom-op wrappers are made from the ops' declarations at import (kvformats.codec.op.Op),
# so a type checker sees none of their names
dops: Any = _dops
compiling = torch.compiler.is_compiling  # True while dynamo traces: the custom ops keep the graph whole
_LAYOUTS: dict = {}


class _Built:
    """The layouts built here, each a class attribute named by ``_built``: dynamo reads an
    attribute by its name when the traced code reads it, where a container read once would stay
    as it was then."""


@torch.compiler.assume_constant_result
def _built(cls, items: tuple) -> str:
    """The name in ``_Built`` of ``cls(**dict(items))``, built once. Under torch.compile dynamo
    calls this while tracing and keeps the string: a layout's attrs-frozen ``__init__`` cannot be
    traced, so a geometry first seen while compiling is built here, outside the graph."""
    # _LAYOUTS is not touched here: dynamo guards on what the traced code read of it
    name = "_".join(["layout", cls.__name__, *(f"{k}{v}" for k, v in items)])
    if not hasattr(_Built, name):  # a bad geometry raises LayoutError here, every time (errors are not stored)
        setattr(_Built, name, cls(**dict(items)))
    return name


def _layout(cls, **params):
    key = (cls, *params.values())
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _LAYOUTS[key] = getattr(_Built, _built(cls, tuple(params.items())))
    return lay


def mxfp4_indexer(head_dim: int, page_size: int) -> Mxfp4Indexer:
    lay = _LAYOUTS.get((Mxfp4Indexer, head_dim, page_size))
    return lay if lay is not None else _layout(Mxfp4Indexer, head_dim=head_dim, page_size=page_size)


def ds_mla(head_dim: int, rope_dim: int, page_size: int) -> Fp8DsMla:
    lay = _LAYOUTS.get((Fp8DsMla, head_dim, rope_dim, page_size))
    return lay if lay is not None else _layout(Fp8DsMla, head_dim=head_dim, rope_dim=rope_dim, page_size=page_size)


def rows_of(*tensors) -> int | None:
    """The shortest first dimension of ``tensors`` (tokenspeed's ``num_actual``), or None when one
    is not a tensor with a first dimension (the native call then says what is wrong)."""
    n = None
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return None
        n = t.shape[0] if n is None or t.shape[0] < n else n
    return n


def head(t, n: int | None):
    """``t[:n]`` where ``t`` is a longer tensor, else ``t`` as given (tokenspeed reads the first
    ``n`` entries of a longer tensor; a shorter one is left for the native call to refuse)."""
    if n is None or not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] <= n:
        return t
    return t[:n]


def cut(count: tuple, tensors: tuple) -> tuple:
    """tokenspeed's length rule: its tokens are the shortest first dimension of ``count`` (tensors
    among ``tensors``), and it reads the first that many entries of each of ``tensors``.
    ``tensors`` as given when their first dimensions are equal (the steady state: one shape read
    per tensor), else the longer ones cut; where one is not a tensor with a first dimension, only
    the others are (the native call then says what is wrong)."""
    try:
        n = -1
        for t in tensors:
            rows = t.shape[0]
            if n < 0:
                n = rows
            elif rows != n:
                break
        else:
            return tensors
    except (AttributeError, IndexError, TypeError):
        pass
    tokens = rows_of(*count)
    return tuple(head(t, tokens) for t in tensors)


# integer dtypes tokenspeed's index helpers store into (a Triton store casts to the output's type)
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def store_cast(out, dtype) -> bool:
    """Whether ``out`` is a tensor of another integer dtype than ``dtype``, which tokenspeed's
    helpers store into (each value cast to ``out``'s type): the drop-in then writes the native
    result into it with a cast."""
    return isinstance(out, torch.Tensor) and out.dtype is not dtype and out.dtype in INT_DTYPES


def check_int_out(name: str, out, rows: int, cols: int | None, device, min_cols: bool = False) -> None:
    """The checks of an output tensor written with a cast: 1-D ``[>= rows]`` (``cols`` None) or
    2-D ``[>= rows, cols]`` (``[>= rows, >= cols]`` with ``min_cols``), on ``device``."""
    shape = (None,) if cols is None else (None, None if min_cols else cols)
    check_tensor(name, out, dtypes=INT_DTYPES, shape=shape, device=device)
    if out.shape[0] < rows or (min_cols and out.shape[1] < cols):
        want = f"[>= {rows}]" if cols is None else f"[>= {rows}, {'>= ' if min_cols else ''}{cols}]"
        raise InputError(f"{name} must be {want}, got {describe(out)}")


_FROM_ROW_BYTES = {Fp8Indexer: spec.deepseek_v4_indexer_fp8_layout_from_row_bytes,
                   Mxfp4Indexer: spec.deepseek_v4_indexer_mxfp4_layout_from_row_bytes}
def cut_to(like, *tensors) -> tuple:
    """``tensors`` each cut to the first ``len(like)`` entries where longer, as tokenspeed reads a
    longer per-token tensor or a persistent per-request table; None, and anything that is not a
    tensor with a first dimension, passes unchanged (the native call then says what is wrong)."""
    if not (isinstance(like, torch.Tensor) and like.dim()):
        return tensors
    n = like.shape[0]
    return tuple(t[:n] if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] > n else t for t in tensors)


_BY_WIDTH: dict = {}  # (layout class, cache width or head dim, block size) -> layout


def indexer_of_cache(cls, cache_2d, block_size, name: str = "cache_2d"):
    """The indexer layout of a ``[pages, block_size * row_bytes]`` uint8 cache, its head dim read
    as tokenspeed's readers read it (``cache_2d.shape[1] // block_size`` bytes per row)."""
    try:
        lay = _BY_WIDTH.get((cls, "cache", cache_2d.shape[1], block_size))
    except (AttributeError, IndexError, TypeError):
        lay = None
    if lay is None:
        d = indexer_head_dim(cache_2d, block_size, _FROM_ROW_BYTES[cls], name)
        lay = _BY_WIDTH[(cls, "cache", cache_2d.shape[1], block_size)] = _layout(cls, head_dim=d, page_size=block_size)
    return lay


def indexer_of_rows(cls, index_k, block_size):
    """The indexer layout of rows ``index_k [N, d]`` in pages of ``block_size`` rows."""
    try:
        lay = _BY_WIDTH.get((cls, "rows", index_k.shape[1], block_size))
    except (AttributeError, IndexError, TypeError):
        lay = None
    if lay is None:
        if not isinstance(index_k, torch.Tensor) or index_k.dim() != 2:
            raise InputError(f"index_k must be [tokens, dim], got {describe(index_k)}")
        lay = _BY_WIDTH[(cls, "rows", index_k.shape[1], block_size)] = _layout(cls, head_dim=index_k.shape[1],
                                                                               page_size=block_size)
    return lay


def indexer_head_dim(cache_2d, block_size, from_row_bytes, name: str = "cache_2d") -> int:
    """The indexer head dim of a ``[pages, block_size * row_bytes]`` uint8 cache, as tokenspeed's
    readers infer it (``from_row_bytes``: the spec helper of the format)."""
    if not isinstance(cache_2d, torch.Tensor) or cache_2d.dim() != 2 or cache_2d.dtype != torch.uint8:
        raise InputTypeError(f"{name} must be a uint8 tensor [pages, block_size * row_bytes], got {describe(cache_2d)}")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise InputError(f"block_size must be a positive int, got {describe(block_size)}")
    if cache_2d.shape[1] % block_size:
        raise LayoutError(f"{name} rows ({cache_2d.shape[1]} bytes) are not {block_size} whole indexer rows")
    return from_row_bytes(cache_2d.shape[1] // block_size)[0]


def same_pages(name: str, given, state_cache) -> None:
    """tokenspeed's check that ``given`` (its compressor_block_size) is the state cache's rows per
    page; kvformats reads that from ``state_cache.shape[1]``."""
    try:
        rows = state_cache.shape[1]
    except (AttributeError, IndexError, TypeError):
        return  # not a state cache: the native call says so
    if given != rows:
        raise InputError(f"{name} must equal state_cache.shape[1] = {rows} (rows per page), got {given!r}")
