"""tokenspeed's index helpers and paged gathers under its names (part of
``kvformats.compat.tokenspeed``; import them from there).

The six index helpers ``deepseek_v4_ops.py`` re-exports from tokenspeed's Triton kernel module,
its dequantize-and-gather, and the MXFP4 / FP8 indexer gathers engine code calls beside them:
keyword-only where tokenspeed's are, tokenspeed's names (``token_to_req_indices``,
``block_size``, ``compress_ratio``), results returned or written as tokenspeed does. What
tokenspeed reads of its arguments is what they take: the first T entries of per-token tensors
longer than the tokens, the first R rows of a persistent block table (more rows than requests),
and outputs of another integer dtype, which tokenspeed's stores cast into.
"""

from __future__ import annotations

import torch

from kvformats.codec.paged_ops import dequantize_gather, gather_paged
from kvformats.codec.slot_ops import gather as slot_gather
from kvformats.compat._replay import replayed
from kvformats.compat._common import (check_int_out, cut_to, ds_mla, head,
                                      indexer_of_cache, mxfp4_indexer, store_cast)
from kvformats.deepseek_v4.indices import (combine_dense_swa_indices, combine_topk_swa_indices,
                                           compressed_slot_mapping, decode_swa_indices_and_lens,
                                           dense_prefill_local_compressed_indices, global_topk_indices_and_lens)
from kvformats.errors import InputError, InputTypeError, describe
from kvformats.formats import Fp8Indexer, Mxfp4Indexer

__all__ = [
    "deepseek_v4_build_dense_prefill_local_compressed_indices", "deepseek_v4_combine_dense_swa_indices",
    "deepseek_v4_combine_topk_swa_indices", "deepseek_v4_compressed_slot_mapping",
    "deepseek_v4_compute_global_topk_indices_and_lens", "deepseek_v4_decode_swa_indices_and_lens",
    "deepseek_v4_dequantize_and_gather_k_cache", "deepseek_v4_gather_indexer_mxfp4_cache",
    "gather_paged_indexer_fp8_cache", "indexer_mxfp4_paged_gather",
]

# tokenspeed's kernels are fixed at DeepSeek V4's geometry where the cache alone cannot say it
HEAD_DIM, ROPE_DIM, INDEX_HEAD_DIM = 512, 64, 128
_MXFP4_VALUE_BYTES, _MXFP4_SCALE_BYTES = INDEX_HEAD_DIM // 2, INDEX_HEAD_DIM // 32


# ----- index helpers ------------------------------------------------------------------------------
def deepseek_v4_compressed_slot_mapping(*, num_tokens, query_start_loc, seq_lens, block_table, block_size,
                                        compress_ratio, out=None):
    """int64 ``[num_tokens]`` compressed-cache slots, −1 off the group ends (``out`` filled with −1,
    a view of it returned; an ``out`` of another integer dtype receives them cast)
    (``dsv4.compressed_slot_mapping``)."""
    if out is None or not store_cast(out, torch.int64):
        return compressed_slot_mapping(num_tokens=num_tokens, query_start_loc=query_start_loc, seq_lens=seq_lens,
                                       block_table=block_table, page_size=block_size, ratio=compress_ratio, out=out)
    check_int_out("out", out, num_tokens if isinstance(num_tokens, int) else 0, None, _device(seq_lens))
    slots = compressed_slot_mapping(num_tokens=num_tokens, query_start_loc=query_start_loc, seq_lens=seq_lens,
                                    block_table=block_table, page_size=block_size, ratio=compress_ratio)
    out.fill_(-1)
    out[:num_tokens] = slots
    return out[:num_tokens]


def _device(t):
    return t.device if isinstance(t, torch.Tensor) else None


def _rows(t) -> int | None:
    """The first dimension of a tensor (the tokens of a per-token tensor, the requests of
    ``seq_lens``), or None for anything else (the native call then says what is wrong)."""
    return t.shape[0] if isinstance(t, torch.Tensor) and t.dim() else None


