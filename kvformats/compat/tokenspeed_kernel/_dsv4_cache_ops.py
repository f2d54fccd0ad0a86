"""The functions ``_dsv4_cache`` exports (its docstring says what each takes, what it calls and where
it departs from tokenspeed-kernel 0.1.4). Each makes the checks tokenspeed makes and kvformats'
native call does not (DeepSeek V4's fixed geometry, contiguity, the kernel choice), applies
tokenspeed's length rule, then calls the ``kvformats.compat.tokenspeed`` drop-in, which validates
the rest before anything is written and makes the native call. Those whose adaptation is checks
and views are ``replayed`` (``_dsv4_indices_torch``): the steady state replays their launches, as
the native calls' are replayed."""

from __future__ import annotations

import torch

from kvformats.codec.slot_ops import encode as slot_encode
from kvformats.compat._common import cut, head, indexer_of_rows, rows_of
from kvformats.compat.tokenspeed import (deepseek_v4_csa_compress_kv_cache_insert, deepseek_v4_csa_indexer_cache_insert,
                                         deepseek_v4_hca_compress_kv_cache_insert, deepseek_v4_prepare_indexer_q_mxfp4,
                                         fused_qnorm_rope_kv_insert, save_deepseek_v4_compressor_state)
from kvformats.compat._replay import aranged, replayed
from kvformats.compat.tokenspeed_paged import (HEAD_DIM, INDEX_HEAD_DIM, ROPE_DIM,
                                               deepseek_v4_dequantize_and_gather_k_cache,
                                               deepseek_v4_gather_indexer_mxfp4_cache)
from kvformats.errors import InputError, InputTypeError, describe
from kvformats.formats import Mxfp4Indexer
from kvformats.validation import INDEX_DTYPES, check_tensor

FP8_INDEX_PAGE = 64  # rows per page tokenspeed's FP8 indexer insert is built for
# the solutions tokenspeed registers for its two selected ops; a kernel is named "<solution>_<op>"
SOLUTIONS = {"dsv4_swa_cache_insert": ("triton", "cuda"), "dsv4_csa_indexer_fp8_cache_insert": ("triton",)}


# ----- tokenspeed's checks that the native calls do not make ------------------------------------
def _size(t, dim: int):
    """``t.shape[dim]``, or None where ``t`` is not a tensor with that dim (the native call then
    says what is wrong)."""
    try:
        return t.shape[dim]
    except (AttributeError, IndexError, TypeError):
        return None


def _fixed(name: str, got, want: int) -> None:
    """tokenspeed's kernels are compiled for DeepSeek V4's one geometry (head 512, RoPE 64, indexer
    head 128); kvformats' model ops are generic and would write another layout."""
    if got is not None and got != want:
        raise InputError(f"{name} must be {want} (DeepSeek V4, the geometry tokenspeed's kernels are built for), "
                         f"got {got}")


def _rope(cos_sin_cache) -> None:
    _fixed("cos_sin_cache's width (the RoPE dim)", _size(cos_sin_cache, 1), ROPE_DIM)


def _contiguous(**tensors) -> None:
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and not t.is_contiguous():
            raise InputError(f"{name} must be contiguous, got {describe(t)} with strides {t.stride()}")


def _registered(op: str, override, solution) -> None:
    """tokenspeed's kernel choice: ``solution`` one of the op's solutions, ``override`` one of them or
    a kernel's name. kvformats has one implementation, which runs for any of them."""
    solutions = SOLUTIONS[op]
    if solution is not None and (not isinstance(solution, str) or solution not in solutions):
        raise InputError(f"solution must be None or one of {solutions} for {op}, got {describe(solution)}")
    if override is not None and (not isinstance(override, str) or (
            override not in solutions and override.removesuffix("_" + op) not in solutions)):
        raise InputError(f"override must be None, a solution of {op} ({solutions}) or one of its kernels "
                         f"({', '.join(s + '_' + op for s in solutions)}), got {describe(override)}")


