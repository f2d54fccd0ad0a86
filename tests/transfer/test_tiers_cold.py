"""The cold-tier codec (kvformats.codec.cold): its declared error bound holds element by element
and is tight, the RoPE tail comes back byte for byte, the sizes it states, and the tiers use it
only when asked: a cold restore writes exactly the declared conversion's bytes, a cold tier
file records the codec and refuses another."""

from __future__ import annotations

import pytest
import torch

from kvformats.codec.cold import FP8_DS_MLA_MXFP4 as COLD
from kvformats.codec.rows import read_rows
from kvformats.dsv4_layer.pipeline import LayerStep
from kvformats.dsv4_layer.pipeline_config import tiny_config
from kvformats.errors import ConversionError, InputError, RecordMismatchError
from kvformats.formats import Fp8DsMla, Mxfp4Indexer
from kvformats.numerics import codes as nx
from kvformats.transfer import load_tier, offload, restore, save_tier
from kvformats.transfer.tiers_file import TIER_KEY
from kvformats.transfer.tiers_layer import layer_step_pages, layer_step_rows
from kvformats.transfer.tiers_quality import cold_report
from tests.transfer.test_tiers_errors import edit_metadata

V4 = Fp8DsMla(head_dim=512, rope_dim=64, page_size=64)


def adversarial_rows(layout, n: int, seed: int = 0) -> torch.Tensor:
    """fp8_ds_mla rows of Gaussian values whose 32-blocks span 2^-30 .. 2^9 independently, so
    the two halves of a 64-block can lie far apart (the re-encode's rounding shows there)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, layout.head_dim, generator=g)
    blocks = layout.nope_dim // 32
    x[:, :layout.nope_dim] *= torch.exp2(torch.randint(-30, 10, (n, blocks), generator=g).float()) \
        .repeat_interleave(32, 1)
    return layout.encode_rows(x)


def test_sizes_stated():
    assert (V4.row_bytes, COLD.row_bytes(V4)) == (584, 366)  # 218 B per token saved, 37 %
    assert [s[0] for s in COLD.spans(V4)] == ["values", "scale", "rope"]


@pytest.mark.parametrize("layout", [V4, Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)], ids=["v4", "tiny"])
def test_the_declared_bound_holds_for_every_element_and_is_tight(layout):
    rows = adversarial_rows(layout, 2048)
    cold = COLD.encode(layout, rows)
    back = COLD.decode(layout, cold)
    x, x_hat = layout.decode_rows(rows).float(), layout.decode_rows(back).float()
    nope = Mxfp4Indexer(head_dim=layout.nope_dim, page_size=1, profile=COLD.nope_profile)
    v = nope.decode_rows(cold[:, :nope.row_bytes])
    s = nx.ue8m0_decode(cold[:, nope.row_span("scale")], "inf").repeat_interleave(32, 1)
    e = (back[:, layout.row_span("scale")].to(torch.int32) - 127).repeat_interleave(64, 1)
    d = layout.nope_dim
    first = torch.maximum(s / 4, x[:, :d].abs() / 4)
    bound = first + torch.maximum(v.abs() / 16, torch.exp2((e - 10).float()))
    err = (x[:, :d] - x_hat[:, :d]).abs()
    assert bool((err <= bound).all())
    assert float((err / bound).max()) > 0.9  # not a loose bound: some element comes close
    exact_grid = torch.log2(s) >= e - 8  # where e4m3 holds every MXFP4 value: one rounding only
    assert bool((err[exact_grid] <= first[exact_grid]).all()) and bool((~exact_grid).any())
    assert torch.equal(back[:, layout.row_span("rope")], rows[:, layout.row_span("rope")])  # RoPE: bytes kept


def test_the_codec_converts_only_fp8_ds_mla():
    with pytest.raises(ConversionError, match="converts fp8_ds_mla"):
        COLD.encode(Mxfp4Indexer(), torch.zeros(1, 68, dtype=torch.uint8))
    with pytest.raises(InputError, match="must be a uint8 tensor"):
        COLD.decode(V4, torch.zeros(1, 584, dtype=torch.uint8))


@pytest.fixture(scope="module")
def prefilled():
    cfg = tiny_config(requests=1)
    step = LayerStep(cfg, seed=0, backend="reference")
    g = torch.Generator().manual_seed(0)
    step.step(torch.randn(150, cfg.hidden, generator=g), torch.arange(150), torch.zeros(150, dtype=torch.int64))
    return step


def test_cold_only_when_asked_and_only_where_declared(prefilled):
    pages, rows = layer_step_pages(prefilled, 0), layer_step_rows(prefilled.cfg, 150)
    warm = offload(pages, rows)
    assert all(t.cold is None for t in warm.caches.values())
    every = offload(pages, rows, cold=COLD)  # one codec: every cache of its source format
    assert {n for n, t in every.caches.items() if t.cold is not None} == {"swa", "csa", "hca"}
    some = offload(pages, rows, cold={"csa": COLD, "hca": COLD})
    assert {n for n, t in some.caches.items() if t.cold is not None} == {"csa", "hca"}
    assert torch.equal(some.caches["swa"].rows, warm.caches["swa"].rows)
    kv = prefilled.caches.kv_layout
    assert warm.nbytes - some.nbytes == (37 + 1) * (kv.row_bytes - COLD.row_bytes(kv))
    with pytest.raises(InputError, match="converts fp8_ds_mla rows; cache 'index'"):
        offload(pages, rows, cold={"index": COLD})


@pytest.mark.parametrize("via", ["host", "file"])
def test_a_cold_restore_writes_the_declared_conversion(prefilled, via, tmp_path):
    """The restored fp8_ds_mla rows are decode(encode(rows)) of the codec, byte for byte, in
    pages of another size; the warm caches are exact."""
    pages, rows = layer_step_pages(prefilled, 0), layer_step_rows(prefilled.cfg, 150)
    tier = offload(pages, rows, cold={"csa": COLD, "hca": COLD})
    if via == "file":
        save_tier(tmp_path / "cold.kvc", tier)
        tier = load_tier(tmp_path / "cold.kvc")
    dst = LayerStep(tiny_config(requests=1, page_size=8), seed=4, backend="reference", weights=prefilled.weights)
    restore(tier, layer_step_pages(dst, 0))
    back = layer_step_pages(dst, 0)

    def held(where, start, stop):
        i = torch.arange(start, stop)
        ps = where.layout.page_size
        return read_rows(where.layout, where.cache, where.pages[i // ps] * ps + i % ps)

    for name, (start, stop) in rows.items():
        want = held(pages[name], start, stop)
        if name in ("csa", "hca"):
            want = COLD.decode(pages[name].layout, COLD.encode(pages[name].layout, want))
        assert torch.equal(held(back[name], start, stop), want), name


def test_a_cold_tier_file_records_its_codec(prefilled, tmp_path):
    pages, rows = layer_step_pages(prefilled, 0), layer_step_rows(prefilled.cfg, 150)
    path = tmp_path / "cold.kvc"
    save_tier(path, offload(pages, rows, cold=COLD))
    edit_metadata(path, TIER_KEY, lambda m: m["caches"]["csa"]["cold"].update(version=2))
    with pytest.raises(RecordMismatchError, match="cold record"):
        load_tier(path)


def test_the_attention_error_of_the_cold_tier_is_reported():
    """The quality report's figures for the codec at tiny shapes: the cold rows cost accuracy on
    their paths only; the device tier's row is the quality report's fp8_ds_mla row."""
    from kvformats.cli.quality import DEFAULTS
    from kvformats.dsv4_layer.pipeline_config import LayerConfig
    from kvformats.dsv4_layer.synthetic import activations

    shapes = {**DEFAULTS, "head_dim": 128, "index_heads": 4, "window": 16, "page_size": 16, "hidden": 64}
    cfg = LayerConfig(topk=8, requests=2, max_context=256, **shapes)
    rep = cold_report(cfg, activations(cfg.hidden, [200, 200], seed=0), 184, 16)
    device, compressed, every = rep["rows"]
    assert rep["bytes_per_token"] == {"device": 194, "cold": 162}
    assert compressed["swa"] == device["swa"] and every["swa"] > device["swa"]
    for path in ("csa", "hca"):
        assert device[path] < compressed[path] == every[path] < 0.25