@replayed
def deepseek_v4_compute_global_topk_indices_and_lens(*, topk_indices, token_to_req_indices, block_table, block_size,
                                                     is_valid_token=None):
    """``(global int32 [T, K], lens int32 [T])`` (``dsv4.global_topk_indices_and_lens``); the first
    T entries of longer ``token_to_req_indices`` / ``is_valid_token`` are read."""
    token_to_req_indices, is_valid_token = cut_to(topk_indices, token_to_req_indices, is_valid_token)
    return global_topk_indices_and_lens(
        topk_indices=topk_indices, req_indices=token_to_req_indices, block_table=block_table, page_size=block_size,
        is_valid_token=is_valid_token)


def deepseek_v4_combine_topk_swa_indices(*, topk_indices, query_start_loc, seq_lens, gather_lens, window_size,
                                         compress_ratio, topk, workspace_width, compressed_base):
    """Sparse-prefill rows ``[top-k | window]`` and their lengths (``dsv4.combine_topk_swa_indices``)."""
    return combine_topk_swa_indices(
        topk_indices=topk_indices, query_start_loc=query_start_loc, seq_lens=seq_lens, gather_lens=gather_lens,
        window_size=window_size, ratio=compress_ratio, topk=topk, workspace_width=workspace_width,
        compressed_base=compressed_base)


@replayed
def deepseek_v4_combine_dense_swa_indices(*, positions, token_to_req_indices, seq_lens, compressed_lens, gather_lens,
                                          window_size, compress_ratio, workspace_width, compressed_base):
    """Dense-prefill rows ``[compressed | window]`` and their lengths (``dsv4.combine_dense_swa_indices``);
    the first T entries of a longer ``token_to_req_indices`` are read."""
    token_to_req_indices, = cut_to(positions, token_to_req_indices)
    return combine_dense_swa_indices(
        positions=positions, req_indices=token_to_req_indices, seq_lens=seq_lens, compressed_lens=compressed_lens,
        gather_lens=gather_lens, window_size=window_size, ratio=compress_ratio, workspace_width=workspace_width,
        compressed_base=compressed_base)


def _no_cast(args, kwargs) -> bool:
    """Whether a decode-SWA call writes no output with a cast (a copy: that call is not replayed)."""
    return not (store_cast(kwargs.get("out_indices"), torch.int32) or store_cast(kwargs.get("out_lens"), torch.int32))


@replayed(plain=_no_cast)
def deepseek_v4_decode_swa_indices_and_lens(*, query_start_loc, seq_lens, token_to_req_indices, block_table,
                                            window_size, block_size, block_table_base_offsets=None,
                                            is_valid_token=None, out_indices=None, out_lens=None):
    """Decode SWA slots ``(int32 [T, window_size], lens int32 [T])``; the given ``out_indices`` /
    ``out_lens`` themselves are returned, as tokenspeed does, written with a cast when of another
    integer dtype (``dsv4.decode_swa_indices_and_lens``). A persistent block table (and its base
    offsets) is read for the first R = ``len(seq_lens)`` requests; ``is_valid_token`` for the
    first T = ``len(token_to_req_indices)`` tokens."""
    n = _rows(token_to_req_indices)
    block_table, block_table_base_offsets = cut_to(seq_lens, block_table, block_table_base_offsets)
    is_valid_token, = cut_to(token_to_req_indices, is_valid_token)
    cast_i = out_indices is not None and store_cast(out_indices, torch.int32)
    cast_l = out_lens is not None and store_cast(out_lens, torch.int32)
    if cast_i or cast_l:
        dev = _device(token_to_req_indices)
        if cast_i:
            check_int_out("out_indices", out_indices, n or 0, window_size, dev)
        if cast_l:
            check_int_out("out_lens", out_lens, n or 0, None, dev)
    idx, lens = decode_swa_indices_and_lens(
        query_start_loc=query_start_loc, seq_lens=seq_lens, req_indices=token_to_req_indices,
        block_table=block_table, window_size=window_size, page_size=block_size,
        block_table_base_offsets=block_table_base_offsets, is_valid_token=is_valid_token,
        out_indices=None if cast_i else out_indices, out_lens=None if cast_l else out_lens)
    if cast_i:
        out_indices[:idx.shape[0]] = idx
    if cast_l:
        out_lens[:lens.shape[0]] = lens
    return (idx if out_indices is None else out_indices), (lens if out_lens is None else out_lens)


