"""tokenspeed's DeepSeek V4 attention-ops boundary under its own names: adopt kvformats by
changing one import.

    # from tokenspeed.runtime.layers.attention.deepseek_v4_ops import *
    from kvformats.compat.tokenspeed import *

The same import serves the three tokenspeed versions engines run: the release tokenspeed 0.1.1
(the 10 names of its ``deepseek_v4_ops.__all__``), the main branch at f4d8ec6e (21 names) and the
commit the port began from, f3e4d1e2 (19 names), with the functions engine code calls beside them
(``hadamard_transform``, the MXFP4 gathers). Every function takes each version's call forms:
tokenspeed's parameter names, order, defaults and keyword-only markers, positional or by keyword
(``spec/tokenspeed-signatures.json``); where two versions put different parameters at one
position (the compress inserts' ``kv_write_mask`` of 0.1.1 where f3e4d1e2 had ``compress_ratio``;
``gather_paged_indexer_fp8_cache``'s ``page_table``, ``block_table`` at 6a08766a) the value or
the keyword says which form a call is. Each is an argument adaptation around the native kvformats
call: the same validation (typed errors, values checked on the device record by default),
backends, CUDA-graph capture and replay; under ``torch.compile`` the calls go through kvformats'
``torch.library`` ops. Where tokenspeed is undefined or refuses CPU tensors, kvformats' contract
applies: the table of differences is at the top of docs/porting-from-tokenspeed.md.
"""

from __future__ import annotations

import torch

from kvformats.compat import tokenspeed_spec as _spec
from kvformats.codec.slot_ops import decode as slot_decode
from kvformats.codec.slot_ops import encode as slot_encode
from kvformats.compat._common import (compiling, cut, ds_mla, head, indexer_of_cache,
                                      indexer_of_rows, rows_of, same_pages)
from kvformats.compat._replay import replayed
from kvformats.compat.tokenspeed_paged import (  # noqa: F401  (re-exported)
    deepseek_v4_build_dense_prefill_local_compressed_indices, deepseek_v4_combine_dense_swa_indices,
    deepseek_v4_combine_topk_swa_indices, deepseek_v4_compressed_slot_mapping,
    deepseek_v4_compute_global_topk_indices_and_lens, deepseek_v4_decode_swa_indices_and_lens,
    deepseek_v4_dequantize_and_gather_k_cache, deepseek_v4_gather_indexer_mxfp4_cache, gather_paged_indexer_fp8_cache,
    indexer_mxfp4_paged_gather)
from kvformats.compat.tokenspeed_spec import (  # noqa: F401  (re-exported)
    DEEPSEEK_V4_FP8_MAX, DEEPSEEK_V4_FP8_QUANT_BLOCK, DEEPSEEK_V4_MXFP4_BLOCK_SIZE,
    deepseek_v4_indexer_fp8_layout_from_row_bytes, deepseek_v4_indexer_fp8_row_bytes,
    deepseek_v4_indexer_fp8_scale_bytes, deepseek_v4_indexer_mxfp4_layout_from_row_bytes,
    deepseek_v4_indexer_mxfp4_row_bytes, deepseek_v4_nope_dim, deepseek_v4_swa_row_bytes, deepseek_v4_swa_scale_dim,
    deepseek_v4_swa_token_stride)
from kvformats.deepseek_v4.compress import compress_kv_insert, indexer_compress_insert, save_compressor_state
from kvformats.deepseek_v4.query import inv_rope_fp8_quant, prepare_indexer_q_fp8, prepare_indexer_q_mxfp4
from kvformats.deepseek_v4.rope import rope_tail
from kvformats.deepseek_v4.swa import swa_insert
from kvformats.deepseek_v4.transforms import hadamard_transform as _hadamard
from kvformats.errors import InputError, InputTypeError, describe
from kvformats.formats import Fp8Indexer, Mxfp4Indexer
from kvformats.runtime.replay_plan import recording
from kvformats.validation import FLOAT_DTYPES

