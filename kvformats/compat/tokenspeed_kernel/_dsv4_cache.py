"""tokenspeed-kernel 0.1.4's DeepSeek V4 cache writers, readers and indexer query prep
(``tokenspeed_kernel/ops/attention/dsv4/__init__.py`` and ``.../dsv4/triton.py``,
https://pypi.org/project/tokenspeed-kernel/0.1.4/, https://github.com/lightseekorg/tokenspeed) under
their released names, parameters (order, defaults, keyword-only markers), in-place writes and
return values, on kvformats' model ops and layouts:

    # from tokenspeed_kernel.ops.attention.dsv4.triton import dsv4_save_compressor_state
    from kvformats.compat.tokenspeed_kernel.dsv4 import dsv4_save_compressor_state

Each is an argument adaptation around the ``kvformats.compat.tokenspeed`` drop-in of tokenspeed's
runtime function that calls it (``fused_qnorm_rope_kv_insert`` calls ``dsv4_swa_cache_insert``, and
so on), which makes the native call (``kvformats.deepseek_v4``, the layouts' codecs: the reference
or kvformats' Triton kernels, as ``backend="auto"`` picks):

============================================== =======================================================
tokenspeed-kernel 0.1.4                        kvformats (drop-in -> native call)
============================================== =======================================================
``dsv4_indexer_cache_format``                  'mxfp4' / 'fp8_scaled' (None: 'mxfp4' on an NVIDIA GPU of
                                               compute capability >= 10, read once per process)
``dsv4_swa_cache_insert``,                     ``fused_qnorm_rope_kv_insert`` -> ``swa_insert``
``triton_dsv4_swa_cache_insert``
``dsv4_csa_indexer_fp8_cache_insert``,         ``deepseek_v4_csa_indexer_cache_insert`` ->
``triton_dsv4_csa_indexer_fp8_cache_insert``,  ``indexer_compress_insert`` ('fp8_indexer', 'mxfp4_indexer')
``dsv4_fused_csa_indexer_mxfp4_cache_insert``
``dsv4_fused_sparse_compress_cache_insert``    ``deepseek_v4_csa_compress_kv_cache_insert`` (ratio 4,
                                               overlap) / ``..._hca_...`` (128) -> ``compress_kv_insert``
``dsv4_save_compressor_state``                 ``save_deepseek_v4_compressor_state`` -> ``save_compressor_state``
``write_dsv4_indexer_mxfp4_cache_cuda``        ``write_deepseek_v4_indexer_mxfp4_cache`` -> ``Mxfp4Indexer.encode``
``dsv4_gather_indexer_mxfp4_cache``            ``deepseek_v4_gather_indexer_mxfp4_cache`` -> ``Mxfp4Indexer.gather``
``dsv4_dequantize_and_gather_k_cache``         ``deepseek_v4_dequantize_and_gather_k_cache`` ->
                                               ``Fp8DsMla.dequantize_gather``
``dsv4_fused_indexer_q_rope_hadamard_mxfp4``   ``deepseek_v4_prepare_indexer_q_mxfp4`` -> ``prepare_indexer_q_mxfp4``
``DEEPSEEK_V4_*`` (triton.py's constants)      the same values, from kvformats' geometry helpers
============================================== =======================================================

tokenspeed's length rules apply: the compress inserts read the first N entries of each per-token
tensor, N the shortest of the state slot mapping, positions and the kv slot mapping; the MXFP4
writer the first N = min(rows, slots, ``valid``) rows (a ``valid`` entry of 0 writes nothing);
the save the first min(slots, kv rows). Out-of-capacity slots are skipped by the SWA insert, as
there. Bytes and values are the released code's, bit for bit, but for the float32 queries and the
empty windows below (tests/compat/test_tokenspeed_kernel_dsv4_cache.py runs the released code).
There is no host synchronization on CUDA tensors; tokenspeed's own (positions read on the host for
CPU tensors when ``validate_positions``) is kvformats' CPU check too. The adaptation costs about
0.1-2 us of host time per call over the drop-in it calls (measured on CPU with the drop-in stubbed
out), the MXFP4 writer about 8 us: its ``valid`` mask becomes -1 slots in one ``torch.where``. All
but the MXFP4 writer and gather (and the SWA inserts given ``q_out``, the sparse insert given
``kv_write_mask``) are replayed as the native calls are (``kvformats.runtime.replay``): on CUDA
tensors whose metadata was seen before, their launches are repeated without the adaptation.

Bad arguments raise kvformats' typed errors (``InputError``, ``InputTypeError``, ``LayoutError``:
``ValueError`` subclasses, ``InputTypeError`` a ``TypeError`` too) before anything is written,
where tokenspeed raises ``ValueError`` / ``TypeError`` and where its kernel registry finds no kernel
(``NoKernelFoundError``, a ``RuntimeError``): an ``override`` / ``solution`` naming no kernel or
solution of the op (any that tokenspeed registers for it runs kvformats' one implementation, the
CUDA one included; ``TOKENSPEED_KERNEL_OVERRIDE_*`` is not read), a geometry its kernel is not
declared for (FP8 indexer pages of other than 64 rows, another compress ratio or head dim). Where
kvformats departs from tokenspeed:

* CPU tensors run (tokenspeed's ``dsv4_gather_indexer_mxfp4_cache`` refuses them, its Triton
  kernels need a GPU, ``dsv4_indexer_cache_format(None)`` raises without one; here it gives
  'fp8_scaled' there). The tensors of one call share a device; index tensors are int32 / int64
  (tokenspeed casts tables and lengths with ``.to(torch.int32)``).
* the ``deepseek_v4_*`` drop-ins' rules (docs/porting-from-tokenspeed.md, "Differences from
  tokenspeed"): written slots beyond the cache (compress inserts, save, MXFP4 writer, the MXFP4
  gather's slots) and repeated slots are refused on CPU tensors and in strict mode and skipped and
  recorded on a GPU (tokenspeed writes or reads out of bounds); positions are checked whatever
  ``validate_positions`` says; ``compressor_block_size`` / ``block_size`` must be
  ``state_cache.shape[1]`` (0.1.4's kernels page the state with the argument); missing pages are
  missing, and a compress window with none of its positions left writes the encoded zero vector
  (0.1.4's MXFP4 and sparse inserts pool an empty softmax there: a NaN row); scale byte 0x00 reads
  2^-127 in the dequantize-gather (Triton flushes it to 0); ``max_gather_len`` is None or an int.
  The metadata is checked on empty calls too (tokenspeed returns first).
* float16 activations are refused by the SWA insert (kvformats' takes bf16 and float32; tokenspeed
  runs float16). float32 queries (``triton_dsv4_swa_cache_insert``; the public function refuses
  them) come out within a few float32 ulps of tokenspeed's, whose RMS norm sums the squares in
  another order (bf16 queries round both to the same bits; the cache bytes are equal).
* a refused ``dsv4_swa_cache_insert`` / ``triton_dsv4_swa_cache_insert`` with ``q_out`` leaves
  ``q_out`` holding ``q``'s values (the drop-in rotates it in place there), the cache untouched.
* tokenspeed's kernels are compiled for DeepSeek V4 and read any other geometry with their own
  constants; here it is refused (``InputError``): a query head other than 512, a cos/sin table
  other than 64 wide, an indexer head (``rms_norm_weight``, ``index_k`` columns, ``index_q``) other
  than 128, a compressor head (``rms_norm_weight``) other than 512, compress ratios and overlaps
  other than DeepSeek V4's (4 with overlap, 128 without; the MXFP4 insert 4, the save 4 or 128).
* ``triton_dsv4_swa_cache_insert`` (no checks there): ``q`` (without ``q_out``) and ``q_out``
  contiguous, ``q_out`` on q's device, kv of q's dtype with at least T rows, positions at least T,
  at most T rows to insert (tokenspeed inserts min(kv, slots, positions) rows, reading kv and
  positions beyond the query tokens).
* the FP8 indexer insert of 0.1.4 skips a token whose kv slot or RoPE row lies beyond its cache or
  table (the rule above applies), whose request lies beyond the block table (here its window is
  missing: the encoded zero vector is written) or whose state slot lies beyond the state cache
  (here the slot's sign alone says whether the token writes).
* ``dsv4_fused_indexer_q_rope_hadamard_mxfp4``: ``weights`` of any strides are read by their heads
  (tokenspeed's kernel assumes a head stride of 1); ``weights_out`` is contiguous, ``weights``'
  shape.
* ``write_dsv4_indexer_mxfp4_cache_cuda``: ``valid`` is a 1-D tensor on the slots' device.
"""