def deepseek_v4_build_dense_prefill_local_compressed_indices(*, positions, compress_ratio, width, out):
    """``out[:T, :width]`` filled with the local compressed rows of each token, and returned
    (``dsv4.dense_prefill_local_compressed_indices``); an ``out`` of another integer dtype
    receives them cast."""
    if out is None or not store_cast(out, torch.int32):
        return dense_prefill_local_compressed_indices(positions=positions, ratio=compress_ratio, width=width, out=out)
    check_int_out("out", out, _rows(positions) or 0, width if isinstance(width, int) else 0, _device(positions),
                  min_cols=True)
    idx = dense_prefill_local_compressed_indices(positions=positions, ratio=compress_ratio, width=width)
    out[:idx.shape[0], :idx.shape[1]] = idx
    return out[:idx.shape[0], :idx.shape[1]]


# ----- paged reads --------------------------------------------------------------------------------
@replayed
def deepseek_v4_dequantize_and_gather_k_cache(*, out, cache_2d, seq_lens, gather_lens, block_table, block_size, offset,
                                              block_table_base_offsets=None, max_gather_len=None):
    """Each request's last ``gather_lens`` positions decoded into ``out[b, offset + i]`` (bf16
    ``[R, W, 512]``) (``Fp8DsMla.dequantize_gather``). Returns None, as tokenspeed does. A
    persistent block table (and its base offsets) is read for the first R = ``len(seq_lens)``
    requests. ``max_gather_len`` (main at f4d8ec6e) is tokenspeed's launch-width hint on Blackwell:
    it changes no byte there, and none here (None or an int)."""
    if max_gather_len is not None and (isinstance(max_gather_len, bool) or not isinstance(max_gather_len, int)):
        raise InputTypeError(f"max_gather_len must be None or an int, got {describe(max_gather_len)}")
    block_table, block_table_base_offsets = cut_to(seq_lens, block_table, block_table_base_offsets)
    dequantize_gather(ds_mla(HEAD_DIM, ROPE_DIM, block_size), cache_2d, out, block_table=block_table,
                      seq_lens=seq_lens, gather_lens=gather_lens, block_table_base_offsets=block_table_base_offsets,
                      offset=offset)


def _workspaces(values_out, scales_out, rows) -> None:
    """tokenspeed's checks of the MXFP4 gather's workspaces, as typed errors."""
    try:
        if (values_out.dtype is torch.uint8 and scales_out.dtype is torch.uint8 and values_out.dim() == 2
                and scales_out.dim() == 2 and values_out.stride(1) == 1 and scales_out.stride(1) == 1
                and values_out.shape[1] >= _MXFP4_VALUE_BYTES and scales_out.shape[1] >= _MXFP4_SCALE_BYTES
                and (rows is None or (values_out.shape[0] >= rows and scales_out.shape[0] >= rows))):
            return
    except (AttributeError, TypeError):
        raise InputTypeError(f"values_out and scales_out must be uint8 tensors, got {describe(values_out)} and "
                             f"{describe(scales_out)}") from None
    if values_out.dtype != torch.uint8 or scales_out.dtype != torch.uint8:
        raise InputTypeError(f"values_out and scales_out must be uint8 tensors, got {describe(values_out)} and "
                             f"{describe(scales_out)}")
    raise InputError(f"values_out / scales_out must be 2-D, contiguous in the last dim, with at least {rows} rows "
                     f"of {_MXFP4_VALUE_BYTES} / {_MXFP4_SCALE_BYTES} bytes, got {describe(values_out)} and "
                     f"{describe(scales_out)}")