# ----- SWA insert ----------------------------------------------------------------------------------
def _no_q_out(args, kwargs) -> bool:
    """Whether a SWA insert call leaves ``q_out`` None (else its copy of ``q`` is device work)."""
    return (args[8] if len(args) > 8 else kwargs.get("q_out")) is None


@replayed(plain=_no_q_out)
def dsv4_swa_cache_insert(q: torch.Tensor, kv: torch.Tensor, swa_kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                          positions: torch.Tensor, cos_sin_cache: torch.Tensor, rms_norm_eps: float, page_size: int,
                          q_out: torch.Tensor | None = None, override: str | None = None, solution: str | None = None,
                          *, validate_positions: bool) -> None:
    """``fused_qnorm_rope_kv_insert`` after tokenspeed's checks: q bf16 ``[T, H, 512]`` (float32:
    refused there), q, kv, positions, slots and the table contiguous, RoPE width 64, eps > 0."""
    if override is not None or solution is not None:
        _registered("dsv4_swa_cache_insert", override, solution)
    _fixed("q's head dim", _size(q, 2), HEAD_DIM)
    if isinstance(q, torch.Tensor) and q.dtype is torch.float32:
        raise InputTypeError(f"q and kv must be bfloat16 (tokenspeed: float16 or bfloat16), got {describe(q)}")
    try:  # the steady state: five contiguous tensors, no dict of them built
        dense = (q.is_contiguous() and kv.is_contiguous() and positions.is_contiguous()
                 and slot_mapping.is_contiguous() and cos_sin_cache.is_contiguous())
    except AttributeError:
        dense = False
    if not dense:
        _contiguous(q=q, kv=kv, positions=positions, slot_mapping=slot_mapping, cos_sin_cache=cos_sin_cache)
    _rope(cos_sin_cache)
    if isinstance(rms_norm_eps, (int, float)) and not isinstance(rms_norm_eps, bool) and not rms_norm_eps > 0:
        raise InputError(f"rms_norm_eps must be positive, got {rms_norm_eps!r}")
    fused_qnorm_rope_kv_insert(q, kv, swa_kv_cache, slot_mapping, positions, cos_sin_cache, rms_norm_eps, page_size,
                               q_out, validate_positions=validate_positions)


@replayed(plain=_no_q_out)
def triton_dsv4_swa_cache_insert(q: torch.Tensor, kv: torch.Tensor, swa_kv_cache: torch.Tensor,
                                 slot_mapping: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                                 rms_norm_eps: float, page_size: int, q_out: torch.Tensor | None = None) -> None:
    """The registered kernel: no checks but head 512 and ``q_out``'s; its insert count is the
    shortest of kv, the slots and positions (at most T here); longer kv / positions are read for
    their first T rows."""
    _fixed("q's head dim", _size(q, 2), HEAD_DIM)
    _rope(cos_sin_cache)
    tokens, inserts = _size(q, 0), rows_of(kv, slot_mapping, positions)
    if tokens is not None and inserts is not None:
        if inserts > tokens:
            raise InputError(f"kv, slot_mapping and positions name {inserts} rows to insert, more than the {tokens} "
                             f"query tokens (kvformats inserts one row per query token)")
        kv, positions, slot_mapping = head(kv, tokens), head(positions, tokens), head(slot_mapping, inserts)
    fused_qnorm_rope_kv_insert(q, kv, swa_kv_cache, slot_mapping, positions, cos_sin_cache, rms_norm_eps, page_size,
                               q_out)


# ----- compress inserts ----------------------------------------------------------------------------
def _tokens(positions, req, state_slots, kv_slots) -> tuple:
    """tokenspeed-kernel 0.1.4's tokens of a compress insert: the shortest of the state slot mapping,
    positions and the kv slot mapping, whose first entries (and those of a longer
    ``token_to_req_indices``) it reads."""
    return cut((state_slots, positions, kv_slots), (positions, req, state_slots, kv_slots))


