"""Capture V4.1 vectors from vLLM 0.33.0's released Triton cache writers, on CPU.

    python3 tools/capture/from_vllm_release.py [--out DIR]

The wheel (``pip download --no-deps vllm==0.33.0``, 336 MB, sha256 pinned in
tests/harness/released.py, cached under ``~/.cache/kvformats-tests``) is opened and only
``vllm/models/deepseek_v41/common/ops/cache_utils.py``, ``.../fused_compress_quant_cache.py``,
``vllm/models/deepseek_v4/common/ops/fused_indexer_q.py`` (for ``_fp32x2_to_fp4x2``) and
``vllm/_version.py`` are extracted, to a temporary folder; they are imported with stub modules
for vLLM's platform, warm-up and config helpers, and the kernels run under the Triton
interpreter with the GPU's float conversions (``tests.harness.released.gpu_numerics``). The
nvfp4 kernel's inline PTX ``cvt.rn.satfinite.e2m1x2.f32`` cannot run under the interpreter: the
harness emulates that instruction with its documented semantics (round to nearest, ties to even;
saturating to +-6; the sign of zero kept). Nothing of vLLM is copied into the repository.

One vector per writer, two rows of each of the six input kinds at shuffled slots of a two-page,
sentinel-filled cache of 16-token blocks, one slot -1 (skipped), whole cache kept:

* ``quantize_and_insert_k_cache(..., bytes_per_token=528)`` -> ``_quantize_and_insert_k_mxfp8_kernel``:
  ``fp8_ds_mla_v41_interleaved`` profile vllm;
* ``rope_quant_insert`` on a 528 B cache -> ``_rope_quant_insert_mxfp8_kernel``: the same;
* ``rope_quant_insert`` on a 288 B cache -> ``_rope_quant_insert_nvfp4_kernel``:
  ``fp4_ds_mla_v41_interleaved`` profile vllm.

The rope-insert kernels rotate every GPT-J pair; their cos/sin table here is cos 1, sin 0
(compress ratio 1, positions 0..N-1), which leaves every value as it is except signed zeros
(``tests.harness.released.identity_rope``), so the rows stored in their vectors are first put
through that rotation twice (a fixed point: the rows the kernel then quantizes unchanged).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: its library binds to the interpreter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import from_tokenspeed_release as base  # noqa: E402
from from_tokenspeed_release import rel  # noqa: E402

PAGE = 16
TARGETS = {
    "vllm-mxfp8": ("vllm_release_v41_mxfp8_write", "fp8_ds_mla_v41_interleaved",
                   {"head_dim": 512, "page_size": PAGE, "profile": "vllm"}),
    "vllm-rope-mxfp8": ("vllm_release_v41_rope_mxfp8_write", "fp8_ds_mla_v41_interleaved",
                        {"head_dim": 512, "page_size": PAGE, "profile": "vllm"}),
    "vllm-rope-nvfp4": ("vllm_release_v41_rope_nvfp4_write", "fp4_ds_mla_v41_interleaved",
                        {"head_dim": 512, "page_size": PAGE, "profile": "vllm"}),
}

if __name__ == "__main__":
    base.main(TARGETS, rel.VLLM, "vllm", PAGE, pages=2)
