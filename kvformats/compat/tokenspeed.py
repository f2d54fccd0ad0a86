"""tokenspeed's DeepSeek V4 attention-ops boundary under its own names: adopt kvformats by
changing one import.

    # from tokenspeed.runtime.layers.attention.deepseek_v4_ops import *
    from kvformats.compat.tokenspeed import *

Every public function of tokenspeed's ``deepseek_v4_ops.py`` at f3e4d1e2 (its ``__all__``), the
functions engine code calls beside them (``hadamard_transform``, the FP8 query prep and paged FP8
gather that reached tokenspeed's main branch at 6a08766a, the MXFP4 gathers) and the cache-spec
helpers and constants the module imports, with tokenspeed's parameter names, order, defaults,
keyword-only markers and return conventions (``spec/tokenspeed-signatures.json``). Each is an
argument adaptation around the native kvformats call: the same validation (typed errors, values
checked on the device record by default), backends, CUDA-graph capture and replay; under
``torch.compile`` the calls go through kvformats' ``torch.library`` ops. Where tokenspeed is
undefined or refuses CPU tensors, kvformats' contract applies: the table of differences is at
the top of docs/porting-from-tokenspeed.md.
"""

from __future__ import annotations

import torch

from kvformats.compat import tokenspeed_spec as _spec
from kvformats.codec.slot_ops import decode as slot_decode
from kvformats.codec.slot_ops import encode as slot_encode
from kvformats.compat._common import (cache_head_dim, compiling, dops, ds_mla, head, indexer_of_cache,
                                      indexer_of_rows, op_key, rows_of, same_pages, shortest)
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
from kvformats.deepseek_v4.swa import swa_insert
from kvformats.deepseek_v4.transforms import hadamard_transform as _hadamard
from kvformats.errors import InputError
from kvformats.formats import Fp8Indexer, Mxfp4Indexer

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
# called by engine code beside them (tokenspeed's kernel package, or main after f3e4d1e2)
ENGINE_NAMES = ("hadamard_transform", "deepseek_v4_prepare_indexer_q_fp8", "deepseek_v4_gather_indexer_mxfp4_cache",
                "indexer_mxfp4_paged_gather", "gather_paged_indexer_fp8_cache")
__all__ = [*OPS_ALL, *ENGINE_NAMES, *_spec.__all__]


# ----- cache writers ----------------------------------------------------------------------------
def fused_qnorm_rope_kv_insert(q, kv, swa_kv_cache_2d, slot_mapping, positions, cos_sin_cache, rms_norm_eps,
                               block_size):
    """RMSNorm + RoPE of ``q`` in place, and ``kv`` into the SWA cache (``dsv4.swa_insert``)."""
    (dops.swa_insert if compiling() else swa_insert)(q, kv, swa_kv_cache_2d, slot_mapping, positions, cos_sin_cache,
                                                     rms_norm_eps, page_size=block_size)


def deepseek_v4_hca_compress_kv_cache_insert(state_cache, token_to_req_indices, positions, compressor_slot_mapping,
                                             block_table, compressor_block_size, rms_norm_weight, rms_norm_eps,
                                             cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                                             compress_ratio=128, block_table_base_offsets=None):
    """HCA (ratio 128) compress-insert (``dsv4.hca_compress_kv_insert``)."""
    return _compress_kv_insert("HCA", 128, compress_ratio, state_cache, token_to_req_indices, positions,
                               compressor_slot_mapping, block_table, compressor_block_size, rms_norm_weight,
                               rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                               block_table_base_offsets)


def deepseek_v4_csa_compress_kv_cache_insert(state_cache, token_to_req_indices, positions, compressor_slot_mapping,
                                             block_table, compressor_block_size, rms_norm_weight, rms_norm_eps,
                                             cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                                             compress_ratio=4, block_table_base_offsets=None):
    """CSA (ratio 4, overlapping windows) compress-insert (``dsv4.csa_compress_kv_insert``)."""
    return _compress_kv_insert("CSA", 4, compress_ratio, state_cache, token_to_req_indices, positions,
                               compressor_slot_mapping, block_table, compressor_block_size, rms_norm_weight,
                               rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                               block_table_base_offsets)