# tokenspeed's deepseek_v4_ops.__all__ at f3e4d1e2, in its order
OPS_ALL = (
    "deepseek_v4_build_dense_prefill_local_compressed_indices", "deepseek_v4_combine_dense_swa_indices",
    "deepseek_v4_combine_topk_swa_indices", "deepseek_v4_compressed_slot_mapping",
    "deepseek_v4_compute_global_topk_indices_and_lens", "deepseek_v4_decode_swa_indices_and_lens",
    "deepseek_v4_dequantize_and_gather_k_cache", "deepseek_v4_fused_inv_rope_fp8_quant",
    "deepseek_v4_csa_compress_kv_cache_insert", "deepseek_v4_csa_indexer_cache_insert",
    "deepseek_v4_hca_compress_kv_cache_insert", "deepseek_v4_prepare_indexer_q_mxfp4",
    "dequantize_deepseek_v4_fp8_ds_mla_cache", "fused_qnorm_rope_kv_insert", "read_deepseek_v4_indexer_fp8_cache",
    "read_deepseek_v4_indexer_mxfp4_cache", "save_deepseek_v4_compressor_state", "write_deepseek_v4_indexer_fp8_cache",
    "write_deepseek_v4_indexer_mxfp4_cache",
)
# tokenspeed 0.1.1's deepseek_v4_ops.__all__ (the released wheel), in its order
RELEASE_OPS_ALL = (
    "deepseek_v4_csa_compress_kv_cache_insert", "deepseek_v4_csa_indexer_cache_insert",
    "deepseek_v4_hca_compress_kv_cache_insert", "deepseek_v4_prepare_indexer_q", "deepseek_v4_prepare_indexer_q_fp8",
    "deepseek_v4_prepare_indexer_q_mxfp4", "gather_paged_indexer_fp8_cache", "fused_qnorm_rope_kv_insert",
    "read_deepseek_v4_indexer_fp8_cache", "save_deepseek_v4_compressor_state",
)
# tokenspeed's deepseek_v4_ops.__all__ on main at f4d8ec6e, in its order
MAIN_OPS_ALL = (*OPS_ALL[:11], "deepseek_v4_prepare_indexer_q_fp8", "deepseek_v4_prepare_indexer_q_mxfp4",
                "dequantize_deepseek_v4_fp8_ds_mla_cache", "gather_paged_indexer_fp8_cache", *OPS_ALL[13:])
# called by engine code beside them (tokenspeed's kernel package, or main after f3e4d1e2)
ENGINE_NAMES = ("hadamard_transform", "deepseek_v4_prepare_indexer_q_fp8", "deepseek_v4_gather_indexer_mxfp4_cache",
                "indexer_mxfp4_paged_gather", "gather_paged_indexer_fp8_cache")
__all__ = [*OPS_ALL, *ENGINE_NAMES, "deepseek_v4_prepare_indexer_q", *_spec.__all__]


# ----- cache writers ----------------------------------------------------------------------------
def fused_qnorm_rope_kv_insert(q, kv, swa_kv_cache_2d, slot_mapping, positions, cos_sin_cache, rms_norm_eps,
                               block_size, q_out=None, *, validate_positions=True):
    """RMSNorm + RoPE of ``q`` in place, and ``kv`` into the SWA cache (``dsv4.swa_insert``).
    ``q_out`` (0.1.1): the rotated queries go there and ``q`` is left unchanged.
    ``validate_positions`` (0.1.1) is accepted and changes nothing: kvformats checks positions
    as its contract says (spec/checks.md) either way."""
    if q_out is not None:
        q = _q_out(q_out, q)
    swa_insert(q, kv, swa_kv_cache_2d, slot_mapping, positions, cos_sin_cache, rms_norm_eps, page_size=block_size)


def _q_out(q_out, q):
    """``q_out`` holding ``q``'s values, for ``swa_insert`` to rotate in place (tokenspeed 0.1.1's
    check first: ``q_out`` contiguous, of ``q``'s shape, dtype and device)."""
    if not isinstance(q_out, torch.Tensor) or not isinstance(q, torch.Tensor) or q_out.dtype != q.dtype:
        raise InputTypeError(f"q_out must be a tensor of q's dtype, got {describe(q_out)} for q {describe(q)}")
    if q_out.shape != q.shape or q_out.device != q.device or not q_out.is_contiguous():
        raise InputError(f"q_out must be contiguous with q's shape and device, got {describe(q_out)} for q "
                         f"{describe(q)}")
    q_out.copy_(q)
    return q_out


