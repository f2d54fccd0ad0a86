"""Capture V4.1 vectors from tokenspeed-kernel 0.1.4's released Triton cache writer, on CPU.

    python3 tools/capture/from_tokenspeed_release.py [--out DIR]

The wheel (``pip download --no-deps tokenspeed-kernel==0.1.4``, sha256 pinned in
tests/harness/released.py, cached under ``~/.cache/kvformats-tests``) is opened and only
``tokenspeed_kernel/ops/attention/dsv41/triton.py`` is extracted, to a temporary folder; the file
is imported with stub modules for its imports (tokenspeed's registry, platform and signature
helpers, its Triton fork replaced by stock Triton) and ``cache_scatter(rows, cache, slots,
cache_format)`` runs its ``_pack_kernel`` under the Triton interpreter with the GPU's float
conversions (``tests.harness.released.gpu_numerics``: the stock interpreter rounds float8 ties
away from zero and does not saturate). Nothing of tokenspeed is copied into the repository.

One vector per cache format, each holding two rows of each of the six input kinds
(``tests.harness.released.input_rows``: N(0, 1), N(0, 0.02), signed zeros, tiny values, mixed
scales, exact ties) written at shuffled slots of a one-page, sentinel-filled cache with one
slot -1 (skipped); the vector keeps the whole cache, page size 64 (what ``cache_scatter``
requires; tests/interop/test_released_writers.py writes two pages):

* ``swa``: 528 B rows, page-planar -> ``fp8_ds_mla_v41`` profile tokenspeed;
* ``triton_dsv41_swa_rope_scatter`` (the fused RoPE + quantize SWA writer, ``_swa_rope_insert``)
  with a cos 1 / sin 0 table: the same, into page 1 of two (it never writes page 0, its null
  page); rows whose signed zeros the rotation would change are rotated twice first (a fixed
  point);
* ``global``: 288 B rows -> ``fp4_ds_mla_v41`` profile tokenspeed;
* ``index``: 68 B rows, 128 dims -> ``mxfp4_indexer`` profile vllm.

``device`` says "cpu (Triton interpreter)": the bytes are those of the interpreter with the
GPU's conversions, not of a GPU run (spec/engines.md "V4.1 writers" says why they agree).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: its library binds to the interpreter

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.harness
import common as c  # noqa: E402
from tests.harness import released as rel  # noqa: E402

PAGE = 64
ROWS_PER_KIND = 2
TARGETS = {  # writer -> (vector id, format, params)
    "tokenspeed-swa": ("tokenspeed_release_v41_swa_write", "fp8_ds_mla_v41",
                       {"head_dim": 512, "page_size": PAGE, "profile": "tokenspeed"}),
    "tokenspeed-swa-rope": ("tokenspeed_release_v41_swa_rope_write", "fp8_ds_mla_v41",
                            {"head_dim": 512, "page_size": PAGE, "profile": "tokenspeed"}),
    "tokenspeed-global": ("tokenspeed_release_v41_global_write", "fp4_ds_mla_v41",
                          {"head_dim": 512, "page_size": PAGE, "profile": "tokenspeed"}),
    "tokenspeed-index": ("tokenspeed_release_v41_index_write", "mxfp4_indexer",
                         {"head_dim": 128, "page_size": PAGE, "profile": "vllm"}),
}


def rows_of_every_kind(writer: str, seed: int) -> torch.Tensor:
    w = rel.WRITERS[writer]
    x = torch.cat([rel.input_rows(kind, ROWS_PER_KIND, w.dim, seed) for kind in rel.KINDS])
    if w.identity_rope:  # signed zeros the kernel's cos 1 / sin 0 rotation would change: rotated twice, a fixed point
        x = w.quantized_rows(w.quantized_rows(x))
        assert torch.equal(w.quantized_rows(x).view(torch.int16), x.view(torch.int16))
    return x


def slots_for(n: int, pages: int, page: int, seed: int) -> torch.Tensor:
    """n distinct slots of ``pages`` pages in a fixed shuffled order, the fourth one -1 (skipped)."""
    s = torch.randperm(pages * page, generator=torch.Generator().manual_seed(seed))[:n].to(torch.int64)
    s[3] = -1
    return s


def capture(writer: str, target: tuple, folder: Path, files: dict, wheel: Path, page: int, pages: int = 2,
            seed: int = 3) -> dict:
    """Run ``writer`` on rows of every kind into a sentinel-filled cache; the vector."""
    vid, fmt, params = target
    w = rel.WRITERS[writer]
    x = rows_of_every_kind(writer, seed)
    slots = slots_for(x.shape[0], pages, page, seed)
    skipped = ", slot -1 skipped"
    if w.null_page0:  # tokenspeed's swa_rope_scatter never writes page 0: rows go to page 1, page 0 stays
        pages, skipped = 2, ", slot -1 skipped, page 0 (the writer's null page) left alone"
        slots = torch.where(slots >= 0, slots % page + page, slots)
    if w.whole_pages:  # a page encoder: one page holding the rows in order
        page, pages, skipped = x.shape[0], 1, ""
        slots = torch.arange(page)
        params = dict(params, page_size=page)
    cache = torch.full((pages, page * w.row_bytes), rel.SENTINEL, dtype=torch.uint8)
    rel.run_writer(writer, x, slots, cache, page, folder)
    kinds = ", ".join(f"rows {i * ROWS_PER_KIND}-{(i + 1) * ROWS_PER_KIND - 1} {k}" for i, k in enumerate(rel.KINDS))
    note = "Triton interpreter (TRITON_INTERPRET=1) with the GPU's float conversions (tests/harness/released.py " \
           "gpu_numerics)"
    if writer == "vllm-rope-nvfp4":
        note += "; the kernel's PTX cvt.rn.satfinite.e2m1x2.f32 emulated with its documented semantics"
    if w.identity_rope:
        note += "; cos_sin_cache of cos 1, sin 0, compress ratio 1, positions 0..N-1"
    return {"id": vid, "format": fmt, "params": dict(params), "op": "encode",
            "source": f"captured: {w.release.package} {w.release.version}'s own code (see captured)",
            "description": f"{w.release.package} {w.release.version} {w.function} on bf16 rows of six kinds "
                           f"({kinds}), whole cache of {pages} page(s) of {page} rows{skipped}",
            "inputs": {"x": c.spec(x)}, "slots": c.spec(slots),
            "cache": {"num_pages": pages, "page_stride": None, "sentinel": rel.SENTINEL},
            "expected": {"cache_bytes": [{"offset": 0, "hex": c.hexbytes(cache)}]},
            "captured": dict(c.release_provenance(release=w.release, file=w.file, function=w.function,
                                                  source_path=files[w.file], wheel_path=wheel,
                                                  device="cpu (Triton interpreter)" if not w.whole_pages else "cpu",
                                                  note=note if not w.whole_pages else "torch code"),
                             harness_writer=writer)}


def main(targets=TARGETS, release=rel.TOKENSPEED_KERNEL, engine: str = "tokenspeed", page: int = PAGE,
         pages: int = 1) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="vector root (default spec/vectors/captured)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = rel.extract(release, Path(tmp))
        wheel = rel.fetch(release)
        for writer, target in targets.items():
            vec = capture(writer, target, Path(tmp), files, wheel, page, pages)
            c.write(vec, engine, Path(args.out) if args.out else c.OUT_ROOT)


if __name__ == "__main__":
    main()
