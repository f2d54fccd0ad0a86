"""Capture vectors from DeepGEMM's torch reference quantizers (deep_gemm/utils/math.py), on CPU.

    python3 tools/capture/from_deepgemm.py --src DIR [--out spec/vectors/captured]

DIR is a checkout (or an extracted copy) of https://github.com/deepseek-ai/DeepGEMM holding
``deep_gemm/utils/math.py``, outside the tracked tree, e.g. ``.engines/DeepGEMM`` (git-ignored):

    git --git-dir=<clone of deepseek-ai/DeepGEMM>/.git show 54e2261:deep_gemm/utils/math.py > .engines/DeepGEMM/deep_gemm/utils/math.py

math.py imports only torch; it is loaded by path, so the package ``__init__`` (which loads the
CUDA extension) never runs and nothing needs a stub. Captured, with the arguments DeepGEMM's own
tests/test_attention.py passes for the indexer caches:

* fp8_indexer, profile deepgemm-ref: ``per_custom_dims_cast_to_fp8(kv, (0,), False)`` (the
  indexer K reference of test_mqa_logits: one fp32 scale per 128-value row);
* mxfp4_indexer, profile deepgemm-ref: ``per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32,
  use_packed_ue8m0=True)`` and ``cast_back_from_fp4`` of the result;
* mxfp4_indexer decode: ``cast_back_from_fp4`` of random bytes with every scale byte (bytes 0 and
  0xFF and the -0 nibble 0x8 in vectors of their own), the page
  cut as test_paged_mqa_logits' ``kv_cache_cast_to_fp4`` lays it out
  (``[block_size x 64 packed | block_size x int32 of 4 ue8m0]``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as c  # noqa: E402

REPO, COMMIT, FILE = "deepseek-ai/DeepGEMM", "54e22612409371d6364144b69086735beb54e98b", "deep_gemm/utils/math.py"


def indexer_input(block: int, fmax: float, floor_amax: float, mids: list[float], seed: int) -> torch.Tensor:
    """float32 rows [R, 128] of edge blocks (128 // block of them a row), twice in two orders."""
    blocks = c.edge_blocks(block, fmax, floor_amax, seed) + [c.halfway_block(block, fmax, mids)]
    per_row = 128 // block
    return torch.cat([c.rows_from_blocks(blocks, per_row, 0, seed),
                      c.rows_from_blocks(c.shuffled_blocks(blocks, seed + 5), per_row, 0, seed)])


def encode_vector(vid: str, fmt: str, x: torch.Tensor, rows: torch.Tensor, decoded, function: str,
                  description: str, src: Path) -> dict:
    n = x.shape[0]
    expected = {"rows": [c.hexbytes(rows[i]) for i in range(n)]}
    if decoded is not None:
        expected["decoded"] = [{"row": i, "start": 0, "dtype": "float32", "hex": c.hexbytes(decoded[i]),
                                "nan": "any"} for i in range(n)]
    return {
        "id": vid, "format": fmt, "params": {"head_dim": 128, "page_size": 64, "profile": "deepgemm-ref"},
        "op": "encode", "source": "captured: DeepGEMM deep_gemm/utils/math.py run on CPU (see captured)",
        "description": description, "inputs": {"x": c.spec(x)},
        "slots": c.spec(torch.arange(n, dtype=torch.int64)),
        "cache": {"num_pages": 1, "page_stride": None, "sentinel": c.SENTINEL},
        "expected": expected,
        "captured": c.provenance(repo=REPO, commit=COMMIT, file=FILE, function=function, source_path=src,
                                 device="cpu"),
    }


def fp8_vectors(m, src: Path) -> list[dict]:
    out = []
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        # DeepGEMM's floor is on the amax (clamp(1e-4)): amax 1e-4 is the floor case
        x = indexer_input(128, 448.0, 1e-4, c.E4M3_MIDS, seed=128).to(dtype)
        q, sf = m.per_custom_dims_cast_to_fp8(x, (0,), False)
        rows = torch.cat([q.view(torch.uint8), sf.reshape(-1, 1).float().view(torch.uint8)], dim=1)
        out.append(encode_vector(
            f"deepgemm_fp8_indexer_{tag}", "fp8_indexer", x, rows, None,
            "per_custom_dims_cast_to_fp8(kv, (0,), False)",
            f"DeepGEMM's FP8 indexer K reference ({tag} input) of edge-case rows: values | fp32 scale", src))
    return out


def fp4_vectors(m, src: Path) -> list[dict]:
    out = []
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        x = indexer_input(32, 6.0, 1e-4, c.E2M1_MIDS, seed=32).to(dtype)
        packed, sf = m.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        back = m.cast_back_from_fp4(packed, sf, gran_k=32, use_packed_ue8m0=True)
        rows = torch.cat([packed.view(torch.uint8), sf.view(torch.uint8).reshape(x.shape[0], 4)], dim=1)
        out.append(encode_vector(
            f"deepgemm_mxfp4_indexer_{tag}", "mxfp4_indexer", x, rows, back,
            "per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True); "
            "cast_back_from_fp4(..., gran_k=32, use_packed_ue8m0=True)",
            f"DeepGEMM's FP4 indexer reference ({tag} input) of edge-case rows: 64 packed e2m1 bytes | "
            f"4 ue8m0 bytes (one int32); decoded = cast_back_from_fp4", src))
    return out


DECODE_CASES = {  # id suffix -> (scale bytes, keep nibble 0x8 (-0), what the case isolates)
    "bytes": ([b for b in c.SCALE_BYTES if b not in (0, 255)], False,
              "random packed bytes (no 0x8 nibble) with ue8m0 scale bytes 1..254"),
    "ff_scale": ([255], False, "ue8m0 scale byte 0xFF under random packed bytes (no 0x8 nibble)"),
    "zero_scale": ([0], False, "ue8m0 scale byte 0 (2^-127) under random packed bytes (no 0x8 nibble)"),
    "negative_zero": ([127, 120], True, "nibble 0x8 (e2m1 -0) among random packed bytes, scales 1 and 2^-7"),
}


def fp4_decode_vector(m, src: Path, case: str, seed: int = 4) -> dict:
    scale_bytes, keep_neg_zero, what = DECODE_CASES[case]
    n = 8
    page = c.random_cache_bytes(n * 68, seed)
    packed_u8 = page[: n * 64]
    if not keep_neg_zero:  # 0x8 -> 0x9: the -0 nibble has its own vector
        lo, hi = packed_u8 & 0xF, packed_u8 >> 4
        lo = torch.where(lo == 8, torch.full_like(lo, 9), lo)
        hi = torch.where(hi == 8, torch.full_like(hi, 9), hi)
        packed_u8.copy_(lo | (hi << 4))
    scales = page[n * 64:].view(n, 4)
    reps = -(-n * 4 // len(scale_bytes))
    scales.copy_(torch.tensor((scale_bytes * reps)[: n * 4], dtype=torch.uint8).view(n, 4))
    packed = page[: n * 64].view(n, 64).view(torch.int8)
    sf = page[n * 64:].view(n, 4).contiguous().view(torch.int32)
    back = m.cast_back_from_fp4(packed, sf, gran_k=32, use_packed_ue8m0=True)
    return {
        "id": f"deepgemm_mxfp4_decode_{case}", "format": "mxfp4_indexer",
        "params": {"head_dim": 128, "page_size": n, "profile": "deepgemm-ref"}, "op": "decode",
        "source": "captured: DeepGEMM deep_gemm/utils/math.py run on CPU (see captured)",
        "description": f"DeepGEMM cast_back_from_fp4 of one page: {what}",
        "inputs": {"cache": c.spec(page)},
        "slots": c.spec(torch.arange(n, dtype=torch.int64)),
        "cache": {"num_pages": 1, "page_stride": None, "sentinel": 0},
        "expected": {"decoded": [{"row": i, "start": 0, "dtype": "float32", "hex": c.hexbytes(back[i]),
                                  "nan": "any"} for i in range(n)]},
        "captured": c.provenance(repo=REPO, commit=COMMIT, file=FILE,
                                 function="cast_back_from_fp4(packed, sf, gran_k=32, use_packed_ue8m0=True)",
                                 source_path=src, device="cpu",
                                 note="page cut as tests/test_attention.py kv_cache_cast_to_fp4 lays it out"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=".engines/DeepGEMM", help="DeepGEMM tree holding deep_gemm/utils/math.py")
    ap.add_argument("--out", default=str(c.OUT_ROOT))
    args = ap.parse_args()
    src = Path(args.src) / FILE
    m = c.load_module("deepgemm_math", src)
    out = Path(args.out)
    for vec in fp8_vectors(m, src) + fp4_vectors(m, src) + [fp4_decode_vector(m, src, k) for k in DECODE_CASES]:
        c.write(vec, "deepgemm", out)


if __name__ == "__main__":
    main()