def deepseek_v4_hca_compress_kv_cache_insert(state_cache, token_to_req_indices, positions, compressor_slot_mapping,
                                             block_table, compressor_block_size, rms_norm_weight, rms_norm_eps,
                                             cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                                             kv_write_mask=None, compress_ratio=128, block_table_base_offsets=None):
    """HCA (ratio 128) compress-insert (``dsv4.hca_compress_kv_insert``). Both call forms: 0.1.1's
    ``(..., kv_cache_block_size, kv_write_mask, compress_ratio=128)`` and f3e4d1e2's
    ``(..., kv_cache_block_size, compress_ratio=128, block_table_base_offsets=None)`` (an int
    where 0.1.1 has ``kv_write_mask`` is f3e4d1e2's ``compress_ratio``)."""
    return _compress_kv_insert("HCA", 128, kv_write_mask, compress_ratio, block_table_base_offsets, state_cache,
                               token_to_req_indices, positions, compressor_slot_mapping, block_table,
                               compressor_block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d,
                               kv_slot_mapping, kv_cache_block_size)


def deepseek_v4_csa_compress_kv_cache_insert(state_cache, token_to_req_indices, positions, compressor_slot_mapping,
                                             block_table, compressor_block_size, rms_norm_weight, rms_norm_eps,
                                             cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                                             kv_write_mask=None, compress_ratio=4, block_table_base_offsets=None):
    """CSA (ratio 4, overlapping windows) compress-insert (``dsv4.csa_compress_kv_insert``). Both
    call forms, as for the HCA insert."""
    return _compress_kv_insert("CSA", 4, kv_write_mask, compress_ratio, block_table_base_offsets, state_cache,
                               token_to_req_indices, positions, compressor_slot_mapping, block_table,
                               compressor_block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d,
                               kv_slot_mapping, kv_cache_block_size)


def _call_form(mask, ratio, base, default):
    """``(kv_write_mask, compress_ratio, block_table_base_offsets)`` of a compress-insert call whose
    ``kv_write_mask`` is neither None nor a tensor: an int there is f3e4d1e2's positional
    ``compress_ratio``, and then a tensor or None in ``compress_ratio``'s place is its positional
    base offsets (anything else is left for the mask check to refuse)."""
    if not isinstance(mask, int) or isinstance(mask, bool):
        return mask, ratio, base
    if ratio is None or isinstance(ratio, torch.Tensor):
        if base is not None:
            raise InputTypeError("block_table_base_offsets given twice (by position and by keyword)")
        return None, mask, ratio
    if ratio != default and ratio != mask:
        raise InputTypeError(f"compress_ratio given twice ({mask!r} by position, {ratio!r} by keyword)")
    return None, mask, base


def _masked_slots(mask, kv_slots, positions):
    """0.1.1's ``kv_write_mask`` (bool, at least one entry per token): the kv slots of masked-off
    tokens become -1, so they write nothing, as tokenspeed's kernel skips their every store."""
    n = rows_of(kv_slots, positions)
    if not isinstance(mask, torch.Tensor) or mask.dtype is not torch.bool:
        raise InputTypeError(f"kv_write_mask must be a bool tensor [tokens], got {describe(mask)}")
    if mask.dim() != 1 or (n is not None and mask.shape[0] < n) or (
            isinstance(kv_slots, torch.Tensor) and mask.device != kv_slots.device):
        raise InputError(f"kv_write_mask must be a 1-D bool tensor covering the {n} tokens on the kv slot mapping's "
                         f"device, got {describe(mask)}")
    if not isinstance(kv_slots, torch.Tensor):
        return kv_slots  # the native call says what is wrong
    return torch.where(head(mask, kv_slots.shape[0]), kv_slots, -1)