def _indexer_insert(fp4: bool, state_cache, req, positions, state_slots, block_table, block_size, weight, eps,
                    cos_sin_cache, cache, kv_slots, kv_block_size, ratio, base) -> None:
    _fixed("rms_norm_weight's size (the indexer head dim)", weight.numel() if isinstance(weight, torch.Tensor)
           else None, INDEX_HEAD_DIM)
    _rope(cos_sin_cache)
    positions, req, state_slots, kv_slots = _tokens(positions, req, state_slots, kv_slots)
    deepseek_v4_csa_indexer_cache_insert(state_cache, req, positions, state_slots, block_table, block_size, weight, eps,
                                         cos_sin_cache, cache, kv_slots, kv_block_size, fp4, ratio, base)


def _fp8_pages(kv_cache_block_size) -> None:
    if kv_cache_block_size != FP8_INDEX_PAGE:
        raise InputError(f"the FP8 indexer insert requires kv_cache_block_size={FP8_INDEX_PAGE}, "
                         f"got {kv_cache_block_size!r}")


@replayed
def dsv4_csa_indexer_fp8_cache_insert(state_cache: torch.Tensor, token_to_req_indices: torch.Tensor,
                                      positions: torch.Tensor, compressor_slot_mapping: torch.Tensor,
                                      block_table: torch.Tensor, compressor_block_size: int,
                                      rms_norm_weight: torch.Tensor, rms_norm_eps: float,
                                      cos_sin_cache: torch.Tensor, kv_cache_2d: torch.Tensor,
                                      kv_slot_mapping: torch.Tensor, kv_cache_block_size: int,
                                      compress_ratio: int = 4, block_table_base_offsets: torch.Tensor | None = None,
                                      override: str | None = None, solution: str | None = None) -> None:
    """``deepseek_v4_csa_indexer_cache_insert(..., use_fp4_cache=False)`` on 64-row pages."""
    _registered("dsv4_csa_indexer_fp8_cache_insert", override, solution)
    _fp8_pages(kv_cache_block_size)
    _indexer_insert(False, state_cache, token_to_req_indices, positions, compressor_slot_mapping, block_table,
                    compressor_block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_slot_mapping,
                    kv_cache_block_size, compress_ratio, block_table_base_offsets)


@replayed
def triton_dsv4_csa_indexer_fp8_cache_insert(*, state_cache: torch.Tensor, token_to_req_indices: torch.Tensor,
                                             positions: torch.Tensor, compressor_slot_mapping: torch.Tensor,
                                             block_table: torch.Tensor, compressor_block_size: int,
                                             rms_norm_weight: torch.Tensor, rms_norm_eps: float,
                                             cos_sin_cache: torch.Tensor, kv_cache_2d: torch.Tensor,
                                             kv_slot_mapping: torch.Tensor, kv_cache_block_size: int,
                                             compress_ratio: int,
                                             block_table_base_offsets: torch.Tensor | None = None) -> None:
    """The registered kernel of ``dsv4_csa_indexer_fp8_cache_insert``: the same call."""
    _fp8_pages(kv_cache_block_size)
    _indexer_insert(False, state_cache, token_to_req_indices, positions, compressor_slot_mapping, block_table,
                    compressor_block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_slot_mapping,
                    kv_cache_block_size, compress_ratio, block_table_base_offsets)


@replayed
def dsv4_fused_csa_indexer_mxfp4_cache_insert(*, state_cache: torch.Tensor, token_to_req_indices: torch.Tensor,
                                              positions: torch.Tensor, compressor_slot_mapping: torch.Tensor,
                                              block_table: torch.Tensor, compressor_block_size: int,
                                              rms_norm_weight: torch.Tensor, rms_norm_eps: float,
                                              cos_sin_cache: torch.Tensor, kv_cache_2d: torch.Tensor,
                                              kv_slot_mapping: torch.Tensor, kv_cache_block_size: int,
                                              compress_ratio: int,
                                              block_table_base_offsets: torch.Tensor | None = None) -> None:
    """``deepseek_v4_csa_indexer_cache_insert(..., use_fp4_cache=True)``."""
    _indexer_insert(True, state_cache, token_to_req_indices, positions, compressor_slot_mapping, block_table,
                    compressor_block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_slot_mapping,
                    kv_cache_block_size, compress_ratio, block_table_base_offsets)