def _compress_kv_insert(label, ratio, compress_ratio, state_cache, req, positions, state_slots, block_table,
                        state_block_size, weight, eps, cos_sin, kv_cache_2d, kv_slots, kv_block_size, base):
    """The CSA / HCA compress-insert of one ratio, with tokenspeed's length rule: its tokens are the
    shortest of the state slot mapping and positions (for the HCA, of the kv slot mapping too), as
    each of tokenspeed's two wrappers counts them."""
    if compress_ratio != ratio:
        raise InputError(f"{label} cache insert requires compress_ratio={ratio}, got {compress_ratio!r}")
    same_pages("compressor_block_size", state_block_size, state_cache)
    fn = dops.compress_kv_insert if compiling() else compress_kv_insert
    while True:
        try:
            return fn(state_cache, kv_cache_2d, ratio=ratio, positions=positions, req_indices=req,
                      state_slots=state_slots, block_table=block_table, rms_weight=weight, rms_eps=eps,
                      cos_sin_cache=cos_sin, kv_slots=kv_slots, kv_page_size=kv_block_size,
                      block_table_base_offsets=base)
        except InputError:  # the native call refused the lengths: cut them as tokenspeed does
            lengths = (state_slots, positions, kv_slots) if ratio == 128 else (state_slots, positions)
            cut = shortest(rows_of(*lengths), (positions, req, state_slots, kv_slots))
            if cut is None:
                raise
            positions, req, state_slots, kv_slots = cut


def deepseek_v4_csa_indexer_cache_insert(state_cache, token_to_req_indices, positions, compressor_slot_mapping,
                                         block_table, compressor_block_size, rms_norm_weight, rms_norm_eps,
                                         cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
                                         use_fp4_cache, compress_ratio=4, block_table_base_offsets=None):
    """CSA indexer compress-insert into an MXFP4 (``use_fp4_cache``) or FP8 indexer cache
    (``dsv4.indexer_compress_insert``)."""
    if compress_ratio != 4:
        raise InputError(f"CSA indexer cache insert requires compress_ratio=4, got {compress_ratio!r}")
    same_pages("compressor_block_size", compressor_block_size, state_cache)
    fn = dops.indexer_compress_insert if compiling() else indexer_compress_insert
    while True:
        try:
            return fn(state_cache, kv_cache_2d, index_format="mxfp4_indexer" if use_fp4_cache else "fp8_indexer",
                      positions=positions, req_indices=token_to_req_indices, state_slots=compressor_slot_mapping,
                      block_table=block_table, rms_weight=rms_norm_weight, rms_eps=rms_norm_eps,
                      cos_sin_cache=cos_sin_cache, index_slots=kv_slot_mapping, index_page_size=kv_cache_block_size,
                      block_table_base_offsets=block_table_base_offsets)
        except InputError:  # tokenspeed's tokens: the shortest of the state slot mapping and positions
            cut = shortest(rows_of(compressor_slot_mapping, positions),
                           (positions, token_to_req_indices, compressor_slot_mapping, kv_slot_mapping))
            if cut is None:
                raise
            positions, token_to_req_indices, compressor_slot_mapping, kv_slot_mapping = cut


_APE: dict = {}  # id(runtime ape) -> (ape, its version, checkpoint-order copy)


