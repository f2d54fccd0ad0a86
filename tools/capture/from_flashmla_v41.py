"""Capture V4.1 vectors from FlashMLA's own torch writer (tests/quant.py of the vllm-project fork), on CPU.

    python3 tools/capture/from_flashmla_v41.py [--src DIR] [--out spec/vectors/captured]

DIR (default ``.engines/FlashMLA-vllm-02137a4``, git-ignored) holds ``tests/quant.py`` of
https://github.com/vllm-project/FlashMLA at commit 02137a43fbd0c2ef6a386ea4c841e9bd067e3823
(git blob 9db53f02a6ae3b33801fe9784310605e4616957b), outside the tracked tree:

    git --git-dir=<clone of vllm-project/FlashMLA>/.git show 02137a4:tests/quant.py \\
        > .engines/FlashMLA-vllm-02137a4/tests/quant.py

and ``stubs/kernelkit.py``: quant.py does ``import kernelkit as kk`` for its V32_FP8 branch only
(``kk.gen_non_contiguous_tensor``), which this script never takes; any module of that name works,
e.g. one whose ``gen_non_contiguous_tensor`` raises NotImplementedError. Nothing of FlashMLA is
copied into the repository.

Captured (profile flashmla, page-planar, page size 64: FlashMLA pads a block to a multiple of
512 B, and 64 rows of 528 B / 288 B are 66 / 36 such units, so the block is exactly the
kvformats page and quantize_k_cache writes every byte of it):

* ``quantize_k_cache(x, KVCacheLayout.V41_FP8Sparse)`` -> ``fp8_ds_mla_v41`` and
  ``quantize_k_cache(x, KVCacheLayout.V41_FP4)`` -> ``fp4_ds_mla_v41``, on one block of 64 bf16
  rows of seven kinds: the six of ``tests.harness.released.input_rows`` (N(0, 1), N(0, 0.02),
  signed zeros, tiny values with block maxima below 1e-4, 6 * 2^-9 and 448e-4, mixed scales
  spanning 1e-4 .. 1e2 in every 16 / 32 values, e2m1 / e4m3 / e4m3-scale ties) and
  ``nonfinite_rows`` (N(0, 1) rows with NaN, +Inf and -Inf elements in some 16- and 32-tiles);
  the whole page is the expected cache, and ``decoded`` is FlashMLA's ``dequantize_k_cache`` of
  that page;
* ``dequantize_k_cache`` of one block of random bytes (every e4m3 / e2m1 code) whose scale bytes
  take every value 0x00 .. 0xFF (``op: decode``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.harness
import common as c  # noqa: E402
from tests.harness.released import KINDS, input_rows  # noqa: E402  (no kvformats import there)

REPO, COMMIT, FILE = "vllm-project/FlashMLA", "02137a43fbd0c2ef6a386ea4c841e9bd067e3823", "tests/quant.py"
PAGE, DIM = 64, 512
ROWS_PER_KIND = 9  # 6 kinds x 9 rows + 10 non-finite rows = one block of 64
NONFINITE_ROWS = PAGE - len(KINDS) * ROWS_PER_KIND
ALL_KINDS = (*KINDS, "nonfinite")
FORMATS = {  # layout -> (format, tile of the writer's scale, vector id stem)
    "V41_FP8Sparse": ("fp8_ds_mla_v41", 32, "flashmla_fork_v41_fp8"),
    "V41_FP4": ("fp4_ds_mla_v41", 16, "flashmla_fork_v41_fp4"),
}
BF16_NAN = {"+": 0x7FC0, "-": -0x40}  # bf16 NaN bits (int16): sign clear, sign set (0xFFC0)


def nonfinite_rows(n: int, seed: int) -> torch.Tensor:
    """``n`` bf16 rows of N(0, 1) whose 16-tiles j (pattern (j + row) % 8) hold: 0 one NaN, 1 one
    +Inf, 2 one -Inf, 3 a NaN and a +Inf, 4 a +Inf and a -Inf, 5 only NaNs, 6 and 7 nothing
    non-finite. The shift by row gives 32-tiles (pairs of 16-tiles) with NaN only, Inf only,
    NaN and Inf and none. NaN bits: 0x7FC0 in even rows, 0xFFC0 in odd rows (bf16, both signs)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, DIM, generator=g) * 2.0).to(torch.bfloat16)
    bits = x.view(torch.int16)
    for r in range(n):
        nan = BF16_NAN["+" if r % 2 == 0 else "-"]
        for j in range(DIM // 16):
            base, p, q = j * 16, j * 16 + (r + j) % 16, j * 16 + (r + 3 * j + 5) % 16
            if q == p:
                q = base + (p - base + 1) % 16
            kind = (j + r) % 8
            if kind == 0:
                bits[r, p] = nan
            elif kind == 1:
                x[r, p] = float("inf")
            elif kind == 2:
                x[r, p] = float("-inf")
            elif kind == 3:
                bits[r, p] = nan
                x[r, q] = float("inf")
            elif kind == 4:
                x[r, p] = float("inf")
                x[r, q] = float("-inf")
            elif kind == 5:
                bits[r, base:base + 16] = nan
    return x


def block_rows(seed: int) -> torch.Tensor:
    """The 64 rows of the captured block: ROWS_PER_KIND rows of each kind, then the non-finite rows."""
    parts = [input_rows(kind, ROWS_PER_KIND, DIM, seed) for kind in KINDS]
    parts.append(nonfinite_rows(NONFINITE_ROWS, seed * 1000 + 77))
    x = torch.cat(parts)
    assert x.shape == (PAGE, DIM) and x.dtype == torch.bfloat16
    return x


def kinds_text() -> str:
    spans, start = [], 0
    for kind in ALL_KINDS:
        n = NONFINITE_ROWS if kind == "nonfinite" else ROWS_PER_KIND
        spans.append(f"rows {start}-{start + n - 1} {kind}")
        start += n
    return ", ".join(spans)


def page_bytes(out: torch.Tensor) -> torch.Tensor:
    """quantize_k_cache's [1, 64, 1, bytes_per_token] result as the block's bytes (a view of the
    padded allocation; with 64 rows it is the whole block)."""
    return out.reshape(1, -1).view(torch.uint8)[0].clone()


def decoded_entries(dec: torch.Tensor) -> list[dict]:
    return [{"row": i, "start": 0, "dtype": "bfloat16", "hex": c.hexbytes(dec[i]), "nan": "any"}
            for i in range(dec.shape[0])]


def params(fmt: str) -> dict:
    return {"head_dim": DIM, "page_size": PAGE, "profile": "flashmla"}


def encode_vector(q, layout_name: str, x: torch.Tensor, src: Path) -> dict:
    fmt, tile, stem = FORMATS[layout_name]
    layout = getattr(q.KVCacheLayout, layout_name)
    assert layout.get_bytes_per_token() * PAGE % 512 == 0  # no page padding: the block is the page
    out = q.quantize_k_cache(x.view(1, PAGE, 1, DIM), layout)
    again = q.quantize_k_cache(x.clone().view(1, PAGE, 1, DIM), layout)
    page = page_bytes(out)
    assert torch.equal(page, page_bytes(again))  # every byte written (torch.empty leaves no trace)
    assert page.numel() == PAGE * layout.get_bytes_per_token()
    dec = q.dequantize_k_cache(out, layout).view(PAGE, DIM)
    return {
        "id": f"{stem}_encode", "format": fmt, "params": params(fmt), "op": "encode",
        "source": "captured: FlashMLA (vllm-project fork) tests/quant.py run on CPU (see captured)",
        "description": f"FlashMLA fork quantize_k_cache(KVCacheLayout.{layout_name}) of one block of 64 bf16 rows "
                       f"of seven kinds ({kinds_text()}); the block is the whole page (64 x "
                       f"{layout.get_bytes_per_token()} B, page-planar, no padding); decoded = its "
                       f"dequantize_k_cache of the same block",
        "inputs": {"x": c.spec(x)},
        "slots": c.spec(torch.arange(PAGE, dtype=torch.int64)),
        "cache": {"num_pages": 1, "page_stride": None, "sentinel": c.SENTINEL},
        "expected": {"cache_bytes": [{"offset": 0, "hex": c.hexbytes(page)}], "decoded": decoded_entries(dec)},
        "captured": c.provenance(repo=REPO, commit=COMMIT, file=FILE,
                                 function=f"quantize_k_cache, dequantize_k_cache (KVCacheLayout.{layout_name})",
                                 source_path=src, device="cpu",
                                 note="torch code; tests/quant.py imports kernelkit, stubbed (V32_FP8 only)"),
    }


def decode_vector(q, layout_name: str, src: Path, seed: int) -> dict:
    """One block of random bytes with every scale byte value 0x00 .. 0xFF (shuffled), read by
    dequantize_k_cache."""
    fmt, tile, stem = FORMATS[layout_name]
    layout = getattr(q.KVCacheLayout, layout_name)
    d, d_nope, d_rope, tile_size, num_tiles = layout.get_meta()
    bpt = layout.get_bytes_per_token()
    data_bytes = bpt - num_tiles
    page = c.random_cache_bytes(PAGE * bpt, seed)
    n_scales = PAGE * num_tiles
    g = torch.Generator().manual_seed(seed + 1)
    scales = torch.arange(256, dtype=torch.int64).repeat(n_scales // 256)[torch.randperm(n_scales, generator=g)]
    page[PAGE * data_bytes:] = scales.to(torch.uint8)
    dec = q.dequantize_k_cache(page.clone().view(torch.float8_e4m3fn).view(1, PAGE, 1, bpt), layout).view(PAGE, DIM)
    scale_type = "ue8m0" if layout_name == "V41_FP8Sparse" else "e4m3"
    return {
        "id": f"{stem}_decode_bytes", "format": fmt, "params": params(fmt), "op": "decode",
        "source": "captured: FlashMLA (vllm-project fork) tests/quant.py run on CPU (see captured)",
        "description": f"FlashMLA fork dequantize_k_cache(KVCacheLayout.{layout_name}) of one block of random "
                       f"bytes (every element code) whose {n_scales} {scale_type} scale bytes take every value "
                       f"0x00 .. 0xFF, shuffled; the block is the whole page",
        "inputs": {"cache": c.spec(page)},
        "slots": c.spec(torch.arange(PAGE, dtype=torch.int64)),
        "cache": {"num_pages": 1, "page_stride": None, "sentinel": 0},
        "expected": {"decoded": decoded_entries(dec)},
        "captured": c.provenance(repo=REPO, commit=COMMIT, file=FILE,
                                 function=f"dequantize_k_cache (KVCacheLayout.{layout_name})",
                                 source_path=src, device="cpu",
                                 note="torch code; tests/quant.py imports kernelkit, stubbed (V32_FP8 only)"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=".engines/FlashMLA-vllm-02137a4",
                    help="folder holding tests/quant.py of vllm-project/FlashMLA @02137a4 and stubs/kernelkit.py")
    ap.add_argument("--out", default=str(c.OUT_ROOT))
    args = ap.parse_args()
    src = Path(args.src) / FILE
    sys.path.insert(0, str(Path(args.src) / "stubs"))  # kernelkit (see the docstring)
    q = c.load_module("flashmla_fork_quant", src)
    out = Path(args.out)
    x = block_rows(seed=41)
    for i, layout_name in enumerate(FORMATS):
        c.write(encode_vector(q, layout_name, x, src), "flashmla", out)
        c.write(decode_vector(q, layout_name, src, seed=410 + i), "flashmla", out)


if __name__ == "__main__":
    main()