# (compress_ratio, overlap) -> the insert: the two compressors of DeepSeek V4
_SPARSE = {(4, True): deepseek_v4_csa_compress_kv_cache_insert, (128, False): deepseek_v4_hca_compress_kv_cache_insert}


@replayed(plain=lambda args, kwargs: kwargs.get("kv_write_mask") is None)  # a mask: a torch.where
def dsv4_fused_sparse_compress_cache_insert(*, state_cache: torch.Tensor, token_to_req_indices: torch.Tensor,
                                            positions: torch.Tensor, compressor_slot_mapping: torch.Tensor,
                                            block_table: torch.Tensor, compressor_block_size: int,
                                            rms_norm_weight: torch.Tensor, rms_norm_eps: float,
                                            cos_sin_cache: torch.Tensor, kv_cache_2d: torch.Tensor,
                                            kv_slot_mapping: torch.Tensor, kv_cache_block_size: int,
                                            compress_ratio: int, overlap: bool,
                                            block_table_base_offsets: torch.Tensor | None,
                                            kv_write_mask: torch.Tensor | None) -> None:
    """The CSA (ratio 4, overlapping windows) or HCA (ratio 128) compress-insert drop-in, with
    0.1.1's ``kv_write_mask`` (contiguous, as tokenspeed requires) and the base offsets."""
    insert = None
    if type(compress_ratio) is int and type(overlap) in (bool, int) and overlap in (0, 1):
        insert = _SPARSE.get((compress_ratio, bool(overlap)))
    if insert is None:
        raise InputError(f"(compress_ratio, overlap) must be (4, True) (CSA) or (128, False) (HCA), got "
                         f"({describe(compress_ratio)}, {describe(overlap)})")
    if kv_write_mask is not None:
        if not isinstance(kv_write_mask, torch.Tensor):
            raise InputTypeError(f"kv_write_mask must be None or a bool tensor [tokens], got {describe(kv_write_mask)}")
        _contiguous(kv_write_mask=kv_write_mask)
    _fixed("rms_norm_weight's size (the head dim)", rms_norm_weight.numel() if isinstance(rms_norm_weight, torch.Tensor)
           else None, HEAD_DIM)
    _rope(cos_sin_cache)
    insert(state_cache, token_to_req_indices, positions, compressor_slot_mapping, block_table, compressor_block_size,
           rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_slot_mapping, kv_cache_block_size,
           kv_write_mask=kv_write_mask, compress_ratio=compress_ratio,
           block_table_base_offsets=block_table_base_offsets)


@replayed
def dsv4_save_compressor_state(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, state_cache: torch.Tensor,
                               slot_mapping: torch.Tensor, positions: torch.Tensor, block_size: int,
                               compress_ratio: int) -> None:
    """``save_deepseek_v4_compressor_state`` (the ratio-4 ape in tokenspeed's runtime order)."""
    save_deepseek_v4_compressor_state(kv, score, ape, state_cache, slot_mapping, positions, block_size, compress_ratio)