from __future__ import annotations

import functools

import torch

from kvformats.compat.tokenspeed_kernel._dsv4_cache_ops import (
    dsv4_csa_indexer_fp8_cache_insert, dsv4_dequantize_and_gather_k_cache, dsv4_fused_csa_indexer_mxfp4_cache_insert,
    dsv4_fused_indexer_q_rope_hadamard_mxfp4, dsv4_fused_sparse_compress_cache_insert, dsv4_gather_indexer_mxfp4_cache,
    dsv4_save_compressor_state, dsv4_swa_cache_insert, triton_dsv4_csa_indexer_fp8_cache_insert,
    triton_dsv4_swa_cache_insert, write_dsv4_indexer_mxfp4_cache_cuda)
from kvformats.compat.tokenspeed_paged import HEAD_DIM, INDEX_HEAD_DIM, ROPE_DIM
from kvformats.compat.tokenspeed_spec import (DEEPSEEK_V4_FP8_MAX, DEEPSEEK_V4_FP8_QUANT_BLOCK,
                                              DEEPSEEK_V4_MXFP4_BLOCK_SIZE,
                                              deepseek_v4_indexer_mxfp4_layout_from_row_bytes,
                                              deepseek_v4_indexer_mxfp4_row_bytes, deepseek_v4_nope_dim,
                                              deepseek_v4_swa_scale_dim, deepseek_v4_swa_token_stride)
