"""Capture V4.1 vectors from SGLang 0.5.23's released torch reference of its V4.1 cache
writers, on CPU.

    python3 tools/capture/from_sglang_release.py [--out DIR]

SGLang's V4.1 cache writers are CUDA kernels compiled at run time (sgl_kernel
``deepseek_v4/kv_layout.cuh`` ``v41::store_row_fp8`` / ``store_row_fp4``, called by its store,
compress and norm-rope kernels; SM100 / SM103 only), which cannot run here. The header names
their pure-torch reference, which the wheel ships:
``sglang/test/kernels/deepseek_v4/dsv41_kv_quant_reference.py`` (``quantize_k_cache_v41``,
``quantize_k_cache_v41_fp4``; SGLang's kernel tests compare the kernels with it). This script
fetches the wheel (``pip download --no-deps sglang==0.5.23``, sha256 pinned in
tests/harness/released.py), extracts that file and the ``fp4_fake_quant.py`` it imports (torch
only) to a temporary folder and runs them. Nothing of SGLang is copied into the repository.

Each vector is one page holding two rows of each of the six input kinds, in slot order (the
reference encodes whole pages ``[pages, page_size, 512]``), page bytes = page_size * row bytes:

* ``quantize_k_cache_v41``: 528 B rows, block-split (page-planar) -> ``fp8_ds_mla_v41`` profile
  flashmla;
* ``quantize_k_cache_v41_fp4``: 288 B rows -> ``fp4_ds_mla_v41`` profile flashmla.

These are the reference's bytes, not a kernel's: spec/engines.md "V4.1 writers" gives the
kernels' rule from their source.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import from_tokenspeed_release as base  # noqa: E402
from from_tokenspeed_release import rel  # noqa: E402

TARGETS = {
    "sglang-ref-v41": ("sglang_release_v41_reference_write", "fp8_ds_mla_v41",
                       {"head_dim": 512, "profile": "flashmla"}),
    "sglang-ref-v41-fp4": ("sglang_release_v41_fp4_reference_write", "fp4_ds_mla_v41",
                           {"head_dim": 512, "profile": "flashmla"}),
}

if __name__ == "__main__":
    base.main(TARGETS, rel.SGLANG, "sglang")
