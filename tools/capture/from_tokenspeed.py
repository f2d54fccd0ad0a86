"""Capture vectors from tokenspeed's own DeepSeek V4 cache writers and readers.

    python3 tools/capture/from_tokenspeed.py [--src .tokenspeed] [--shims .sbs/shims] [--out DIR]
                                        [--part cpu|gpu|all] [--interpret]

``--src`` holds five files of https://github.com/lightseekorg/tokenspeed at
f3e4d1e24df512625f31312f4df9c74e7f6c15c5, extracted unmodified and outside the tracked tree
(``.tokenspeed/`` is git-ignored), at these paths (repository path -> path under --src):

    python/tokenspeed/runtime/layers/attention/deepseek_v4_ops.py -> tokenspeed/runtime/layers/attention/deepseek_v4_ops.py
    python/tokenspeed/runtime/configs/deepseek_v4_cache_spec.py -> tokenspeed/runtime/configs/deepseek_v4_cache_spec.py
    python/tokenspeed/runtime/configs/paged_cache_spec.py -> tokenspeed/runtime/configs/paged_cache_spec.py
    tokenspeed-kernel/python/tokenspeed_kernel/ops/attention/triton/deepseek_v4.py -> tokenspeed_kernel/ops/attention/triton/deepseek_v4.py
    tokenspeed-kernel/python/tokenspeed_kernel/ops/transform/triton/__init__.py -> tokenspeed_kernel/ops/transform/triton/__init__.py

``--shims`` is a folder of import stubs that give those files stock Triton under tokenspeed's
import names and stand in for its CUDA extension (imports only: no op this script captures goes
through a stub). It is not part of this repository; any folder providing the modules
``tokenspeed_kernel._triton`` (re-exporting ``triton``, ``tl``), ``tokenspeed_kernel.ops.attention.cuda.deepseek_v4``,
``tokenspeed_kernel.ops.transform``, ``tokenspeed_kernel.registry``, ``tokenspeed_kernel.signature``,
``tokenspeed_kernel.platform`` and ``tokenspeed.runtime.utils.common`` works.

Part ``cpu`` (torch paths, runs here): ``_write_fp8_ds_mla_cache_rows_capturable`` (the fp8_ds_mla
writer, RoPE made the identity with cos 1 / sin 0 so the stored RoPE half is the input's),
``write_deepseek_v4_indexer_fp8_cache`` and ``_write_deepseek_v4_indexer_fp8_cache_capturable``
(FP8 indexer), and the readers ``dequantize_deepseek_v4_fp8_ds_mla_cache``,
``read_deepseek_v4_indexer_fp8_cache``, ``read_deepseek_v4_indexer_mxfp4_cache``.
Part ``gpu`` (Triton kernels; needs CUDA): ``write_deepseek_v4_indexer_mxfp4_cache`` (its Triton
MXFP4 writer) and ``deepseek_v4_dequantize_and_gather_k_cache`` (the Triton fp8_ds_mla reader).
``--interpret`` runs the gpu part on CPU under TRITON_INTERPRET=1 as a dry run of this script
only: the interpreter's float casts are not the GPU's, so its output is not a capture; it goes to
``--out`` (default then: a scratch folder) and must not be committed.

Every writer runs into a sentinel-filled cache of the page size kvformats lays out, at shuffled
slots with one skipped (-1) slot; the vector keeps the whole cache, so bytes the engine leaves
alone are checked too.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as c  # noqa: E402

REPO, COMMIT = "lightseekorg/tokenspeed", "f3e4d1e24df512625f31312f4df9c74e7f6c15c5"
OPS_FILE = "python/tokenspeed/runtime/layers/attention/deepseek_v4_ops.py"
KERNEL_FILE = "tokenspeed-kernel/python/tokenspeed_kernel/ops/attention/triton/deepseek_v4.py"
PAGE = 8  # rows per page: small pages keep the whole-cache vectors small


def page_bytes(fmt: str) -> int:
    """kvformats' page size for PAGE rows (spec/upstream.md §2.1, §3, §4): tokenspeed takes the
    page stride from the cache tensor, so the vector's cache must have kvformats' stride."""
    if fmt == "fp8_ds_mla":
        return -(-PAGE * 584 // 576) * 576
    return PAGE * {"fp8_indexer": 132, "mxfp4_indexer": 68}[fmt]


def load(src: Path, shims: Path):
    sys.path[:0] = [str(shims), str(src)]
    import tokenspeed.runtime.layers.attention.deepseek_v4_ops as ts  # noqa: E402
    import tokenspeed_kernel.ops.attention.triton.deepseek_v4 as tsk  # noqa: E402

    for mod in (ts, tsk):
        if not Path(mod.__file__).resolve().is_relative_to(src.resolve()):
            sys.exit(f"{mod.__name__} came from {mod.__file__}, not from {src}")
    return ts, tsk


def meta(function: str, file: str, src_file: Path, device: str, note: str = "") -> dict:
    return c.provenance(repo=REPO, commit=COMMIT, file=file, function=function, source_path=src_file,
                        device=device, note=note)


def pages_for(n: int) -> int:
    return n // PAGE + 1  # room for n rows at permuted slots


def new_cache(fmt: str, n: int, device) -> torch.Tensor:
    return torch.full((pages_for(n), page_bytes(fmt)), c.SENTINEL, dtype=torch.uint8, device=device)


def encode_vector(vid, fmt, params, x, slots, cache, decoded, dec_dtype, captured, description) -> dict:
    expected = {"cache_bytes": [{"offset": 0, "hex": c.hexbytes(cache)}]}
    if decoded is not None:
        expected["decoded"] = [{"row": i, "start": 0, "dtype": dec_dtype, "hex": c.hexbytes(decoded[i]),
                                "nan": "any"} for i in range(decoded.shape[0])]
    return {"id": vid, "format": fmt, "params": dict(params, page_size=PAGE, profile="tokenspeed"),
            "op": "encode", "source": "captured: tokenspeed's own code (see captured)",
            "description": description, "inputs": {"x": c.spec(x)}, "slots": c.spec(slots),
            "cache": {"num_pages": cache.shape[0], "page_stride": None, "sentinel": c.SENTINEL},
            "expected": expected, "captured": captured}


def decode_vector(vid, fmt, params, cache, slots, decoded, dec_dtype, captured, description) -> dict:
    return {"id": vid, "format": fmt, "params": dict(params, page_size=PAGE, profile="tokenspeed"),
            "op": "decode", "source": "captured: tokenspeed's own code (see captured)",
            "description": description, "inputs": {"cache": c.spec(cache)}, "slots": c.spec(slots),
            "cache": {"num_pages": 2, "page_stride": None, "sentinel": 0},
            "expected": {"decoded": [{"row": i, "start": 0, "dtype": dec_dtype, "hex": c.hexbytes(decoded[i]),
                                      "nan": "any"} for i in range(decoded.shape[0])]},
            "captured": captured}


def mla_rows() -> torch.Tensor:
    blocks = c.edge_blocks(64, 448.0, 1e-4, 50) + [c.halfway_block(64, 448.0, c.E4M3_MIDS)]
    return torch.cat([c.rows_from_blocks(blocks, 7, 64, 50),
                      c.rows_from_blocks(c.shuffled_blocks(blocks, 57), 7, 64, 53)]).to(torch.bfloat16)


def indexer_rows(block: int, fmax: float, floor_amax: float, mids, seed: int) -> torch.Tensor:
    blocks = c.edge_blocks(block, fmax, floor_amax, seed) + [c.halfway_block(block, fmax, mids)]
    per_row = 128 // block
    return torch.cat([c.rows_from_blocks(blocks, per_row, 0, seed),
                      c.rows_from_blocks(c.shuffled_blocks(blocks, seed + 5), per_row, 0, seed)])


def slots_for(n: int, device) -> torch.Tensor:
    """n slots of pages_for(n) pages in a fixed shuffled order, the fifth one skipped (-1)."""
    s = torch.randperm(pages_for(n) * PAGE, generator=torch.Generator().manual_seed(n))[:n]
    s[4] = -1
    return s.to(device)


def random_pages(fmt: str, scale_bytes: list[int] | None, seed: int) -> torch.Tensor:
    """Two pages of random bytes; the ue8m0 scale bytes cycle through ``scale_bytes`` (fp8_ds_mla:
    the 7 real ones of each 8, the pad byte 0; mxfp4: all 4); RoPE halves are random bf16."""
    n = page_bytes(fmt)
    pages = c.random_cache_bytes(2 * n, seed).view(2, n)
    g = torch.Generator().manual_seed(seed)
    if fmt == "fp8_ds_mla":
        for p in range(2):
            rope = pages[p, : PAGE * 576].view(PAGE, 576)[:, 448:].contiguous().view(torch.bfloat16)
            rope.copy_(torch.randn(rope.shape, generator=g).to(torch.bfloat16))
            pages[p, : PAGE * 576].view(PAGE, 576)[:, 448:] = rope.view(torch.uint8)
            sc = pages[p, PAGE * 576: PAGE * 584].view(PAGE, 8)
            cyc = torch.tensor((scale_bytes * (PAGE * 7))[p * PAGE * 7:(p + 1) * PAGE * 7], dtype=torch.uint8)
            sc[:, :7] = cyc.view(PAGE, 7)
            sc[:, 7] = 0
    elif fmt == "mxfp4_indexer":
        for p in range(2):
            cyc = torch.tensor((scale_bytes * (PAGE * 4))[p * PAGE * 4:(p + 1) * PAGE * 4], dtype=torch.uint8)
            pages[p, PAGE * 64:] = cyc
    else:  # fp8_indexer: fp32 scales, powers of two plus 0, +-Inf, NaN, negative, arbitrary, subnormal
        choice = torch.tensor([2.0**-20, 1.0, 2.0**7, 0.0, float("inf"), float("nan"), -0.5, 0.3,
                               2.0**-140, 2.0**100], dtype=torch.float32)
        for p in range(2):
            pages[p, PAGE * 128:] = choice.roll(p)[torch.arange(PAGE) % len(choice)].view(torch.uint8)
    return pages


# ----- part cpu ------------------------------------------------------------------------------------
def cpu_vectors(ts, src: Path) -> list[dict]:
    ops_src = src / "tokenspeed/runtime/layers/attention/deepseek_v4_ops.py"
    out = []
    # fp8_ds_mla writer: positions 0 and a cos=1 / sin=0 table make the RoPE the identity
    x = mla_rows()
    n = x.shape[0]
    cos_sin = torch.cat([torch.ones(1, 32), torch.zeros(1, 32)], dim=1)
    pos = torch.zeros(n, dtype=torch.int64)
    rotated = ts._apply_gptj_rope_tail_rows(x, pos, cos_sin, 64).to(torch.bfloat16)
    assert torch.equal(rotated.view(torch.int16), x.view(torch.int16)), "identity RoPE changed the input"
    cache, slots = new_cache("fp8_ds_mla", n, "cpu"), slots_for(n, "cpu")
    ts._write_fp8_ds_mla_cache_rows_capturable(x, pos, cos_sin, cache, slots, torch.ones(n, dtype=torch.bool),
                                               PAGE, 1)
    dec = ts.dequantize_deepseek_v4_fp8_ds_mla_cache(cache, slots, PAGE, head_dim=512, rope_dim=64)
    out.append(encode_vector(
        "tokenspeed_fp8_ds_mla_write", "fp8_ds_mla", {"head_dim": 512, "rope_dim": 64}, x, slots, cache, dec,
        "bfloat16",
        meta("_write_fp8_ds_mla_cache_rows_capturable (compress_ratio 1, identity RoPE); decoded: "
             "dequantize_deepseek_v4_fp8_ds_mla_cache", OPS_FILE, ops_src, "cpu"),
        "tokenspeed's torch fp8_ds_mla writer on edge-case bf16 rows, whole cache; decoded = its torch reader"))
    # FP8 indexer writers: the per-token loop and the capturable batch path
    for tag, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        xi = indexer_rows(128, 448.0, 448.0 * 1e-10, c.E4M3_MIDS, 70).to(dtype)
        n = xi.shape[0]
        for fn in ("write_deepseek_v4_indexer_fp8_cache", "_write_deepseek_v4_indexer_fp8_cache_capturable"):
            cache, slots = new_cache("fp8_indexer", n, "cpu"), slots_for(n, "cpu")
            if fn.startswith("_"):
                getattr(ts, fn)(xi, cache, slots, torch.ones(n, dtype=torch.bool), PAGE)
            else:
                getattr(ts, fn)(xi, cache, slots, PAGE)
            dec = ts.read_deepseek_v4_indexer_fp8_cache(cache, slots, PAGE)
            short = "loop" if not fn.startswith("_") else "batch"
            out.append(encode_vector(
                f"tokenspeed_fp8_indexer_{short}_{tag}", "fp8_indexer", {"head_dim": 128}, xi, slots, cache, dec,
                "float32", meta(f"{fn}; decoded: read_deepseek_v4_indexer_fp8_cache", OPS_FILE, ops_src, "cpu"),
                f"tokenspeed's torch FP8 indexer writer {fn} on edge-case {tag} rows, whole cache; decoded = "
                f"its torch reader"))
    # readers on random bytes; ue8m0 byte 0xFF in vectors of its own
    no_ff = [b for b in c.SCALE_BYTES if b != 255]
    slots = torch.arange(2 * PAGE - 1, -1, -1, dtype=torch.int64)  # both pages, in reverse
    for case, sb in (("bytes", no_ff), ("ff_scale", [255, 127])):
        pages = random_pages("fp8_ds_mla", sb, 60 + len(sb))
        dec = ts.dequantize_deepseek_v4_fp8_ds_mla_cache(pages, slots, PAGE, head_dim=512, rope_dim=64)
        out.append(decode_vector(
            f"tokenspeed_fp8_ds_mla_read_{case}", "fp8_ds_mla", {"head_dim": 512, "rope_dim": 64}, pages, slots,
            dec, "bfloat16", meta("dequantize_deepseek_v4_fp8_ds_mla_cache", OPS_FILE, ops_src, "cpu"),
            f"tokenspeed's torch fp8_ds_mla reader on two pages of random bytes (every e4m3 code), scale bytes "
            f"{'0..254' if case == 'bytes' else '0xFF and 127'}"))
        pages = random_pages("mxfp4_indexer", sb, 80 + len(sb))
        dec = ts.read_deepseek_v4_indexer_mxfp4_cache(pages, slots, PAGE)
        out.append(decode_vector(
            f"tokenspeed_mxfp4_read_{case}", "mxfp4_indexer", {"head_dim": 128}, pages, slots, dec, "float32",
            meta("read_deepseek_v4_indexer_mxfp4_cache", OPS_FILE, ops_src, "cpu"),
            f"tokenspeed's torch MXFP4 indexer reader on two pages of random bytes (every e2m1 code), scale "
            f"bytes {'0..254' if case == 'bytes' else '0xFF and 127'}"))
    pages = random_pages("fp8_indexer", None, 90)
    dec = ts.read_deepseek_v4_indexer_fp8_cache(pages, slots, PAGE)
    out.append(decode_vector(
        "tokenspeed_fp8_indexer_read_bytes", "fp8_indexer", {"head_dim": 128}, pages, slots, dec, "float32",
        meta("read_deepseek_v4_indexer_fp8_cache", OPS_FILE, ops_src, "cpu"),
        "tokenspeed's torch FP8 indexer reader on two pages of random bytes (every e4m3 code) with fp32 scales "
        "including 0, +-Inf, NaN, negative, arbitrary and subnormal"))
    return out


# ----- part gpu ------------------------------------------------------------------------------------
def gpu_vectors(ts, tsk, src: Path, device: str) -> list[dict]:
    ops_src = src / "tokenspeed/runtime/layers/attention/deepseek_v4_ops.py"
    k_src = src / "tokenspeed_kernel/ops/attention/triton/deepseek_v4.py"
    dev = torch.device(device)
    where = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu, TRITON_INTERPRET=1 (dry run)"
    out = []
    for tag, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = indexer_rows(32, 6.0, 1e-4, c.E2M1_MIDS, 90).to(dtype)
        n = x.shape[0]
        cache, slots = new_cache("mxfp4_indexer", n, dev), slots_for(n, dev)
        if dev.type == "cuda":
            ts.write_deepseek_v4_indexer_mxfp4_cache(x.to(dev), cache, slots, PAGE)  # its public entry point
        else:  # the public entry point refuses CPU tensors: call the Triton launcher it calls
            tsk.write_deepseek_v4_indexer_mxfp4_cache_cuda(x, cache, slots, torch.ones(n, dtype=torch.bool), PAGE)
        out.append(encode_vector(
            f"tokenspeed_mxfp4_write_triton_{tag}", "mxfp4_indexer", {"head_dim": 128}, x, slots.cpu(),
            cache.cpu(), None, None,
            meta("write_deepseek_v4_indexer_mxfp4_cache -> write_deepseek_v4_indexer_mxfp4_cache_cuda (Triton)",
                 OPS_FILE, ops_src, where, note=f"kernel file {KERNEL_FILE}, blob {c.blob_id(k_src)}"),
            f"tokenspeed's Triton MXFP4 indexer writer on edge-case {tag} rows, whole cache"))
    slots = torch.arange(2 * PAGE, dtype=torch.int64)
    for case, sb in (("bytes", [b for b in c.SCALE_BYTES if b != 255]), ("ff_scale", [255, 127])):
        pages = random_pages("fp8_ds_mla", sb, 60 + len(sb)).to(dev)
        outb = torch.zeros(1, 2 * PAGE, 512, dtype=torch.bfloat16, device=dev)
        try:
            tsk.deepseek_v4_dequantize_and_gather_k_cache(
                out=outb, cache_2d=pages, seq_lens=torch.tensor([2 * PAGE], device=dev), gather_lens=None,
                block_table=torch.tensor([[0, 1]], device=dev), block_size=PAGE, offset=0)
        except Exception as e:  # the interpreter rejects its scalar masks; a GPU run must not fail here
            if dev.type == "cuda":
                raise
            print(f"dry run: the Triton interpreter cannot run deepseek_v4_dequantize_and_gather_k_cache ({e})")
            continue
        out.append(decode_vector(
            f"tokenspeed_fp8_ds_mla_read_triton_{case}", "fp8_ds_mla", {"head_dim": 512, "rope_dim": 64},
            pages.cpu(), slots, outb[0].cpu(), "bfloat16",
            meta("deepseek_v4_dequantize_and_gather_k_cache (Triton; block table [0, 1], all 16 slots)",
                 KERNEL_FILE, k_src, where),
            f"tokenspeed's Triton fp8_ds_mla dequantize-and-gather on two pages of random bytes, scale bytes "
            f"{'0..254' if case == 'bytes' else '0xFF and 127'}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.environ.get("TOKENSPEED_SRC", ".tokenspeed"))
    ap.add_argument("--shims", default=os.environ.get("TOKENSPEED_SHIMS", ".sbs/shims"))
    ap.add_argument("--out", default=None, help="vector root (default spec/vectors/captured)")
    ap.add_argument("--part", choices=("cpu", "gpu", "all"), default="all",
                    help="all: the cpu part, and the gpu part when CUDA is present")
    ap.add_argument("--interpret", action="store_true", help="dry-run the gpu part under the Triton interpreter")
    args = ap.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    src, shims = Path(args.src), Path(args.shims)
    ts, tsk = load(src, shims)
    out_root = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="ts-interpret-"))
                                                if args.interpret else c.OUT_ROOT)
    vecs = []
    if args.part in ("cpu", "all") and not args.interpret:
        vecs += cpu_vectors(ts, src)
    cuda = torch.cuda.is_available()
    if args.part in ("gpu", "all"):
        if cuda:
            vecs += gpu_vectors(ts, tsk, src, "cuda")
        elif args.interpret:
            vecs += gpu_vectors(ts, tsk, src, "cpu")
        elif args.part == "gpu":
            sys.exit("--part gpu needs CUDA (or --interpret for a dry run)")
        else:
            print("no CUDA: the gpu part (Triton kernels) is skipped")
    for vec in vecs:
        c.write(vec, "tokenspeed", out_root)


if __name__ == "__main__":
    main()