from kvformats.dsv4_constants import ALIGN

# triton.py's constants: DeepSeek V4's geometry, as kvformats' helpers compute it
DEEPSEEK_V4_HEAD_DIM = HEAD_DIM
DEEPSEEK_V4_ROPE_DIM = ROPE_DIM
DEEPSEEK_V4_NOPE_DIM = deepseek_v4_nope_dim(HEAD_DIM, ROPE_DIM)
DEEPSEEK_V4_INDEXER_DIM = INDEX_HEAD_DIM
DEEPSEEK_V4_SWA_TOKEN_STRIDE = deepseek_v4_swa_token_stride(HEAD_DIM, ROPE_DIM)  # data bytes of an fp8_ds_mla row
DEEPSEEK_V4_SWA_SCALE_DIM = deepseek_v4_swa_scale_dim(HEAD_DIM, ROPE_DIM)  # its scale bytes, pad byte included
_INDEXER_DIM, DEEPSEEK_V4_INDEXER_MXFP4_VALUE_BYTES, DEEPSEEK_V4_INDEXER_MXFP4_SCALE_DIM = (
    deepseek_v4_indexer_mxfp4_layout_from_row_bytes(deepseek_v4_indexer_mxfp4_row_bytes(INDEX_HEAD_DIM)))
DEEPSEEK_V4_SPARSE_PREFILL_TOPK_ALIGNMENT = ALIGN  # sparse-prefill index rows are padded to this many entries

__all__ = [
    "dsv4_csa_indexer_fp8_cache_insert", "dsv4_dequantize_and_gather_k_cache",
    "dsv4_fused_csa_indexer_mxfp4_cache_insert", "dsv4_fused_indexer_q_rope_hadamard_mxfp4",
    "dsv4_fused_sparse_compress_cache_insert", "dsv4_gather_indexer_mxfp4_cache", "dsv4_indexer_cache_format",
    "dsv4_save_compressor_state", "dsv4_swa_cache_insert", "triton_dsv4_csa_indexer_fp8_cache_insert",
    "triton_dsv4_swa_cache_insert", "write_dsv4_indexer_mxfp4_cache_cuda",
    # triton.py's constants
    "DEEPSEEK_V4_FP8_MAX", "DEEPSEEK_V4_FP8_QUANT_BLOCK", "DEEPSEEK_V4_HEAD_DIM", "DEEPSEEK_V4_INDEXER_DIM",
    "DEEPSEEK_V4_INDEXER_MXFP4_SCALE_DIM", "DEEPSEEK_V4_INDEXER_MXFP4_VALUE_BYTES", "DEEPSEEK_V4_MXFP4_BLOCK_SIZE",
    "DEEPSEEK_V4_NOPE_DIM", "DEEPSEEK_V4_ROPE_DIM", "DEEPSEEK_V4_SPARSE_PREFILL_TOPK_ALIGNMENT",
    "DEEPSEEK_V4_SWA_SCALE_DIM", "DEEPSEEK_V4_SWA_TOKEN_STRIDE",
]


def dsv4_indexer_cache_format(use_fp4: bool | None = None) -> str:
    """'mxfp4' or 'fp8_scaled': as ``use_fp4`` says, or (None) the device's default, MXFP4 on an
    NVIDIA GPU of compute capability 10 or above (Blackwell), as tokenspeed's platform default."""
    if use_fp4 is not None:
        return "mxfp4" if use_fp4 else "fp8_scaled"
    return "mxfp4" if _blackwell() else "fp8_scaled"


@functools.cache
def _blackwell() -> bool:
    """Whether the current CUDA device is an NVIDIA GPU of compute capability >= 10 (read once per
    process, as tokenspeed reads its platform once)."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return False
    return torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 10
