"""dump / diff / check / diagrams: derived from the layouts, tested on every format."""

import pytest
import torch

import kvformats as kvf
from kvformats.caches.check import check, scale_exponent_range
from kvformats.caches.diff import diff_caches
from kvformats.caches.hexdump import hexdump_page, json_number, page_lines, slot_record
from kvformats.spec.diagram import layout_svg

def small(name):
    """The format's declared small layout (``Layout.examples.small_params``)."""
    return kvf.get_format(name, **type(kvf.get_format(name)).examples.small_params)


def filled(layout, pages=3, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = layout.allocate(pages)
    slots = torch.arange(1, 1 + 2 * layout.page_size)
    n = slots.numel()
    if layout.name == "compressor_state":
        w = layout.width
        layout.encode((torch.randn(n, w, generator=g), torch.randn(n, w, generator=g)), cache, slots,
                      positions=torch.arange(n), ape=torch.randn(layout.ratio, w, generator=g))
    elif layout.name == "compressor_state_v41":
        w = layout.width
        layout.encode((torch.randn(n, w, generator=g), torch.randn(n, w, generator=g)), cache, slots)
    else:
        layout.encode(torch.randn(n, layout.head_dim, generator=g) * scale, cache, slots)
    return cache, slots


def raw_bytes(cache):
    return cache.view(torch.uint8).reshape(-1) if cache.dtype != torch.uint8 else cache.reshape(-1)


@pytest.mark.parametrize("name", kvf.list_formats())
def test_hexdump_covers_every_page_byte_once(name):
    layout = small(name)
    cache, _ = filled(layout)
    lines = page_lines(layout, cache, 1)
    covered = []
    for line in lines:
        n = len(bytes.fromhex(line["hex"].replace(" ", "")))
        covered.extend(range(line["offset"], line["offset"] + n))
        assert line["region"] in line["label"]
    assert covered == list(range(layout.page_bytes))
    page = raw_bytes(cache)[layout.page_bytes: 2 * layout.page_bytes]
    assert bytes.fromhex("".join(l["hex"].replace(" ", "") for l in lines)) == bytes(page.tolist())
    assert hexdump_page(layout, cache, 1).count("\n") == len(lines)


@pytest.mark.parametrize("name", kvf.list_formats())
def test_slot_record_matches_decode_and_gather(name):
    layout = small(name)
    cache, slots = filled(layout)
    slot = int(slots[3])
    rec = slot_record(layout, cache, slot)
    gathered = layout.gather(cache, torch.tensor([slot]))[0]
    assert bytes.fromhex("".join(r["hex"] for r in rec["regions"])) == bytes(gathered.tolist())
    decoded = layout.decode(cache, torch.tensor([slot]))
    decoded = torch.cat(decoded, dim=1) if isinstance(decoded, tuple) else decoded
    values = torch.tensor([v for r in rec["regions"] if r["role"] == "data" for v in r["values"]])
    assert torch.equal(values.to(decoded.dtype), decoded[0])


@pytest.mark.parametrize("profile", ["tokenspeed", "ocp"])
def test_slot_record_reads_scale_ff_as_the_profile(profile):
    """A scale byte 0xFF shows as decode reads it: +Inf under tokenspeed, NaN under ocp."""
    layout = kvf.Mxfp4Indexer(page_size=4, profile=profile)
    cache, slots = filled(layout)
    slot = int(slots[0])
    page, row = divmod(slot, layout.page_size)
    scales = layout.region("scale")
    raw_bytes(cache)[page * layout.page_bytes + scales.offset + row * scales.row_stride] = 0xFF
    rec = {r["name"]: r["values"] for r in slot_record(layout, cache, slot)["regions"]}
    want = [json_number(v) for v in layout.decode(cache, torch.tensor([slot]))[0, :32].tolist()]
    assert rec["scale"][0] == ("inf" if profile == "tokenspeed" else "nan")
    assert rec["values"][:32] == want and ("inf" in want or "-inf" in want) == (profile == "tokenspeed")


@pytest.mark.parametrize("name", kvf.list_formats())
def test_check_passes_written_caches_and_flags_each_rule(name):
    layout = small(name)
    cache, _ = filled(layout, scale=1e30)
    assert check(layout, cache)["ok"]
    pristine = cache.clone()
    for region in layout.regions:
        bad = cache.clone()
        b = raw_bytes(bad)
        end = layout.page_bytes + region.offset + (0 if region.per_page else region.row_stride) + region.nbytes
        b[end - min(2, region.nbytes):end] = 0xFF  # the top two bytes: NaN for bf16/float32 values
        report = check(layout, bad)
        expect_ok = region.dtype == "float4_e2m1fn_x2"  # 0xFF = two valid -6 codes
        assert report["ok"] is expect_ok, (region.name, report["rules"])
        if not expect_ok:
            assert report["bad_pages"][0]["page"] == 1
    assert torch.equal(cache, pristine)  # each corruption went into a clone, never the clean cache
    assert check(layout, cache)["ok"]


def test_scale_ranges_follow_the_rules():
    assert scale_exponent_range(kvf.Fp8DsMla()) == (-22, 120)  # bytes 105..247, spec/upstream.md §2.2
    assert scale_exponent_range(kvf.Mxfp4Indexer()) == (-15, 126)
    assert scale_exponent_range(kvf.Fp8Indexer()) == (-33, 120)
    assert scale_exponent_range(kvf.CompressorState()) is None


def test_check_extreme_finite_inputs_stay_in_range():
    layout = kvf.Fp8DsMla(page_size=2)
    cache = layout.allocate(1)
    big = torch.full((1, 512), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    tiny = torch.zeros((1, 512), dtype=torch.bfloat16)
    layout.encode(torch.cat([big, tiny]), cache, torch.tensor([0, 1]))
    scales = layout.views(cache)["scale"].view(torch.uint8)[0, :, 0].tolist()
    assert scales == [247, 105]
    assert check(layout, cache)["ok"]


@pytest.mark.parametrize("name", kvf.list_formats())
def test_diff_counts_and_locates(name):
    layout = small(name)
    a, _ = filled(layout)
    assert diff_caches(layout, a, a.clone())["equal"]
    b = a.clone()
    region = layout.regions[0]
    raw_bytes(b)[2 * layout.page_bytes + region.offset + region.row_stride] ^= 0x01
    report = diff_caches(layout, a, b)
    assert not report["equal"]
    assert report["regions"][region.name]["bytes_differ"] == 1
    first = report["first"][0]
    assert (first["region"], first["page"], first["row"], first["byte"]) == (region.name, 2, 1, 0)
    assert first["a"] != first["b"]


@pytest.mark.parametrize("name", kvf.list_formats())
def test_diagram_names_every_region(name):
    layout = kvf.get_format(name)
    svg = layout_svg(layout)
    assert svg.startswith("<svg") and svg.endswith("</svg>\n")
    for region in layout.regions:
        if not region.per_page:
            assert f">{region.name}: [{region.row_offset}, {region.row_offset + region.nbytes})" in svg
    assert f"page: {layout.page_bytes} B" in svg
    assert layout_svg(layout) == svg


@pytest.mark.parametrize("kind, width, value", [("e4m3", 8, 0x7F), ("e2m1", 4, 0x8)])
def test_word_wise_code_checks_equal_byte_wise(kind, width, value):
    from kvformats.caches.check import _bad_codes

    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (64, 8, 16), dtype=torch.uint8, generator=g)
    raw[raw == 0x7F] = 0  # start clean of e4m3 NaN codes, then plant codes at every byte position
    for i in range(16):
        raw[i, i % 8, i] = 0xFF if kind == "e4m3" else 0x80 | (i % 8)
        raw[16 + i, i % 8, i] = 0x7F if kind == "e4m3" else 0x08 | ((i % 7 + 1) << 4)
    if kind == "e2m1":
        raw[(raw & 0xF) == 8] ^= 1
        raw[(raw >> 4) == 8] ^= 0x10
        for i in range(16):
            raw[i, i % 8, i] = 0x80 | (i % 8)
            raw[16 + i, i % 8, i] = 0x08 | ((i % 7) << 4)
    bytewise = ((raw & 0x7F) == 0x7F) if kind == "e4m3" else (((raw & 0xF) == 8) | ((raw >> 4) == 8))
    wordwise = _bad_codes(raw, kind)
    assert wordwise.shape == (64, 8, 2)
    assert torch.equal(wordwise, bytewise.reshape(64, 8, 2, 8).any(-1))
    assert int(bytewise.sum()) >= 32  # the planted codes are there
    odd = raw[:, :, 1:9]  # a view no int64 word fits: the byte-wise path
    assert torch.equal(_bad_codes(odd, kind), bytewise[:, :, 1:9])