def _compress_kv_insert(label, ratio, mask, compress_ratio, base, state_cache, req, positions, state_slots, block_table,
                        state_block_size, weight, eps, cos_sin, kv_cache_2d, kv_slots, kv_block_size):
    """The CSA / HCA compress-insert of one ratio, with tokenspeed's length rule: its tokens are the
    shortest of the state slot mapping, positions and the kv slot mapping (the first entries of
    the longer ones are read; the kernel of 0.1.1 counts them so for both ratios)."""
    if mask is not None and not isinstance(mask, torch.Tensor):  # f3e4d1e2's positional form
        mask, compress_ratio, base = _call_form(mask, compress_ratio, base, ratio)
    if compress_ratio != ratio:
        raise InputError(f"{label} cache insert requires compress_ratio={ratio}, got {compress_ratio!r}")
    same_pages("compressor_block_size", state_block_size, state_cache)
    positions, req, state_slots, kv_slots = cut((state_slots, positions, kv_slots),
                                                (positions, req, state_slots, kv_slots))
    if mask is not None:
        kv_slots = _masked_slots(mask, kv_slots, positions)
    return compress_kv_insert(
        state_cache, kv_cache_2d, ratio=ratio, positions=positions, req_indices=req, state_slots=state_slots,
        block_table=block_table, rms_weight=weight, rms_eps=eps, cos_sin_cache=cos_sin, kv_slots=kv_slots,
        kv_page_size=kv_block_size, block_table_base_offsets=base)


def deepseek_v4_csa_indexer_cache_insert(state_cache, token_to_req_indices, positions, compressor_slot_mapping,
                                         block_table, compressor_block_size, rms_norm_weight, rms_norm_eps,
                                         cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                                         use_fp4_cache, compress_ratio=4, block_table_base_offsets=None):
    """CSA indexer compress-insert into an MXFP4 (``use_fp4_cache``) or FP8 indexer cache
    (``dsv4.indexer_compress_insert``); tokenspeed's tokens: the shortest of the state slot
    mapping and positions."""
    if compress_ratio != 4:
        raise InputError(f"CSA indexer cache insert requires compress_ratio=4, got {compress_ratio!r}")
    same_pages("compressor_block_size", compressor_block_size, state_cache)
    positions, req, state_slots, index_slots = cut((compressor_slot_mapping, positions),
                                                   (positions, token_to_req_indices, compressor_slot_mapping,
                                                    kv_slot_mapping))
    return indexer_compress_insert(
        state_cache, kv_cache_2d, index_format="mxfp4_indexer" if use_fp4_cache else "fp8_indexer",
        positions=positions, req_indices=req, state_slots=state_slots, block_table=block_table,
        rms_weight=rms_norm_weight, rms_eps=rms_norm_eps, cos_sin_cache=cos_sin_cache, index_slots=index_slots,
        index_page_size=kv_cache_block_size, block_table_base_offsets=block_table_base_offsets)


def _unreorder(ape):
    """The checkpoint-order ape of tokenspeed's runtime (window-order) C4 ape, as a view of it:
    tokenspeed keeps ``cat([ape[:, :h], ape[:, h:]], 0).reshape(4, 2h)``, so checkpoint row r is
    ``cat(runtime[r], runtime[r + 4])`` over the ``[8, h]`` view: the halves form
    ``[4, 2, h]`` kvformats' save takes with any strides. A view aliases the parameter's memory,
    so an in-place reload (``.data.copy_``, ``inference_mode``) is read as it is now; the view is
    kept per tensor and rebuilt when the tensor's address or geometry changes (``param.data =
    other``). A tensor that is not a C4 ape is returned as given, for the native call to say what
    is wrong."""
    if compiling() or recording() is not None:
        # traced into a graph, or recorded for replay: the view is made from the argument itself,
        # so that the graph (or the plan) sees it as a view of an argument, not a kept tensor
        return _ape_view(ape)
    hit = _APE_VIEWS.get(id(ape))
    if hit is not None and hit[0] is ape and hit[1] == ape.data_ptr() and hit[2] == ape.stride() \
            and hit[3] == ape.shape:  # the dtype is the tensor's own for life
        return hit[4]
    view = _ape_view(ape)
    if view is ape:
        return ape
    if len(_APE_VIEWS) >= 64:  # a few ape tensors per model; forget the oldest beyond that
        _APE_VIEWS.pop(next(iter(_APE_VIEWS)))
    _APE_VIEWS[id(ape)] = (ape, ape.data_ptr(), ape.stride(), ape.shape, view)
    return view


