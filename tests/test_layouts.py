"""Layout geometry: row and page bytes, region offsets, views, allocation (spec/upstream.md §1-§5)."""

import pytest
import torch

import kvformats as kvf

GEOMETRY = [  # (layout, row_bytes, page_bytes, {region: (offset, nbytes)})
    (kvf.Fp8DsMla(), 584, 37440,
     {"nope": (0, 448), "rope": (448, 128), "scale": (36864, 7), "scale_pad": (36871, 1), "page_pad": (37376, 64)}),
    (kvf.Fp8DsMla(page_size=2), 584, 1728,
     {"nope": (0, 448), "rope": (448, 128), "scale": (1152, 7), "scale_pad": (1159, 1), "page_pad": (1168, 560)}),
    (kvf.Fp8DsMla(head_dim=192, rope_dim=64), 259, 16640,
     {"nope": (0, 128), "rope": (128, 128), "scale": (16384, 2), "scale_pad": (16386, 1), "page_pad": (16576, 64)}),
    (kvf.Fp8Indexer(), 132, 8448, {"values": (0, 128), "scale": (8192, 4)}),
    (kvf.Mxfp4Indexer(), 68, 4352, {"values": (0, 64), "scale": (4096, 4)}),
    (kvf.Mxfp4Indexer(head_dim=32, page_size=3), 17, 51, {"values": (0, 16), "scale": (48, 1)}),
    (kvf.CompressorState(), 8192, 32768, {"kv": (0, 4096), "score": (4096, 4096)}),
    (kvf.CompressorState(ratio=128, page_size=8), 4096, 32768, {"kv": (0, 2048), "score": (2048, 2048)}),
    (kvf.CompressorState(head_dim=128), 2048, 8192, {"kv": (0, 1024), "score": (1024, 1024)}),
]
IDS = [f"{lay.name}-{i}" for i, (lay, *_) in enumerate(GEOMETRY)]
# The derived-geometry invariants hold for every layout: those above and, for each registered
# format they lack, its declared small one (Layout.examples.small_params).
LAYOUTS = [g[0] for g in GEOMETRY] + [kvf.get_format(n, **type(kvf.get_format(n)).examples.small_params)
                                      for n in kvf.list_formats() if n not in {g[0].name for g in GEOMETRY}]
LAYOUT_IDS = IDS + [lay.name for lay in LAYOUTS[len(GEOMETRY):]]


@pytest.mark.parametrize("layout, row_bytes, page_bytes, regions", GEOMETRY, ids=IDS)
def test_geometry(layout, row_bytes, page_bytes, regions):
    assert layout.row_bytes == row_bytes
    assert layout.page_bytes == page_bytes
    assert layout.min_page_bytes == layout.page_size * row_bytes
    assert {r.name: (r.offset, r.nbytes) for r in layout.regions} == regions


