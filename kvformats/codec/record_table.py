"""The record table: every KV-cache record ABI kvformats knows, declared once (the facts, with
their commits and releases); kvformats.codec.records looks them up."""

from __future__ import annotations

import attrs

from kvformats.codec.record_types import Record, Source

# ----- the facts -------------------------------------------------------------------------------
# Commits and releases as read (spec/engines.md, spec/upstream.md, the V4.1 format pages).
TOKENSPEED_V4 = "f3e4d1e2"  # lightseekorg/tokenspeed, the reference commit of spec/upstream.md
TS_TRI = "tokenspeed-kernel/python/tokenspeed_kernel/ops/attention/triton/deepseek_v4.py"
TS_CU = "tokenspeed-kernel/python/tokenspeed_kernel/thirdparty/cuda/csrc/deepseek_v4_attention.cu"
TS_OPS = "python/tokenspeed/runtime/layers/attention/deepseek_v4_ops.py"
TS_KERNEL = "tokenspeed_kernel/ops/attention/dsv41/triton.py"  # tokenspeed-kernel 0.1.4 on PyPI
FLASHMLA_V4 = "9241ae3"  # deepseek-ai/FlashMLA, spec/engines.md
FLASHMLA_V41_KERNEL = "2e5429f"  # deepseek-ai/FlashMLA csrc/cuda_kernels/kv_cache_format.h
FLASHMLA_V41_QUANT = "9a7d253"  # deepseek-ai/FlashMLA tests/quant.py
VLLM_FORK = "02137a4"  # vllm-project/FlashMLA, page-planar V4.1 tests/quant.py
VLLM_FORK_NVFP4 = "6bc49418"  # vllm-project/FlashMLA, NVFP4_FP8Rope tests/quant.py
SGLANG_FORK = "259ea0c"  # sgl-project/FlashMLA, page-planar V4.1 tests/quant.py
DEEPGEMM = "54e2261"
FLASHINFER = "fb28d72"
VLLM_V41 = "0.33.0"  # vllm on PyPI
VLLM_V41_OPS = "vllm/models/deepseek_v41/common/ops/"
SGLANG_V41 = "0.5.23"  # sglang on PyPI: kv_layout.cuh, sgl-project/sglang#39123 (spec/engines.md §7.3)


def _sglang_v41(symbol: str, layout_env: str) -> Source:
    """SGLang's V4.1 CUDA writer (SM100 / SM103, chosen by SGLANG_DSV4_KV_LAYOUT)."""
    return Source("sglang", "SGLang", "pypi:sglang", "sglang/kernels/jit/include/sgl_kernel/deepseek_v4/kv_layout.cuh",
                  SGLANG_V41, "writes",
                  f"{symbol} (SGLANG_DSV4_KV_LAYOUT={layout_env})", "flashmla")

_TOKENSPEED_V41 = Source("tokenspeed", "tokenspeed-kernel", "pypi:tokenspeed-kernel", TS_KERNEL, "0.1.4", "writes",
                         "_pack_kernel", "tokenspeed")
_FLASHMLA_V4_READ = Source("flashmla", "FlashMLA", "deepseek-ai/FlashMLA", "flash_mla/flash_mla_interface.py",
                           FLASHMLA_V4, "reads", "flash_mla_with_kvcache (sparse decode)")
_FLASHMLA_V4_REF = Source("flashmla", "FlashMLA", "deepseek-ai/FlashMLA", "tests/quant.py", FLASHMLA_V4,
                          "reference", "quantize_k_cache", "flashmla-ref")
_FLASHINFER_READ = Source("flashinfer", "FlashInfer", "flashinfer-ai/flashinfer", "flashinfer/mla/_core.py",
                          FLASHINFER, "reads", "kv_scale_format")
_FLASHMLA_V41_READ = Source("flashmla", "FlashMLA", "deepseek-ai/FlashMLA", "csrc/cuda_kernels/kv_cache_format.h",
                            FLASHMLA_V41_KERNEL, "reads", "V4.1 sparse decode")


def _forks(symbol: str) -> tuple[Source, ...]:
    """The FlashMLA forks' page-planar V4.1 references (tests/quant.py)."""
    return (Source("flashmla-vllm", "FlashMLA (vllm-project fork)", "vllm-project/FlashMLA", "tests/quant.py",
                   VLLM_FORK, "reference", symbol, "flashmla"),
            Source("flashmla-sglang", "FlashMLA (sgl-project fork)", "sgl-project/FlashMLA", "tests/quant.py",
                   SGLANG_FORK, "reference", symbol, "flashmla"))