def _unreorder(ape: torch.Tensor) -> torch.Tensor:
    """The checkpoint-order ape of tokenspeed's runtime (window-order) C4 ape: tokenspeed keeps
    ``cat([ape[:, :h], ape[:, h:]], 0).reshape(4, 2h)``; this is its inverse."""
    ratio, width = ape.shape
    return ape.reshape(2, ratio, width // 2).transpose(0, 1).reshape(ratio, width)


def checkpoint_ape(ape, compress_ratio):
    """``ape`` as kvformats takes it (checkpoint order) from the one tokenspeed's callers pass (a C4
    ape reordered once at weight loading). Weights do not change between calls: the copy is kept
    per tensor and version (not while a CUDA graph is captured, when the copy is not run yet)."""
    if compress_ratio != 4:
        return ape
    hit = _APE.get(id(ape))
    if hit is not None and hit[0] is ape and hit[1] == ape._version:
        return hit[2]
    if not isinstance(ape, torch.Tensor) or ape.dim() != 2 or ape.shape[1] % 2:
        return ape  # not a C4 ape: the native call says what is wrong
    ckpt = _unreorder(ape)
    if not (ape.is_cuda and torch.cuda.is_current_stream_capturing()):
        if len(_APE) >= 512:
            _APE.clear()
        _APE[id(ape)] = (ape, ape._version, ckpt)
    return ckpt


def save_deepseek_v4_compressor_state(kv, score, ape, state_cache, slot_mapping, positions, block_size,
                                      compress_ratio):
    """One ``[kv | score + ape[p % ratio]]`` state row per token (``dsv4.save_compressor_state``).
    ``ape`` is tokenspeed's runtime tensor (the C4 ape reordered at loading), as its callers pass it."""
    same_pages("block_size", block_size, state_cache)
    if compiling():
        n = rows_of(slot_mapping, kv)
        return dops.save_compressor_state(head(kv, n), head(score, n), _unreorder(ape) if compress_ratio == 4 else ape,
                                          state_cache, ratio=compress_ratio, positions=head(positions, n),
                                          slots=head(slot_mapping, n))
    if compress_ratio == 4:  # checkpoint_ape, its hit inlined (the steady state)
        hit = _APE.get(id(ape))
        ape = hit[2] if hit is not None and hit[0] is ape and hit[1] == ape._version else checkpoint_ape(ape, 4)
    while True:
        try:
            return save_compressor_state(kv, score, ape, state_cache, ratio=compress_ratio, positions=positions,
                                         slots=slot_mapping)
        except InputError:  # tokenspeed's tokens: the shortest of kv and the slot mapping
            cut = shortest(rows_of(slot_mapping, kv), (kv, score, positions, slot_mapping))
            if cut is None:
                raise
            kv, score, positions, slot_mapping = cut


def _write(cls, index_k, cache_2d, slot_mapping, block_size) -> None:
    if compiling():
        n = rows_of(slot_mapping, index_k)
        return torch.ops.kvformats.encode(*op_key(cls.name, index_k.shape[1], block_size), [head(index_k, n)], cache_2d,
                                          head(slot_mapping, n), "auto")
    lay = indexer_of_rows(cls, index_k, block_size)
    while True:
        try:
            return slot_encode(lay, index_k, cache_2d, slot_mapping)
        except InputError:  # tokenspeed's rows: the shortest of index_k and the slot mapping
            cut = shortest(rows_of(slot_mapping, index_k), (index_k, slot_mapping))
            if cut is None:
                raise
            index_k, slot_mapping = cut


def write_deepseek_v4_indexer_fp8_cache(index_k, cache_2d, slot_mapping, block_size=64):
    """FP8 indexer rows of ``index_k [N, d]`` at ``slot_mapping`` (``Fp8Indexer.encode``)."""
    return _write(Fp8Indexer, index_k, cache_2d, slot_mapping, block_size)


def write_deepseek_v4_indexer_mxfp4_cache(index_k, cache_2d, slot_mapping, block_size=64):
    """MXFP4 indexer rows of ``index_k [N, d]`` at ``slot_mapping`` (``Mxfp4Indexer.encode``)."""
    return _write(Mxfp4Indexer, index_k, cache_2d, slot_mapping, block_size)


# ----- cache readers ----------------------------------------------------------------------------
def read_deepseek_v4_indexer_fp8_cache(cache_2d, slot_mapping, block_size=64):
    """float32 ``[N, d]`` rows at ``slot_mapping`` (``Fp8Indexer.decode``); zero rows for slot < 0."""
    if compiling():
        d = cache_head_dim(cache_2d, block_size, _spec.deepseek_v4_indexer_fp8_layout_from_row_bytes)
        return torch.ops.kvformats.decode(*op_key("fp8_indexer", d, block_size), cache_2d, slot_mapping, "auto")[0]
    return slot_decode(indexer_of_cache(Fp8Indexer, cache_2d, block_size), cache_2d, slot_mapping)


def read_deepseek_v4_indexer_mxfp4_cache(cache_2d, slot_mapping, block_size=64):
    """float32 ``[N, d]`` rows at ``slot_mapping`` (``Mxfp4Indexer.decode``); zero rows for slot < 0."""
    if compiling():
        d = cache_head_dim(cache_2d, block_size, _spec.deepseek_v4_indexer_mxfp4_layout_from_row_bytes)
        return torch.ops.kvformats.decode(*op_key("mxfp4_indexer", d, block_size), cache_2d, slot_mapping, "auto")[0]
    return slot_decode(indexer_of_cache(Mxfp4Indexer, cache_2d, block_size), cache_2d, slot_mapping)


def dequantize_deepseek_v4_fp8_ds_mla_cache(cache_2d, slot_mapping, block_size=64, *, head_dim, rope_dim):
    """bf16 ``[N, head_dim]`` fp8_ds_mla rows at ``slot_mapping`` (``Fp8DsMla.decode``)."""
    if compiling():
        return torch.ops.kvformats.decode(*op_key("fp8_ds_mla", head_dim, block_size, rope_dim), cache_2d, slot_mapping,
                                          "auto")[0]
    return slot_decode(ds_mla(head_dim, rope_dim, block_size), cache_2d, slot_mapping)


# ----- query and output transforms ---------------------------------------------------------------
def deepseek_v4_prepare_indexer_q_mxfp4(index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale):
    """``((q_packed uint8 [T, H, 64], q_scale int32 [T, H]), weights_out [T, H])``
    (``dsv4.prepare_indexer_q_mxfp4``)."""
    if compiling():
        return dops.prepare_indexer_q_mxfp4(index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale)
    (packed, scale), weights_out = prepare_indexer_q_mxfp4(index_q, positions, cos_sin_cache, weights,
                                                           softmax_scale, head_scale)
    if not packed.is_contiguous():  # the reference returns a view of its [T * H, 68] rows
        packed = packed.contiguous()
    return (packed, scale), weights_out


def deepseek_v4_prepare_indexer_q_fp8(index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale):
    """``(q_fp8 float8_e4m3fn [T, H, 128], weights_out [T, H])`` (``dsv4.prepare_indexer_q_fp8``)."""
    return (dops.prepare_indexer_q_fp8 if compiling() else prepare_indexer_q_fp8)(
        index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale)


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
    fn = dops.inv_rope_fp8_quant if compiling() else inv_rope_fp8_quant
    if quant_group_size == 128 and tma_aligned_scales is True:  # the defaults: the native call's shortest key
        return fn(o, positions, cos_sin_cache, n_groups=n_groups, heads_per_group=heads_per_group)
    return fn(o, positions, cos_sin_cache, n_groups=n_groups, heads_per_group=heads_per_group,
              quant_group_size=quant_group_size, tma_aligned_scales=tma_aligned_scales)


def hadamard_transform(x, *, scale=1.0, override=None, solution=None):
    """Natural-order Walsh-Hadamard transform of the last dim times ``scale``, in ``x``'s dtype
    (``dsv4.hadamard_transform``: bf16 input, float32 butterfly, bf16 result). ``override`` and
    ``solution`` pick among tokenspeed's registered kernels; kvformats has one definition, so they
    are accepted and not used."""
    y = (dops.hadamard_transform if compiling() else _hadamard)(x, scale)
    return y if y.dtype == x.dtype else y.to(x.dtype)