def test_fp8_ds_mla_scale_dim_and_padding_rule():
    lay = kvf.Fp8DsMla(head_dim=192, rope_dim=64)
    scale_dim = sum(r.nbytes for r in lay.regions if r.segment == "scales")
    assert (lay.nope_dim, lay.num_blocks, scale_dim) == (128, 2, 3)
    for rows in (1, 2, 3, 63, 64):
        lay = kvf.Fp8DsMla(page_size=rows)
        assert lay.page_bytes == -(-rows * 584 // 576) * 576


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_regions_tile_the_page(layout):
    """Every byte of [0, page_bytes) belongs to exactly one (region, row); gathered rows are the
    per-row fields in page order, data before scale."""
    owner = torch.zeros(layout.page_bytes, dtype=torch.int32)
    for r in layout.regions:
        rows = 1 if r.per_page else layout.page_size
        for row in range(rows):
            owner[r.offset + row * r.row_stride: r.offset + row * r.row_stride + r.nbytes] += 1
    assert torch.equal(owner, torch.ones_like(owner))
    offsets = [r.offset for r in layout.regions]
    assert offsets == sorted(offsets)
    row_regions = [r for r in layout.regions if not r.per_page]
    assert [r.row_offset for r in row_regions] == [sum(x.nbytes for x in row_regions[:i]) for i in range(len(row_regions))]
    assert sum(r.nbytes for r in row_regions) == layout.row_bytes
    roles = [r.role for r in row_regions]
    assert roles.index("data") == 0 and ("scale" not in roles or roles.index("scale") > roles.index("data"))


def test_slot_offsets_worked_examples():
    assert kvf.Fp8DsMla().slot_offsets(70) == {"nope": 40896, "rope": 41344, "scale": 74352, "scale_pad": 74359}
    hca = kvf.Fp8DsMla(page_size=2).slot_offsets(3)
    assert (hca["nope"], hca["scale"]) == (2304, 2888)
    ind = kvf.Fp8Indexer().slot_offsets(70)
    assert (ind["values"], ind["scale"]) == (9216, 16664)
    # The scale region depends on rows per page, not on the page stride.
    assert kvf.Fp8DsMla().slot_offsets(70, page_stride=40000)["scale"] == 40000 + 36864 + 6 * 8


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_views_shapes_dtypes_and_aliasing(layout):
    cache = layout.allocate(3, page_stride=layout.allocate(1).stride(0) + 64)
    assert cache.stride(0) == layout.allocate(1).stride(0) + 64
    views = layout.views(cache)
    assert list(views) == [r.name for r in layout.regions]
    for r in layout.regions:
        v = views[r.name]
        if r.per_page:
            assert (v.dtype, tuple(v.shape)) == (torch.uint8, (3, r.nbytes))
            continue
        assert v.dtype == getattr(torch, r.dtype) and tuple(v.shape) == (3, layout.page_size, *r.shape)
        assert v.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    # Writing through a view shows up in gather, at the region's place in the gathered row.
    slot = 2 * layout.page_size + layout.page_size - 1
    for r in layout.regions:
        if r.per_page:
            continue
        raw = views[r.name][2, layout.page_size - 1].view(torch.uint8)
        raw.copy_(torch.arange(1, r.nbytes + 1, dtype=torch.int32).to(torch.uint8))
    row = layout.gather(cache, torch.tensor([slot]))[0]
    for r in layout.regions:
        if not r.per_page:
            want = torch.arange(1, r.nbytes + 1, dtype=torch.int32).to(torch.uint8)
            assert torch.equal(row[r.row_offset:r.row_offset + r.nbytes], want), r.name
    assert int(layout.gather(cache, torch.tensor([slot - 1]))[0].count_nonzero()) == 0


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_allocate_honours_page_stride(layout):
    page_elems = layout.allocate(1).stride(0)
    plain = layout.allocate(2)
    assert tuple(plain.shape) == layout.cache_shape(2) and plain.is_contiguous()
    assert plain.dtype == layout.container_dtype and int(plain.count_nonzero()) == 0
    padded = layout.allocate(3, page_stride=page_elems + 12)
    assert padded.stride(0) == page_elems + 12 and tuple(padded.shape) == layout.cache_shape(3)
    assert int(padded.count_nonzero()) == 0
    with pytest.raises(kvf.LayoutError, match=str(page_elems)):
        layout.allocate(2, page_stride=page_elems - 1)
    with pytest.raises(kvf.LayoutError, match="num_pages"):
        layout.allocate(-1)
    assert tuple(layout.allocate(0).shape) == layout.cache_shape(0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_describe_mentions_every_region(layout):
    text = layout.describe()
    assert layout.name in text and str(layout.row_bytes) in text and str(layout.page_bytes) in text
    for r in layout.regions:
        assert r.name in text and r.dtype in text and str(r.offset) in text


def test_params_round_trip_through_get_format():
    for layout, *_ in GEOMETRY:
        assert kvf.get_format(layout.name, **layout.params) == layout


@pytest.mark.parametrize("cls, params, words", [
    (kvf.Fp8DsMla, dict(head_dim=512, rope_dim=60), ["multiple of 64", "rope_dim=60"]),
    (kvf.Fp8DsMla, dict(head_dim=64, rope_dim=64), ["positive multiple", "head_dim=64"]),
    (kvf.Fp8DsMla, dict(head_dim=130, rope_dim=1), ["even rope_dim", "rope_dim=1"]),
    (kvf.Fp8DsMla, dict(page_size=0), ["page_size", "0"]),
    (kvf.Fp8Indexer, dict(head_dim=96), ["multiple of 128", "96"]),
    (kvf.Mxfp4Indexer, dict(head_dim=48), ["multiple of 32", "48"]),
    (kvf.Mxfp4Indexer, dict(page_size=True), ["page_size", "True"]),
    (kvf.CompressorState, dict(ratio=8), ["ratio"]),
    (kvf.CompressorState, dict(head_dim=-1), ["head_dim", "-1"]),
], ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_impossible_params_raise_layout_error(cls, params, words):
    with pytest.raises(kvf.LayoutError) as info:
        cls(**params)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_impossible_params_are_layout_errors_via_get_format():
    for name, params in [("compressor_state", dict(ratio=8)), ("fp8_ds_mla", dict(rope_dim=3)),
                         ("fp8_indexer", dict(bogus=1))]:
        with pytest.raises(kvf.LayoutError):
            kvf.get_format(name, **params)


@pytest.mark.parametrize("n", [1, 2])
def test_fp8_ds_mla_odd_row_bytes_round_trip(n):
    """head 192 / rope 64 (spec/upstream.md §12 B) has 259-byte rows: the bf16 RoPE tail sits at an odd
    row stride, so it must be moved as bytes, not through a bf16 view of the row tensor."""
    lay = kvf.Fp8DsMla(head_dim=192, rope_dim=64, page_size=1)
    x = (((torch.arange(192) * 13) % 29 - 14) * 0.125).repeat(n, 1)
    cache = lay.allocate(n)
    lay.encode(x, cache, torch.arange(n))
    out = lay.decode(cache, torch.arange(n))
    assert torch.equal(out[:, 128:], x[:, 128:].to(torch.bfloat16))