RECORDS: tuple[Record, ...] = (
    Record(
        "dsv4-fp8-584", "V4", 584, 512, "page-tail scales",
        "448 e4m3 NoPE + 64 bf16 RoPE values per token; 7 ue8m0 scales (one per 64) + 1 pad byte per token at "
        "the page tail; pages padded to a multiple of 576 B", format="fp8_ds_mla",
        sources=(Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_CU, TOKENSPEED_V4, "writes",
                        "fused_qnorm_rope_kv_insert", "tokenspeed"),
                 Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_TRI, TOKENSPEED_V4, "writes",
                        "deepseek_v4_fused_sparse_compress_cache_insert", "tokenspeed"),
                 Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_OPS, TOKENSPEED_V4, "writes, reads",
                        "_fp8_ds_mla_cache_rows, dequantize_deepseek_v4_fp8_ds_mla_cache", "tokenspeed"),
                 Source("vllm", "vLLM", "vllm-project/vllm", "vllm/v1/attention/ops/deepseek_v4_ops/", "",
                        "writes, reads", "", "vllm"),
                 Source("sglang", "SGLang", "sgl-project/sglang", "", "", "writes, reads", "V4 pools", "",
                        pull=27035),
                 _FLASHMLA_V4_READ, _FLASHMLA_V4_REF, _FLASHINFER_READ),
        note="FlashMLA calls it MODEL1; spec/upstream.md §2, spec/engines.md §1."),
    Record(
        "dsv32-fp8-656", "V3.2", 656, 576, "token-interleaved",
        "512 e4m3 NoPE values, 4 float32 scales (one per 128), 64 bf16 RoPE values, per token",
        format="fp8_ds_mla_v32",
        sources=(Source("vllm", "vLLM", "vllm-project/vllm", "csrc/libtorch_stable/cache_kernels.cu", "", "writes",
                        "concat_and_cache_ds_mla", "vllm"),
                 Source("sglang", "SGLang", "sgl-project/sglang",
                        "python/sglang/srt/layers/attention/nsa/quant_k_cache.py", "", "writes", "quantize_k_cache"),
                 _FLASHMLA_V4_READ, attrs.evolve(_FLASHMLA_V4_REF, symbol="quantize_k_cache (V32_FP8Sparse)"),
                 _FLASHINFER_READ),
        note="spec/engines.md §2."),
    Record(
        "dsv32-nvfp4-352", "V3.2", 352, 576, "token-interleaved",
        "512 e2m1 NoPE values (256 B), 64 unscaled e4m3 RoPE values, 32 e4m3 NoPE scales (one per 16, stored "
        "permuted), per token", format="nvfp4_ds_mla", profiles=("flashmla",),
        sources=(Source("flashmla-vllm", "FlashMLA (vllm-project fork)", "vllm-project/FlashMLA", "tests/quant.py",
                        VLLM_FORK_NVFP4, "reference", "quantize_k_cache (NVFP4_FP8Rope)", "flashmla"),
                 Source("flashmla-vllm", "FlashMLA (vllm-project fork)", "vllm-project/FlashMLA", "", "", "reads",
                        "SM100 sparse decode, kv_cache_format nvfp4.fp8rope", pull=18),
                 Source("vllm", "vLLM", "vllm-project/vllm", "", "", "proposes", "NVFP4 KV cache", pull=51724)),
        note="FlashMLA's W4A16 DSA format (vllm-project/FlashMLA#18)."),
    Record(
        "dsv41-fp8-528-planar", "V4.1", 528, 512, "page-planar",
        "512 e4m3 values (RoPE dims too) per token, then 16 ue8m0 scales (one per 32); a page's data records, "
        "then its scale records", format="fp8_ds_mla_v41",
        sources=(attrs.evolve(_TOKENSPEED_V41, symbol="_pack_kernel (format 'swa')"),
                 *_forks("quantize_k_cache (V41_FP8Sparse)"), _sglang_v41("v41::store_row_fp8", "v41")),
        note="Same size as dsv41-fp8-528-interleaved and dsv32-fp8-528-norope: give a hint."),
    Record(
        "dsv41-fp8-528-interleaved", "V4.1", 528, 512, "token-interleaved",
        "512 e4m3 values (RoPE dims too), then that token's 16 ue8m0 scales (one per 32)",
        format="fp8_ds_mla_v41_interleaved",
        sources=(_FLASHMLA_V41_READ,
                 Source("flashmla", "FlashMLA", "deepseek-ai/FlashMLA", "tests/quant.py", FLASHMLA_V41_QUANT,
                        "reference", "quantize_k_cache (V41_FP8Sparse)", "flashmla"),
                 Source("vllm", "vLLM", "pypi:vllm", VLLM_V41_OPS + "cache_utils.py", VLLM_V41, "writes",
                        "_quantize_and_insert_k_mxfp8_kernel", "vllm"),
                 _sglang_v41("v41::store_row_fp8", "v41_new")),
        note="Same size as dsv41-fp8-528-planar and dsv32-fp8-528-norope: give a hint."),
    Record(
        "dsv41-fp4-288-planar", "V4.1", 288, 512, "page-planar",
        "512 e2m1 values (256 B) per token, then 32 e4m3 scales (one per 16); a page's data records, then its "
        "scale records", format="fp4_ds_mla_v41",
        sources=(attrs.evolve(_TOKENSPEED_V41, symbol="_pack_kernel (format 'global')"),
                 *_forks("quantize_k_cache (V41_FP4)"), _sglang_v41("v41::store_row_fp4", "v41")),
        note="Same size as dsv41-fp4-288-interleaved: give a hint."),
    Record(
        "dsv41-fp4-288-interleaved", "V4.1", 288, 512, "token-interleaved",
        "512 e2m1 values (256 B), then that token's 32 e4m3 scales (one per 16)",
        format="fp4_ds_mla_v41_interleaved",
        sources=(_FLASHMLA_V41_READ,
                 Source("flashmla", "FlashMLA", "deepseek-ai/FlashMLA", "tests/quant.py", FLASHMLA_V41_QUANT,
                        "reference", "quantize_k_cache (V41_FP4)", "flashmla"),
                 Source("vllm", "vLLM", "pypi:vllm", VLLM_V41_OPS + "fused_compress_quant_cache.py", VLLM_V41,
                        "writes", "_rope_quant_insert_nvfp4_kernel", "vllm"),
                 _sglang_v41("v41::store_row_fp4", "v41_new")),
        note="Same size as dsv41-fp4-288-planar: give a hint."),
    Record(
        "dsv4-fp8-indexer-132", "V4", 132, 128, "page-planar",
        "128 e4m3 values per key, then one float32 scale; a page's value records, then its scale records",
        format="fp8_indexer",
        sources=(Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_OPS, TOKENSPEED_V4, "writes, reads",
                        "_write_deepseek_v4_indexer_fp8_cache_capturable, read_deepseek_v4_indexer_fp8_cache",
                        "tokenspeed"),
                 Source("vllm", "vLLM", "vllm-project/vllm", "", "", "writes", "indexer_k_quant_and_cache", "vllm"),
                 Source("deepgemm", "DeepGEMM", "deepseek-ai/DeepGEMM", "tests/test_attention.py", DEEPGEMM, "reads",
                        "fp8_fp4_paged_mqa_logits", "deepgemm-ref")),
        note="spec/upstream.md §3."),
    Record(
        "dsv4-mxfp4-indexer-68", "V4 / V4.1", 68, 128, "page-planar",
        "128 e2m1 values (64 B) per key, then 4 ue8m0 scales (one per 32); a page's value records, then its "
        "scale records", format="mxfp4_indexer",
        sources=(Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_TRI, TOKENSPEED_V4, "writes",
                        "_deepseek_v4_indexer_mxfp4_cache_write_kernel", "tokenspeed"),
                 attrs.evolve(_TOKENSPEED_V41, symbol="_pack_kernel (format 'index')"),
                 Source("vllm", "vLLM", "vllm-project/vllm", "vllm/v1/attention/ops/deepseek_v4_ops/", "",
                        "writes", "MXFP4 indexer (cvt.rn.satfinite.e2m1x2)", "vllm"),
                 Source("deepgemm", "DeepGEMM", "deepseek-ai/DeepGEMM", "tests/test_attention.py", DEEPGEMM, "reads",
                        "fp8_fp4_paged_mqa_logits", "deepgemm-ref")),
        note="spec/upstream.md §4; tokenspeed-kernel 0.1.4 writes the V4.1 'index' field in the same bytes."),
    Record(
        "dsv4-csa-state-8192", "V4", 8192, 512, "unscaled rows",
        "float32 [kv (1024) | score (1024)] per position: the CSA compressor's state (ratio 4, overlap)",
        format="compressor_state", params={"ratio": 4, "head_dim": 512},
        sources=(Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_TRI, TOKENSPEED_V4, "writes",
                        "_deepseek_v4_save_compressor_state_kernel"),),
        note="spec/upstream.md §5."),
    Record(
        "dsv4-hca-state-4096", "V4", 4096, 512, "unscaled rows",
        "float32 [kv (512) | score (512)] per position: the HCA compressor's state (ratio 128)",
        format="compressor_state", params={"ratio": 128, "head_dim": 512},
        sources=(Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_TRI, TOKENSPEED_V4, "writes",
                        "_deepseek_v4_save_compressor_state_kernel"),),
        note="spec/upstream.md §5. Same size as dsv41-compressor-ring-4096: give a hint (V4)."),
    Record(
        "dsv4-csa-indexer-state-2048", "V4", 2048, 128, "unscaled rows",
        "float32 [kv (256) | score (256)] per position: the CSA indexer compressor's state (ratio 4, overlap)",
        format="compressor_state", params={"ratio": 4, "head_dim": 128},
        sources=(Source("tokenspeed", "tokenspeed", "lightseekorg/tokenspeed", TS_TRI, TOKENSPEED_V4, "writes",
                        "_deepseek_v4_save_compressor_state_kernel"),),
        note="spec/upstream.md §5."),
    Record(
        "dsv41-compressor-ring-4096", "V4.1", 4096, 512, "unscaled rows",
        "float32 [kv (512) | score (512)] per ring slot, as computed (no APE): the ratio-2 compressor's ring "
        "of the open group's rows, position p at p % capacity", format="compressor_state_v41",
        sources=(Source("vllm", "vLLM", "pypi:vllm", "vllm/models/deepseek_v41/compressor.py", VLLM_V41, "writes",
                        "CompressorStateCache (CircularBufferSpec), _fused_save_compress_norm_kernel"),
                 attrs.evolve(_TOKENSPEED_V41, symbol="compressor_tail_scatter", profile="")),
        note="spec/engines.md §7.5. Same size as dsv4-hca-state-4096 (V4, score + ape): give a hint "
             "(V4.1, vllm)."),
    # known, not implemented
    Record(
        "dsv32-fp8-528-norope", "V3.2", 528, 512, "unknown",
        "the V3.2 656 B row without its 128 B RoPE tail: 512 e4m3 values and 16 B of scales",
        sources=(Source("flashmla-sglang", "FlashMLA (sgl-project fork)", "sgl-project/FlashMLA", "", SGLANG_FORK,
                        "reads", "V3.2-no-RoPE sparse decode format"),
                 Source("sglang", "SGLang", "sgl-project/sglang", "", "", "proposes",
                        "FlashMLA bump listing the V3.2-no-RoPE decode format", pull=38942)),
        note="Known from the sgl-project/FlashMLA fork's note only; same size as the V4.1 fp8 records."),
    Record(
        "dsv4-mxfp4-368", "V4", 368, 512, "token-interleaved",
        "224 B e2m1 NoPE, 14 ue8m0 scales (one per 32) + 2 pad bytes, 128 B bf16 RoPE, per token; no page pad",
        sources=(Source("sglang", "SGLang", "sgl-project/sglang", "", "", "proposes",
                        "MXFP4 KV cache on Hopper (SM90)", pull=37138),),
        note="Open pull request (split from sgl-project/sglang#32741)."),
    Record(
        "dsv4-nvfp4-384", "V4", 384, 512, "unknown",
        "packed e2m1 NoPE, bf16 RoPE and e4m3 group scales per token (SM120)",
        sources=(Source("sglang", "SGLang", "sgl-project/sglang", "", "", "proposes",
                        "NVFP4 sparse-MLA KV cache on SM120", pull=38646),
                 Source("flashinfer", "FlashInfer", "flashinfer-ai/flashinfer", "", "", "proposes",
                        "NVFP4 sparse_mla on SM120", pull=3937)),
        note="Open pull requests."),
    Record(
        "dsv4-nvfp4-432", "V4", 432, 512, "unknown",
        "compact NVFP4 MLA cache records",
        sources=(Source("vllm", "vLLM (local-inference-lab fork)", "local-inference-lab/vllm", "", "", "proposes",
                        "native NVFP4 MLA cache writes", pull=632),),
        note="Open pull request."),
)
