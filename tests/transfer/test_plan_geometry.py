"""Plans across page geometries (issue 45): a request's token rows move between pages of other
sizes, strides, pads and arena layouts, each layout segment (the page-tail scale rows among them)
to its own place on the destination page; the checksums compare chunk by chunk of token rows;
bad plans are typed errors before any byte moves; the hidden corruptions are caught and named."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvformats as kvf
from kvformats.errors import HandshakeError, InputError, InputTypeError, IntegrityError
from kvformats.formats import CompressorState, Fp8DsMla, Mxfp4Indexer
from kvformats.layout import storage_bytes
from kvformats.transfer import describe_caches, expected_checksums, handshake, plan_transfer, verify
from kvformats.transfer.checksum import row_checksums
from kvformats.transfer.geometry import Ring
from tests.harness.plan_apply import apply


def layouts(page: int) -> dict:
    return {"kv": Fp8DsMla(head_dim=128, rope_dim=64, page_size=page),
            "index": Mxfp4Indexer(head_dim=128, page_size=page),
            "state": CompressorState(head_dim=8, ratio=4, page_size=page)}


def caches(page: int, pages: int, seed: int | None = None, *, arena: bool = False, stride_pad: int = 0) -> dict:
    """kv, index and state caches of ``pages`` pages of ``page`` rows: random bytes for a seed,
    zeros otherwise. ``arena``: kv and index are fields of one strided arena; ``stride_pad``:
    that many more bytes between the kv pages (another page stride)."""
    lay = layouts(page)
    if arena:
        stride = lay["kv"].page_bytes + lay["index"].page_bytes + stride_pad
        buf = torch.zeros(pages * stride, dtype=torch.uint8)
        out = {"kv": (lay["kv"], buf.as_strided((pages, lay["kv"].page_bytes), (stride, 1), 0)),
               "index": (lay["index"], buf.as_strided((pages, lay["index"].page_bytes), (stride, 1),
                                                     lay["kv"].page_bytes))}
    else:
        kv = lay["kv"].allocate(pages, page_stride=lay["kv"].page_bytes + stride_pad if stride_pad else None)
        out = {"kv": (lay["kv"], kv), "index": (lay["index"], lay["index"].allocate(pages))}
    out["state"] = (lay["state"], lay["state"].allocate(pages))
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for layout, cache in out.values():
            u8 = storage_bytes(cache)
            u8.copy_(torch.randint(0, 256, u8.shape, generator=g, dtype=torch.uint8))
    return out




def slots(pages, page: int, positions: torch.Tensor, ring: bool = False) -> torch.Tensor:
    """The slots of request rows ``positions`` through the request's ``pages`` (a ring: position
    p at ring row p mod len(pages) * page)."""
    pages = torch.as_tensor(pages)
    index = positions // page
    return pages[index % pages.numel() if ring else index] * page + positions % page


def rows_of(caches_, name, pages, page, positions, ring=False):
    layout, cache = caches_[name]
    return layout.gather(cache, slots(pages, page, positions, ring))


SRC_PAGES = {"kv": [5, 2, 0], "index": [5, 2, 0], "state": [1, 3, 4]}


def dst_pages(page: int, n: int = 150) -> list[int]:
    count = -(-n // page)
    return torch.randperm(12, generator=torch.Generator().manual_seed(page))[:count].tolist()


@pytest.mark.parametrize("dst_page", [32, 128, 48, 16])
def test_rows_land_at_their_place_in_pages_of_another_size(dst_page):
    """Prefill pages of 64 rows, decode pages of 32, 128, 48 or 16: each of the request's 150
    rows decodes to the same record at the destination, scale rows in the destination page's
    own tail; no other byte of the destination changes; verify passes."""
    src, dst = caches(64, 6, seed=1), caches(dst_page, 12)
    before = {name: storage_bytes(c).clone() for name, (_, c) in dst.items()}
    there = {name: dst_pages(dst_page) for name in src}
    plan = plan_transfer(describe_caches(src), describe_caches(dst), SRC_PAGES, there, tokens=150)
    sums = expected_checksums(plan, src)
    apply(plan, src, dst)
    verify(plan, dst, sums)
    t = torch.arange(150)
    for name in src:
        assert torch.equal(rows_of(dst, name, there[name], dst_page, t), rows_of(src, name, SRC_PAGES[name], 64, t))
        layout, cache = dst[name]
        inside = torch.zeros(storage_bytes(cache).numel(), dtype=torch.bool)
        for s in slots(there[name], dst_page, t).tolist():
            for offset, n in ((o, layout.region(r).nbytes) for r, o in layout.slot_offsets(s).items()):
                inside[offset:offset + n] = True
        changed = storage_bytes(cache) != before[name]
        assert not (changed & ~inside).any(), name  # nothing outside the request's records moved
    scale = dst["kv"][0].region("scale")
    page, row = there["kv"][70 // dst_page], 70 % dst_page
    got = dst["kv"][1][page, scale.offset + row * scale.row_stride]
    want = src["kv"][1][SRC_PAGES["kv"][70 // 64], src["kv"][0].region("scale").offset + (70 % 64) * scale.row_stride]
    assert got == want  # token 70's scale row, in its destination page's tail


def test_strides_pads_and_arenas_may_differ_at_one_page_size():
    """Same rows per page, another page stride and arena layout (strided arena here, separate
    caches there): whole pages of a cache move, or with a pad that differs, their rows."""
    src, dst = caches(32, 8, seed=2, arena=True), caches(32, 9, stride_pad=64)
    with pytest.raises(HandshakeError, match="page_stride differs"):
        handshake(describe_caches(src), describe_caches(dst))
    handshake(describe_caches(src), describe_caches(dst), geometry=True)
    pages = {name: [1, 6, 3] for name in src}
    there = {name: [8, 0, 4] for name in src}
    plan = plan_transfer(describe_caches(src), describe_caches(dst), pages, there)
    apply(plan, src, dst)
    verify(plan, dst, expected_checksums(plan, src))
    t = torch.arange(96)
    for name in src:
        assert torch.equal(rows_of(dst, name, there[name], 32, t), rows_of(src, name, pages[name], 32, t))
    with pytest.raises(HandshakeError, match="page_stride differs"):  # whole physical pages need one geometry
        plan_transfer(describe_caches(src), describe_caches(dst), pages, there, whole_pages=True)


def test_a_wider_page_pad_moves_rows_not_pages():
    layout = Fp8DsMla(head_dim=128, rope_dim=64, page_size=32)
    src = {"kv": (layout, torch.randint(0, 256, (4, layout.page_bytes), dtype=torch.uint8))}
    wide = torch.zeros(4, layout.page_bytes + 256, dtype=torch.uint8)  # a wider page: its own pad
    dst = {"kv": (layout, wide)}
    plan = plan_transfer(describe_caches(src), describe_caches(dst), {"kv": [0, 2]}, {"kv": [3, 1]})
    assert plan.nbytes == 64 * layout.row_bytes  # the rows of both pages, no pad
    apply(plan, src, dst)
    verify(plan, dst, expected_checksums(plan, src))
    assert not wide[:, layout.min_page_bytes:].any()


def test_segments_coalesce_where_runs_are_contiguous_on_both_sides():
    src, dst = caches(64, 4, seed=3), caches(32, 8)
    plan = plan_transfer(describe_caches(src), describe_caches(dst), {n: [0, 1, 2] for n in src},
                         {n: list(range(6)) for n in src}, tokens=192)
    table = {r["cache"]: r for r in plan.table()}
    # the state has one segment and no pad: consecutive pages on both sides are one run
    assert table["state"]["segments_before"] == 6 and table["state"]["segments"] == 1
    # kv: token records and scale records per chunk; a 64-row source page's two halves go to two
    # destination pages with scales between them, so only the source side is contiguous
    assert table["kv"]["segments_before"] == 12 and table["kv"]["segments"] == 12
    assert plan.segments_before == 30 and plan.nbytes == 192 * sum(layouts(64)[n].row_bytes for n in src)
    scattered = plan_transfer(describe_caches(src), describe_caches(dst), {n: [2, 0, 1] for n in src},
                              {n: [5, 3, 1, 0, 4, 2] for n in src}, tokens=192)
    assert scattered.caches["state"].src.shape[0] == 6


def test_a_ring_maps_position_p_to_ring_row_p_mod_its_length():
    """A compressor-state ring of 2 pages of 64 rows (128 rows) to one of 5 pages of 32 (160):
    the last 100 positions of 300, each at its own side's ring row."""
    src, dst = caches(64, 6, seed=4), caches(32, 12)
    ring_src, ring_dst = [4, 1], [7, 2, 9, 0, 5]
    plan = plan_transfer(describe_caches(src), describe_caches(dst), {"state": ring_src}, {"state": ring_dst},
                         rows={"state": Ring(300, 100)})
    apply(plan, src, dst)
    verify(plan, dst, expected_checksums(plan, src))
    p = torch.arange(200, 300)
    assert torch.equal(rows_of(dst, "state", ring_dst, 32, p, ring=True),
                       rows_of(src, "state", ring_src, 64, p, ring=True))
    assert int(plan.caches["state"].row_map.rows[0, 0]) == 200
    with pytest.raises(InputError, match="a window of 140 rows does not fit the source's ring of 2 pages"):
        plan_transfer(describe_caches(src), describe_caches(dst), {"state": ring_src}, {"state": ring_dst},
                      rows={"state": Ring(300, 140)})
    with pytest.raises(InputTypeError, match="Ring.tokens"):
        Ring(-1, 4)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_any_geometry_moves_exactly_its_rows(data):
    """Random page sizes on each side, page lists, row ranges: each moved row equals its source,
    every other row of the destination is still zero, verify passes."""
    ps, pd = data.draw(st.sampled_from([8, 16, 24, 32])), data.draw(st.sampled_from([8, 16, 24, 32, 40]))
    start = data.draw(st.integers(0, 60), label="start")
    stop = data.draw(st.integers(start + 1, 96), label="stop")
    sp = data.draw(st.permutations(range(12)), label="src")[:-(-stop // ps)]
    dp = data.draw(st.permutations(range(14)), label="dst")[:-(-stop // pd)]
    src, dst = caches(ps, 12, seed=ps), caches(pd, 14)
    plan = plan_transfer(describe_caches(src), describe_caches(dst), {n: sp for n in src}, {n: dp for n in src},
                         rows={"kv": (start, stop), "index": stop, "state": (start, stop)})
    apply(plan, src, dst)
    verify(plan, dst, expected_checksums(plan, src))
    t = torch.arange(-(-stop // pd) * pd)
    for name in src:
        first = 0 if name == "index" else start
        moved = (t >= first) & (t < stop)
        got = rows_of(dst, name, dp, pd, t)
        assert torch.equal(got[moved], rows_of(src, name, sp, ps, t[moved])), name
        assert not got[~moved].any(), name


def test_the_handshake_allows_another_geometry_of_one_record_only():
    here = describe_caches(caches(64, 2))
    there = describe_caches(caches(32, 4))
    with pytest.raises(HandshakeError, match="'kv': params differs"):
        handshake(here, there)  # strict by default: whole pages need equal pages
    handshake(here, there, geometry=True)
    wide = {**caches(32, 4), "kv": (Fp8DsMla(head_dim=256, rope_dim=64, page_size=32),
                                    Fp8DsMla(head_dim=256, rope_dim=64, page_size=32).allocate(2))}
    with pytest.raises(HandshakeError) as err:
        handshake(here, describe_caches(wide), geometry=True)
    assert str(err.value).startswith("cache 'kv': record identity differs (params): here fp8_ds_mla(head_dim=128, "
                                     "profile=tokenspeed, rope_dim=64) record fp8_ds_mla(head_dim=128, rope_dim=64) "
                                     "(V4, 194 B/token, head_dim 128, page-tail scales), at the peer")
    assert "at the peer fp8_ds_mla(head_dim=256, profile=tokenspeed, rope_dim=64)" in str(err.value)
    vllm = {**caches(32, 4), "kv": (Fp8DsMla(head_dim=128, rope_dim=64, page_size=32, profile="vllm"),
                                    Fp8DsMla(head_dim=128, rope_dim=64, page_size=32, profile="vllm").allocate(2))}
    with pytest.raises(HandshakeError, match=r"record identity differs \(params\).*profile=vllm"):
        handshake(here, describe_caches(vllm), geometry=True)


def test_another_record_of_the_same_size_is_refused_across_geometries_naming_both():
    planar, interleaved = kvf.Fp8DsMlaV41(page_size=4), kvf.Fp8DsMlaV41Interleaved(page_size=8)
    a = describe_caches({"swa": (planar, planar.allocate(4))})
    b = describe_caches({"swa": (interleaved, interleaved.allocate(2))})
    with pytest.raises(HandshakeError) as err:
        plan_transfer(a, b, {"swa": [0]}, {"swa": [1]}, tokens=4)
    message = str(err.value)
    assert "record differs at the same 528 bytes per token" in message
    assert "dsv41-fp8-528-planar" in message and "dsv41-fp8-528-interleaved" in message


def test_rows_are_required_and_checked_before_anything_moves():
    src, dst = caches(64, 6, seed=5), caches(32, 4)
    descs = describe_caches(src), describe_caches(dst)
    before = {name: storage_bytes(c).clone() for name, (_, c) in dst.items()}
    pages, there = {"kv": [0, 1]}, {"kv": [0, 1, 2, 3]}
    sub = {"kv": descs[0]["kv"]}, {"kv": descs[1]["kv"]}
    with pytest.raises(InputError, match=r"pages hold 64 and 32 rows: whole pages cannot move between them; give the "
                                         r"request's rows \(rows=\{'kv': n\} or tokens=n\)"):
        plan_transfer(*sub, pages, there)
    with pytest.raises(InputError, match=r"rows \[0, 129\) run past the source's capacity: the request has 2 pages "
                                         r"of 64 rows there \(128 rows\)"):
        plan_transfer(*sub, pages, there, tokens=129)
    with pytest.raises(InputError, match=r"rows \[0, 100\) run past the destination's capacity: the request has 3 "
                                         r"pages of 32 rows there \(96 rows\)"):
        plan_transfer(*sub, pages, {"kv": [3, 2, 1]}, tokens=100)
    with pytest.raises(InputError, match="names page 4, beyond the cache's 4 pages"):
        plan_transfer(*sub, pages, {"kv": [0, 1, 2, 4]}, tokens=100)
    with pytest.raises(InputTypeError, match="tokens must be a positive int"):
        plan_transfer(*sub, pages, there, tokens=True)
    with pytest.raises(InputError, match="no row range"):
        plan_transfer(*sub, pages, there, rows={"kv": (5, 5)})
    for name, (_, c) in dst.items():
        assert torch.equal(storage_bytes(c), before[name])


def test_destination_rows_that_overlap_are_refused():
    """Two caches over one buffer at the destination (a wrong arena): their rows would share bytes."""
    layout = Fp8DsMla(head_dim=128, rope_dim=64, page_size=32)
    buf = torch.zeros(5 * layout.page_bytes, dtype=torch.uint8)
    dst = {"a": (layout, buf.as_strided((4, layout.page_bytes), (layout.page_bytes, 1), 0)),
           "b": (layout, buf.as_strided((4, layout.page_bytes), (layout.page_bytes, 1), layout.page_bytes))}
    big = Fp8DsMla(head_dim=128, rope_dim=64, page_size=64)
    src = {"a": (big, big.allocate(2)), "b": (big, big.allocate(2))}
    with pytest.raises(InputError, match="destination segments overlap in storage of 'a'"):
        plan_transfer(describe_caches(src), describe_caches(dst), {"a": [0], "b": [1]}, {"a": [1, 2], "b": [0, 1]},
                      tokens=64)
    assert not buf.any()


def test_a_peer_lying_about_its_rows_per_page_is_refused():
    src, dst = describe_caches(caches(64, 2)), describe_caches(caches(32, 4))
    lying = dict(dst, kv=attrs.evolve(dst["kv"], page_size=64))
    with pytest.raises(HandshakeError, match="page_size = 64, but fp8_ds_mla with these params has 32"):
        plan_transfer(src, lying, {"kv": [0]}, {"kv": [0, 1]}, tokens=64)


def test_chunk_checksums_do_not_depend_on_the_page():
    """One chunk of rows, at another page and row on each side, has one checksum."""
    src, dst = caches(64, 4, seed=6), caches(32, 8)
    plan = plan_transfer(describe_caches(src), describe_caches(dst), {"kv": [3, 1]}, {"kv": [6, 0, 2, 5]}, tokens=128)
    apply(plan, src, dst)
    m = plan.caches["kv"].row_map
    a = row_checksums(src["kv"][0], src["kv"][1], *m.page_rows("src"))
    b = row_checksums(dst["kv"][0], dst["kv"][1], *m.page_rows("dst"))
    assert torch.equal(a, b) and a.shape == (4, 4, 2) and (a != 0).all()


# ----- the hidden corruptions -------------------------------------------------------------------
def moved(dst_page: int = 32):
    src, dst = caches(64, 6, seed=7), caches(dst_page, 12)
    there = {name: dst_pages(dst_page) for name in src}
    plan = plan_transfer(describe_caches(src), describe_caches(dst), SRC_PAGES, there, tokens=150)
    sums = expected_checksums(plan, src)
    apply(plan, src, dst)
    return plan, src, dst, there, sums


def test_rows_swapped_across_a_page_boundary_are_caught_and_named():
    """Rows 31 and 32 of the request (the last of one destination page, the first of the next)
    swapped in every region: each region's stream is still the same bytes, just elsewhere."""
    plan, src, dst, there, sums = moved()
    layout, cache = dst["kv"]
    a, b = slots(there["kv"], 32, torch.tensor([31, 32])).tolist()
    for region in layout.regions:
        if region.per_page:
            continue
        oa, ob, n = layout.slot_offsets(a)[region.name], layout.slot_offsets(b)[region.name], region.nbytes
        u8 = storage_bytes(cache)
        ra, rb = u8[oa:oa + n].clone(), u8[ob:ob + n].clone()
        u8[oa:oa + n], u8[ob:ob + n] = rb, ra
    with pytest.raises(IntegrityError) as err:
        verify(plan, dst, sums)
    assert str(err.value).startswith(f"cache 'kv': token rows [0, 32) (page {there['kv'][0]} rows [0, 32) here, "
                                     f"sender's page 5 rows [0, 32)) differ in region 'nope' after the transfer "
                                     f"(2 of 5 row ranges differ)")


def test_a_scale_row_in_the_wrong_page_tail_is_caught_and_named():
    """Token 70's scale row written to the tail of the destination page before its own (the
    offset it has within a 64-row source page, at a 32-row destination page's tail)."""
    plan, src, dst, there, sums = moved()
    layout, cache = dst["kv"]
    scale = layout.region("scale")
    own, wrong = there["kv"][70 // 32], there["kv"][70 // 32 - 1]
    row = 70 % 32
    cache[wrong, scale.offset + row * scale.row_stride] = cache[own, scale.offset + row * scale.row_stride]
    cache[own, scale.offset + row * scale.row_stride] ^= 0x01  # and its own place holds something else
    with pytest.raises(IntegrityError) as err:
        verify(plan, dst, sums)
    assert str(err.value).startswith(f"cache 'kv': token rows [32, 64) (page {wrong} rows [0, 32) here, sender's "
                                     f"page 5 rows [32, 64)) differ in region 'scale'")
    assert "(2 of 5 row ranges differ)" in str(err.value)


def test_files_of_both_sides_compare_row_for_row(tmp_path):
    from kvformats.caches.diff import diff_caches
    from kvformats.caches.files import load_caches
    from kvformats.transfer import save_request_pages

    plan, src, dst, there, sums = moved(dst_page=48)
    save_request_pages(tmp_path / "a.safetensors", plan, src, side="src")
    save_request_pages(tmp_path / "b.safetensors", plan, dst, side="dst")
    a, b = load_caches(tmp_path / "a.safetensors"), load_caches(tmp_path / "b.safetensors")
    for name in src:
        assert a[name].layout.page_size == 64 and diff_caches(a[name].layout, a[name].cache, b[name].cache)["equal"]
    layout, cache = dst["index"]
    cache[there["index"][2], layout.region("scale").offset + 4 * (100 - 96) + 1] ^= 0x10  # token 100
    save_request_pages(tmp_path / "c.safetensors", plan, dst, side="dst")
    c = load_caches(tmp_path / "c.safetensors")["index"]
    report = diff_caches(a["index"].layout, a["index"].cache, c.cache)
    assert report["regions"]["scale"]["bytes_differ"] == 1 and report["first"][0]["page"] == 1  # row 100: page 1


def test_the_benchmark_moves_the_same_rows_at_every_decode_page_size():
    """benchmarks/transfer_geometry.py's request: the SWA window and compressor-state windows as
    rings, every compressed row; the same bytes whatever the decode side's page size."""
    from benchmarks import transfer_geometry as geo

    caches_, pages, rows = geo.stack(1024, 2, 64, seed=0)
    sizes = {}
    for page in (64, 32, 128):
        far, far_pages, _ = geo.stack(1024, 2, page, seed=1)
        plan = plan_transfer(describe_caches(caches_), describe_caches(far), pages, far_pages, rows=rows)
        sizes[page] = plan.nbytes
        apply(plan, caches_, far)
        verify(plan, far, expected_checksums(plan, caches_))
    assert len(set(sizes.values())) == 1
    row = dict(engine="nixl", tokens=1024, src_page=64, dst_page=32, bytes=1, segments_before=2, segments=1,
               plan_ms=1.0, whole_verified_ms=3.0, first_layer_verified_ms=1.0, all_layers_verified_ms=2.0,
               **{"GB/s plan": 1.0, "GB/s contiguous": 2.0, "GB/s in-process copy": 3.0})
    assert len(geo.table([row, row]).splitlines()) == 4
    chart = geo.svg([row, row])
    assert chart.startswith("<svg") and chart.count("<rect") == 5 + 5 * 2 and "nixl 1k, 64 → 32" in chart
