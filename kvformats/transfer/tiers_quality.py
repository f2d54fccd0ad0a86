"""The attention error the cold-tier codec adds, measured as ``kvformats quality`` measures the
formats (``kvformats.dsv4_layer.quality``): the exact bf16 rows of a run, encoded into
``fp8_ds_mla`` (default profile), then each path's attention over the exact top-k, against the
exact attention; once as the device holds the rows, then with the compressed rows (CSA, HCA)
and then also the SWA rows after a round trip through the cold record
(``kvformats.codec.cold``) and back into ``fp8_ds_mla``, as a restore from the cold tier gives
them. The difference to the first row is what the cold tier costs.

``python3 -m benchmarks tiers_cpu --quality`` prints it at ``kvformats quality``'s default
shapes (the figures of docs/tiers.md).
"""

from __future__ import annotations

import torch

from kvformats.codec.cold import FP8_DS_MLA_MXFP4, ColdCodec
from kvformats.codec.rows import read_rows
from kvformats.dsv4_layer import quality
from kvformats.dsv4_layer.pipeline_config import LayerConfig
from kvformats.formats import Fp8DsMla


# (label, the caches whose rows go through the cold tier)
RUNS = (("fp8_ds_mla, device tier", ()), ("cold tier: CSA and HCA rows", ("csa", "hca")),
        ("cold tier: SWA, CSA and HCA rows", ("swa", "csa", "hca")))


def _stored(layout: Fp8DsMla, rows: torch.Tensor, codec: ColdCodec | None) -> torch.Tensor:
    """Exact rows ``[R, N, d]`` as the fp8_ds_mla cache decodes them, after a cold round trip
    when ``codec`` is given (float32)."""
    flat = rows.reshape(-1, rows.shape[-1]).to(torch.bfloat16)
    cache = layout.allocate(-(-flat.shape[0] // layout.page_size))
    slots = torch.arange(flat.shape[0])
    layout.encode(flat, cache, slots)
    held = read_rows(layout, cache, slots)
    if codec is not None:
        held = codec.decode(layout, codec.encode(layout, held))
    return layout.decode_rows(held).float().view_as(rows)


def cold_report(cfg: LayerConfig, x: torch.Tensor, prefill: int, decode: int,
                codec: ColdCodec = FP8_DS_MLA_MXFP4) -> dict:
    """Relative attention error per path (``quality.PATHS``) of each run of ``RUNS``; JSON-ready."""
    run = quality.Run(cfg, x, prefill, decode)
    exact = quality.Exact(run)
    q, iq, hw = quality._queries(run)
    topk = quality.exact_topk(run, iq, hw, exact.index)
    want = quality.attention(run, q, exact.swa, exact.csa, exact.hca, topk)
    layout = Fp8DsMla(head_dim=cfg.head_dim, rope_dim=cfg.rope_dim, page_size=cfg.page_size)
    rows = []
    for label, cold in RUNS:
        held = {name: _stored(layout, getattr(exact, name), codec if name in cold else None)
                for name in ("swa", "csa", "hca")}
        got = quality.attention(run, q, held["swa"], held["csa"], held["hca"], topk)
        rows.append({"run": label, **{p: quality.rel(got[p], want[p]) for p in quality.PATHS}})
    return {"codec": codec.name, "bytes_per_token": {"device": layout.row_bytes, "cold": codec.row_bytes(layout)},
            "prefill": prefill, "decode": decode, "tokens_measured": len(run.dec_pos), "rows": rows}
