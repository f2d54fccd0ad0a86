"""Capture vectors from FlashMLA's own torch reference quantizer (tests/quant.py), on CPU.

    python3 tools/capture/from_flashmla.py --src DIR [--commit SHA] [--out spec/vectors/captured]

DIR is a checkout (or an extracted copy) of https://github.com/deepseek-ai/FlashMLA holding
``tests/quant.py``, outside the tracked tree, e.g. ``.engines/FlashMLA`` (git-ignored):

    git --git-dir=<clone of deepseek-ai/FlashMLA>/.git show 9241ae3:tests/quant.py > .engines/FlashMLA/tests/quant.py

quant.py imports only torch, so it runs unmodified on CPU. Captured (profile flashmla-ref):
``quantize_k_cache`` for the MODEL1 584 B row (fp8_ds_mla) and the V32 656 B row
(fp8_ds_mla_v32) on edge-case inputs, ``dequantize_k_cache`` of those rows, and
``dequantize_k_cache`` of random bytes with every scale byte a reader can meet.
quantize_k_cache allocates its block with torch.empty and never writes the MODEL1 scale pad byte
(byte 583 of a row), so the vectors give row spans without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as c  # noqa: E402

REPO, COMMIT, FILE = "deepseek-ai/FlashMLA", "9241ae3ef9bac614dd25e45e507e089f888280e0", "tests/quant.py"


def mla_input(width_nope: int, block: int, rope: int, seed: int) -> torch.Tensor:
    """bf16 rows [R, nope + rope]: every edge block at several block positions, plus halfway blocks."""
    blocks = c.edge_blocks(block, 448.0, 0.0448, seed)  # FlashMLA floors the scale at 1e-4: amax 0.0448
    blocks += [c.halfway_block(block, 448.0, c.E4M3_MIDS)]
    per_row = width_nope // block
    rows = [c.rows_from_blocks(blocks, per_row, rope, seed),
            c.rows_from_blocks(c.shuffled_blocks(blocks, seed + 7), per_row, rope, seed + 3)]
    return torch.cat(rows).to(torch.bfloat16)


def encode_vector(q, layout_name: str, fmt: str, x: torch.Tensor, vid: str, src: Path) -> dict:
    layout = getattr(q.FP8KVCacheLayout, layout_name)
    d, d_nope, d_rope, tile, ntiles = layout.get_meta()
    n = x.shape[0]
    out = q.quantize_k_cache(x.view(1, n, 1, d), layout)  # one block of n tokens
    dec = q.dequantize_k_cache(out, layout).view(n, d)
    spans = []
    if layout_name == "MODEL1_FP8Sparse":
        flat = out.view(1, -1).view(torch.uint8)[0]
        data = flat[: n * (d_nope + 2 * d_rope)].view(n, d_nope + 2 * d_rope)
        scales = flat[n * (d_nope + 2 * d_rope):].view(n, 8)[:, :ntiles]  # byte 7 is never written
        for i in range(n):
            spans += [{"row": i, "start": 0, "hex": c.hexbytes(data[i])},
                      {"row": i, "start": d_nope + 2 * d_rope, "hex": c.hexbytes(scales[i])}]
        params = {"head_dim": d, "page_size": 64, "rope_dim": d_rope, "profile": "flashmla-ref"}
    else:
        rows = out.view(n, -1).view(torch.uint8)
        spans = [{"row": i, "start": 0, "hex": c.hexbytes(rows[i])} for i in range(n)]
        params = {"head_dim": d, "page_size": 64, "rope_dim": d_rope, "profile": "flashmla-ref"}
    return {
        "id": vid, "format": fmt, "params": params, "op": "encode",
        "source": "captured: FlashMLA tests/quant.py run on CPU (see captured)",
        "description": f"FlashMLA quantize_k_cache({layout_name}) of edge-case bf16 rows; decoded = its "
                       f"dequantize_k_cache of the same rows",
        "inputs": {"x": c.spec(x)},
        "slots": c.spec(torch.arange(n, dtype=torch.int64)),
        "cache": {"num_pages": 1, "page_stride": None, "sentinel": c.SENTINEL},
        "expected": {"spans": spans,
                     "decoded": [{"row": i, "start": 0, "dtype": "bfloat16", "hex": c.hexbytes(dec[i]),
                                  "nan": "any"} for i in range(n)]},
        "captured": c.provenance(repo=REPO, commit=COMMIT, file=FILE,
                                 function=f"quantize_k_cache, dequantize_k_cache (FP8KVCacheLayout.{layout_name})",
                                 source_path=src, device="cpu"),
    }


def decode_vector(q, layout_name: str, fmt: str, vid: str, src: Path, seed: int) -> dict:
    """Random row bytes (every e4m3 code, NaN codes included) with every scale byte of
    common.SCALE_BYTES; the page is FlashMLA's block of n tokens, read by dequantize_k_cache."""
    layout = getattr(q.FP8KVCacheLayout, layout_name)
    d, d_nope, d_rope, tile, ntiles = layout.get_meta()
    n = 8
    if layout_name == "MODEL1_FP8Sparse":
        row_bytes = d_nope + 2 * d_rope + ntiles + 1
        page = c.random_cache_bytes(n * row_bytes, seed)
        data = page[: n * (d_nope + 2 * d_rope)].view(n, d_nope + 2 * d_rope)
        rope = data[:, d_nope:].view(torch.bfloat16)
        rope.copy_(torch.randn(rope.shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
        scales = page[n * (d_nope + 2 * d_rope):].view(n, 8)
        sb = torch.tensor(c.SCALE_BYTES * 8, dtype=torch.uint8)
        scales[:, :ntiles] = sb[: n * ntiles].view(n, ntiles)
        scales[:, 7] = 0
    else:
        row_bytes = d_nope + 4 * ntiles + 2 * d_rope
        page = c.random_cache_bytes(n * row_bytes, seed)
        rows = page.view(n, row_bytes)
        rope = rows[:, d_nope + 4 * ntiles:].view(torch.bfloat16)
        rope.copy_(torch.randn(rope.shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
        # fp32 scales: powers of two (what quantize_k_cache writes), 0, +Inf, NaN, an arbitrary value
        choice = torch.tensor([2.0**-20, 2.0**-7, 1.0, 2.0**3, 0.0, float("inf"), float("nan"), 0.3,
                               -2.0, 2.0**-140], dtype=torch.float32)
        rows[:, d_nope:d_nope + 4 * ntiles].view(torch.float32).copy_(
            choice.repeat(4)[: n * ntiles].view(n, ntiles))
    dec = q.dequantize_k_cache(page.view(torch.float8_e4m3fn).view(1, n, 1, row_bytes), layout).view(n, d)
    params = {"head_dim": d, "page_size": n, "rope_dim": d_rope, "profile": "flashmla-ref"}
    return {
        "id": vid, "format": fmt, "params": params, "op": "decode",
        "source": "captured: FlashMLA tests/quant.py run on CPU (see captured)",
        "description": f"FlashMLA dequantize_k_cache({layout_name}) of one block of random bytes (every "
                       f"e4m3 code) with edge scales; the block's bytes are the start of the page",
        "inputs": {"cache": c.spec(page)},
        "slots": c.spec(torch.arange(n, dtype=torch.int64)),
        "cache": {"num_pages": 1, "page_stride": None, "sentinel": 0},
        "expected": {"decoded": [{"row": i, "start": 0, "dtype": "bfloat16", "hex": c.hexbytes(dec[i]),
                                  "nan": "any"} for i in range(n)]},
        "captured": c.provenance(repo=REPO, commit=COMMIT, file=FILE,
                                 function=f"dequantize_k_cache (FP8KVCacheLayout.{layout_name})",
                                 source_path=src, device="cpu"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=".engines/FlashMLA", help="FlashMLA tree holding tests/quant.py")
    ap.add_argument("--out", default=str(c.OUT_ROOT))
    args = ap.parse_args()
    src = Path(args.src) / FILE
    q = c.load_module("flashmla_quant", src)
    out = Path(args.out)
    x4 = mla_input(448, 64, 64, seed=40)
    x3 = mla_input(512, 128, 64, seed=32)
    c.write(encode_vector(q, "MODEL1_FP8Sparse", "fp8_ds_mla", x4, "flashmla_model1_encode", src), "flashmla", out)
    c.write(encode_vector(q, "V32_FP8Sparse", "fp8_ds_mla_v32", x3, "flashmla_v32_encode", src), "flashmla", out)
    c.write(decode_vector(q, "MODEL1_FP8Sparse", "fp8_ds_mla", "flashmla_model1_decode_bytes", src, 41),
            "flashmla", out)
    c.write(decode_vector(q, "V32_FP8Sparse", "fp8_ds_mla_v32", "flashmla_v32_decode_bytes", src, 33),
            "flashmla", out)


if __name__ == "__main__":
    main()