def deepseek_v4_gather_indexer_mxfp4_cache(*, cache_2d, slot_mapping, values_out, scales_out, block_size):
    """The 64 value bytes and 4 scale bytes of the MXFP4 rows at ``slot_mapping`` into
    ``values_out[:N, :64]`` / ``scales_out[:N, :4]`` (zero bytes for slot < 0)
    (``Mxfp4Indexer.gather``, then the two copies)."""
    try:
        n = slot_mapping.shape[0]
    except (AttributeError, IndexError, TypeError):
        n = None  # not a slot tensor: the native call says so
    _workspaces(values_out, scales_out, n)
    rows = slot_gather(mxfp4_indexer(INDEX_HEAD_DIM, block_size), cache_2d, slot_mapping)
    n = rows.shape[0]
    v = values_out if values_out.shape == (n, _MXFP4_VALUE_BYTES) else values_out[:n, :_MXFP4_VALUE_BYTES]
    sc = scales_out if scales_out.shape == (n, _MXFP4_SCALE_BYTES) else scales_out[:n, :_MXFP4_SCALE_BYTES]
    v.copy_(rows[:, :_MXFP4_VALUE_BYTES])
    sc.copy_(rows[:, _MXFP4_VALUE_BYTES:])


def _requests(cu_seq_lens) -> int | None:
    """R of ``cu_seq_lens [R + 1]`` (None when it is not a 1-D tensor of at least one entry)."""
    return cu_seq_lens.shape[0] - 1 if isinstance(cu_seq_lens, torch.Tensor) and cu_seq_lens.dim() == 1 and \
        cu_seq_lens.shape[0] else None


def indexer_mxfp4_paged_gather(kv_cache, values_out, scales_out, block_table, cu_seq_lens, cache_block_size):
    """The MXFP4 records of every request's positions ``[cu[r], cu[r+1])``, in cu order, into the
    caller's ``values_out [T, 64]`` / ``scales_out [T, 4]`` (``Mxfp4Indexer.gather_paged``); a
    persistent block table is read for the first R = ``len(cu_seq_lens) - 1`` requests."""
    block_table = head(block_table, _requests(cu_seq_lens))
    gather_paged(indexer_of_cache(Mxfp4Indexer, kv_cache, cache_block_size, "kv_cache"), kv_cache,
                 block_table=block_table, cu_seq_lens=cu_seq_lens, out=(values_out, scales_out))


def gather_paged_indexer_fp8_cache(cache_2d, page_table=None, cu_seq_lens=None, block_size=None, *, block_table=None):
    """``(k_fp8 float8_e4m3fn [total, d], k_scale float32 [total])``: the FP8 records of every
    request's positions in cu order (``Fp8Indexer.gather_paged``; reads ``cu_seq_lens[-1]`` on the
    host for the output size, as tokenspeed does: under torch.compile a graph break, as there).

    The table is ``page_table`` (0.1.1, main) or ``block_table`` (its name at 6a08766a): exactly
    one of them. A persistent table is read for the first R = ``len(cu_seq_lens) - 1`` requests;
    no request (``cu_seq_lens`` ``[0]`` or empty) gives empty results."""
    if (page_table is None) == (block_table is None):
        raise InputTypeError("gather_paged_indexer_fp8_cache takes the table as page_table (tokenspeed 0.1.1, main) "
                             "or block_table (6a08766a): pass exactly one")
    if cu_seq_lens is None or block_size is None:
        raise InputTypeError("gather_paged_indexer_fp8_cache needs cu_seq_lens and block_size")
    table = block_table if page_table is None else page_table
    lay = indexer_of_cache(Fp8Indexer, cache_2d, block_size)
    requests = _requests(cu_seq_lens)
    if requests is None and isinstance(cu_seq_lens, torch.Tensor) and cu_seq_lens.dim() == 1:
        cu_seq_lens, requests = cu_seq_lens.new_zeros(1), 0  # empty: tokenspeed's no offsets, no rows
    # the codec op itself (Layout.gather_paged is one call layer around it)
    values, scales = gather_paged(lay, cache_2d, block_table=head(table, requests), cu_seq_lens=cu_seq_lens)
    return values.view(torch.float8_e4m3fn), scales.view(torch.float32).squeeze(1)