def _ape_view(ape):
    """``ape [4, 2h]`` (runtime order) as ``[4, 2, h]`` in checkpoint order; ``ape`` itself where
    it is not a tensor of that shape."""
    if not isinstance(ape, torch.Tensor) or ape.dim() != 2 or ape.shape[1] % 2:
        return ape
    ratio, width = ape.shape
    return ape.reshape(2, ratio, width // 2).transpose(0, 1)  # a view where the rows are one run


# id(runtime ape) -> (the tensor, its address, strides and shape, the checkpoint-order view); the tensor
# is held so that its id is not reused while the entry exists
_APE_VIEWS: dict[int, tuple] = {}


@replayed
def save_deepseek_v4_compressor_state(kv, score, ape, state_cache, slot_mapping, positions, block_size,
                                      compress_ratio):
    """One ``[kv | score + ape[p % ratio]]`` state row per token (``dsv4.save_compressor_state``).
    ``ape`` is tokenspeed's runtime tensor (the C4 ape reordered at loading), as its callers pass
    it: read in checkpoint order through a view of it (``_unreorder``: no copy, so a weight
    reloaded in place, through ``.data`` or under ``torch.inference_mode()``, is read as it is
    now). tokenspeed's tokens: the shortest of kv and the slot mapping."""
    same_pages("block_size", block_size, state_cache)
    kv, score, positions, slot_mapping = cut((slot_mapping, kv), (kv, score, positions, slot_mapping))
    return save_compressor_state(
        kv, score, _unreorder(ape) if compress_ratio == 4 else ape, state_cache, ratio=compress_ratio,
        positions=positions, slots=slot_mapping)


def _write(cls, index_k, cache_2d, slot_mapping, block_size) -> None:
    index_k, slot_mapping = cut((slot_mapping, index_k), (index_k, slot_mapping))  # tokenspeed's rows
    return slot_encode(indexer_of_rows(cls, index_k, block_size), index_k, cache_2d, slot_mapping)


def write_deepseek_v4_indexer_fp8_cache(index_k, cache_2d, slot_mapping, block_size=64):
    """FP8 indexer rows of ``index_k [N, d]`` at ``slot_mapping`` (``Fp8Indexer.encode``). The
    scale is computed in float32, as tokenspeed's capturable writer and every released writer
    compute it (tokenspeed's f3e4d1e2 / main Python writer computes it in float64: the porting
    guide says where that differs)."""
    return _write(Fp8Indexer, index_k, cache_2d, slot_mapping, block_size)


def write_deepseek_v4_indexer_mxfp4_cache(index_k, cache_2d, slot_mapping, block_size=64):
    """MXFP4 indexer rows of ``index_k [N, d]`` at ``slot_mapping`` (``Mxfp4Indexer.encode``)."""
    return _write(Mxfp4Indexer, index_k, cache_2d, slot_mapping, block_size)


# ----- cache readers ----------------------------------------------------------------------------
def read_deepseek_v4_indexer_fp8_cache(cache_2d, slot_mapping, block_size=64):
    """float32 ``[N, d]`` rows at ``slot_mapping`` (``Fp8Indexer.decode``); zero rows for slot < 0."""
    return slot_decode(indexer_of_cache(Fp8Indexer, cache_2d, block_size), cache_2d, slot_mapping)


def read_deepseek_v4_indexer_mxfp4_cache(cache_2d, slot_mapping, block_size=64):
    """float32 ``[N, d]`` rows at ``slot_mapping`` (``Mxfp4Indexer.decode``); zero rows for slot < 0."""
    return slot_decode(indexer_of_cache(Mxfp4Indexer, cache_2d, block_size), cache_2d, slot_mapping)


def dequantize_deepseek_v4_fp8_ds_mla_cache(cache_2d, slot_mapping, block_size=64, *, head_dim, rope_dim):
    """bf16 ``[N, head_dim]`` fp8_ds_mla rows at ``slot_mapping`` (``Fp8DsMla.decode``)."""
    return slot_decode(ds_mla(head_dim, rope_dim, block_size), cache_2d, slot_mapping)


# ----- query and output transforms ---------------------------------------------------------------
def deepseek_v4_prepare_indexer_q_mxfp4(index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale):
    """``((q_packed uint8 [T, H, 64], q_scale int32 [T, H]), weights_out [T, H])``
    (``dsv4.prepare_indexer_q_mxfp4``)."""
    (packed, scale), weights_out = prepare_indexer_q_mxfp4(index_q, positions, cos_sin_cache, weights,
                                                           softmax_scale, head_scale)
    if not packed.is_contiguous():  # the reference returns a view of its [T * H, 68] rows
        packed = packed.contiguous()
    return (packed, scale), weights_out


def deepseek_v4_prepare_indexer_q_fp8(index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale):
    """``(q_fp8 float8_e4m3fn [T, H, 128], weights_out [T, H])`` (``dsv4.prepare_indexer_q_fp8``)."""
    return prepare_indexer_q_fp8(index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale)


def deepseek_v4_prepare_indexer_q(index_q, positions, cos_sin_cache, weights, head_scale):
    """tokenspeed 0.1.1's query prep for the public (bf16) DSA top-k: ``(query bf16 [T, H, D],
    weights_out float32 [T, H])``, ``query = Hadamard(bf16(rope_p(index_q)), D^-0.5)`` (kvformats'
    ``rope_tail`` then ``hadamard_transform``, the first steps of its quantized query preps) and
    ``weights_out = weights * head_scale`` (``weights`` ``[T, H]`` or ``[T, H, 1]``)."""
    if not isinstance(index_q, torch.Tensor) or index_q.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"index_q must be a float tensor [tokens, heads, dim], got {describe(index_q)}")
    if not isinstance(weights, torch.Tensor) or weights.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"weights must be a float tensor [tokens, heads], got {describe(weights)}")
    if weights.dim() == 3:
        weights = weights.squeeze(-1)
    if index_q.dim() != 3 or weights.shape != index_q.shape[:2] or weights.device != index_q.device:
        raise InputError(f"index_q must be [tokens, heads, dim] and weights [tokens, heads] on its device, got "
                         f"{describe(index_q)} and {describe(weights)}")
    if isinstance(head_scale, bool) or not isinstance(head_scale, (int, float)):
        raise InputTypeError(f"head_scale must be a float, got {describe(head_scale)}")
    rotated = rope_tail(index_q, positions, cos_sin_cache)
    query = _hadamard(rotated, index_q.shape[-1] ** -0.5)
    return query.contiguous(), (weights.float() * float(head_scale)).contiguous()