# ----- MXFP4 indexer rows ----------------------------------------------------------------------------
def write_dsv4_indexer_mxfp4_cache_cuda(index_k: torch.Tensor, cache_2d: torch.Tensor, slot_mapping: torch.Tensor,
                                        valid: torch.Tensor, block_size: int) -> None:
    """``write_deepseek_v4_indexer_mxfp4_cache`` of the first N = min(rows, slots, valid) rows, a
    token whose ``valid`` entry is 0 given slot -1 (written nowhere), as tokenspeed skips it."""
    _fixed("index_k's width (the indexer head dim)", _size(index_k, 1), INDEX_HEAD_DIM)
    check_tensor("slot_mapping", slot_mapping, dtypes=INDEX_DTYPES, shape=(None,))
    if not isinstance(valid, torch.Tensor):
        raise InputTypeError(f"valid must be a tensor [rows], got {describe(valid)}")
    if valid.dim() != 1 or valid.device != slot_mapping.device:
        raise InputError(f"valid must be 1-D on slot_mapping's device ({slot_mapping.device}), got {describe(valid)}")
    index_k, slot_mapping, valid = cut((index_k, slot_mapping, valid), (index_k, slot_mapping, valid))
    # the one torch operation of the drop-in (kvformats' encode takes no validity mask), which keeps
    # it off replay: its native encode is replayed on its own. The -1 is a kept one-entry tensor of
    # the slots' dtype (same result, dtype included): a Python -1 would be one more dispatched
    # operation per call (aten.scalar_tensor)
    none = aranged(1, slot_mapping.device, -1, slot_mapping.dtype)
    slots = torch.where(valid if valid.dtype is torch.bool else valid != 0, slot_mapping, none)
    # what write_deepseek_v4_indexer_mxfp4_cache does after its length rule, already applied above
    slot_encode(indexer_of_rows(Mxfp4Indexer, index_k, block_size), index_k, cache_2d, slots)


def dsv4_gather_indexer_mxfp4_cache(*, cache_2d: torch.Tensor, slot_mapping: torch.Tensor, values_out: torch.Tensor,
                                    scales_out: torch.Tensor, block_size: int) -> None:
    """``deepseek_v4_gather_indexer_mxfp4_cache``: 0.1.4 kept its signature and behaviour."""
    deepseek_v4_gather_indexer_mxfp4_cache(cache_2d=cache_2d, slot_mapping=slot_mapping, values_out=values_out,
                                           scales_out=scales_out, block_size=block_size)


# ----- sparse-prefill gather and the indexer query ---------------------------------------------------
@replayed
def dsv4_dequantize_and_gather_k_cache(*, out: torch.Tensor, cache_2d: torch.Tensor, seq_lens: torch.Tensor,
                                       gather_lens: torch.Tensor | None, block_table: torch.Tensor, block_size: int,
                                       offset: int, block_table_base_offsets: torch.Tensor | None = None,
                                       max_gather_len: int | None = None) -> None:
    """``deepseek_v4_dequantize_and_gather_k_cache`` (``gather_lens=None``: each request's whole
    sequence)."""
    deepseek_v4_dequantize_and_gather_k_cache(out=out, cache_2d=cache_2d, seq_lens=seq_lens, gather_lens=gather_lens,
                                              block_table=block_table, block_size=block_size, offset=offset,
                                              block_table_base_offsets=block_table_base_offsets,
                                              max_gather_len=max_gather_len)


@replayed
def dsv4_fused_indexer_q_rope_hadamard_mxfp4(*, index_q: torch.Tensor, positions: torch.Tensor,
                                             cos_sin_cache: torch.Tensor, weights: torch.Tensor, softmax_scale: float,
                                             head_scale: float, prefer_serial_four_block: bool
                                             ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``deepseek_v4_prepare_indexer_q_mxfp4``; ``weights_out`` has ``weights``' shape (``[T, H]`` or
    ``[T, H, 1]``). ``prefer_serial_four_block`` picks tokenspeed's launch on SM100 at 8192 tokens
    and is not used (kvformats has one implementation)."""
    _rope(cos_sin_cache)
    (packed, scale), weights_out = deepseek_v4_prepare_indexer_q_mxfp4(index_q, positions, cos_sin_cache, weights,
                                                                       softmax_scale, head_scale)
    if weights_out.dim() != weights.dim():  # [T, H, 1] weights: tokenspeed's weights_out is shaped like them
        weights_out = weights_out.view(weights.shape)
    return (packed, scale), weights_out