def deepseek_v4_fused_inv_rope_fp8_quant(o, positions, cos_sin_cache, n_groups, heads_per_group, nope_dim=448,
                                         rope_dim=64, quant_group_size=128, tma_aligned_scales=True):
    """Inverse RoPE + FP8 quant of the attention output, in DeepGEMM's views
    (``dsv4.inv_rope_fp8_quant``). kvformats reads the RoPE width from ``cos_sin_cache`` and puts
    the RoPE dims last: ``rope_dim`` must be the table's width and ``nope_dim + rope_dim`` the head."""
    try:
        width, d = cos_sin_cache.shape[1], o.shape[2]
    except (AttributeError, IndexError, TypeError):
        width = d = None  # not tensors of the expected dims: the native call says what is wrong
    if width is not None and (width != rope_dim or nope_dim + rope_dim != d):
        raise InputError(f"rope_dim ({rope_dim!r}) must be the cos_sin_cache width ({width}) and nope_dim + rope_dim "
                         f"({nope_dim!r} + {rope_dim!r}) the head dim ({d}): kvformats puts the RoPE dims last")
    if quant_group_size == 128 and tma_aligned_scales is True:  # the defaults: the native call's shortest key
        return inv_rope_fp8_quant(o, positions, cos_sin_cache, n_groups=n_groups, heads_per_group=heads_per_group)
    return inv_rope_fp8_quant(o, positions, cos_sin_cache, n_groups=n_groups, heads_per_group=heads_per_group,
              quant_group_size=quant_group_size, tma_aligned_scales=tma_aligned_scales)


def hadamard_transform(x, *, scale=1.0, override=None, solution=None):
    """Natural-order Walsh-Hadamard transform of the last dim times ``scale``, in ``x``'s dtype
    (``dsv4.hadamard_transform``: bf16 input, float32 butterfly, bf16 result). ``override`` and
    ``solution`` pick among tokenspeed's registered kernels; kvformats has one definition, so they
    are accepted and not used."""
    y = _hadamard(x, scale)
    return y if y.dtype == x.dtype else y.to(x.dtype)
