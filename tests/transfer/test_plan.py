"""Transfer plans, the handshake and the checksums, on one process: applying a plan with plain
torch copies (what an engine does with the segments) must move exactly the request's bytes."""

from __future__ import annotations

import json

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvformats.errors import HandshakeError, InputError, InputTypeError, IntegrityError
from kvformats.formats import CompressorState, Fp8DsMla, Mxfp4Indexer
from kvformats.layout import storage_bytes
from kvformats.transfer import (coalesce, describe_caches, expected_checksums, from_json, handshake, plan_transfer,
                                to_json, verify)
from tests.harness.plan_apply import apply

KV = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)
IDX = Mxfp4Indexer(head_dim=128, page_size=16)
STATE = CompressorState(head_dim=128, ratio=4, page_size=16)


def arena(pages: int, seed: int | None, device="cpu"):
    """kv and indexer fields of one strided arena (stride = both pages), plus a compressor state."""
    stride = KV.page_bytes + IDX.page_bytes
    buf = torch.zeros((pages - 1) * stride + stride, dtype=torch.uint8)
    state = STATE.allocate(pages)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        buf.copy_(torch.randint(0, 256, buf.shape, generator=g, dtype=torch.uint8))
        state.copy_(torch.randn(state.shape, generator=g))
    buf, state = buf.to(device), state.to(device)
    kv = buf.as_strided((pages, KV.page_bytes), (stride, 1), 0)
    idx = buf.as_strided((pages, IDX.page_bytes), (stride, 1), KV.page_bytes)
    return {"kv": (KV, kv), "index": (IDX, idx), "state": (STATE, state)}




def page_bytes(caches, name, pages):
    layout, cache = caches[name]
    return layout.byte_pages(cache)[0][torch.tensor(pages)]


SRC_PAGES = {"kv": [3, 4, 5, 0], "index": [3, 4, 5, 0], "state": [2, 3, 7, 1]}
DST_PAGES = {"kv": [6, 7, 8, 1], "index": [6, 7, 8, 1], "state": [4, 5, 0, 6]}


def test_whole_pages_move_exactly_and_coalesce():
    src, dst = arena(8, seed=1), arena(10, seed=None)
    plan = plan_transfer(describe_caches(src), describe_caches(dst), SRC_PAGES, DST_PAGES)
    apply(plan, src, dst)
    for name in SRC_PAGES:
        assert torch.equal(page_bytes(src, name, SRC_PAGES[name]), page_bytes(dst, name, DST_PAGES[name]))
    verify(plan, dst, expected_checksums(plan, src))
    # nothing else of the destination changed: restore the moved pages and compare
    for name in SRC_PAGES:
        layout, cache = dst[name]
        u8 = layout.byte_pages(cache)[0]
        u8[torch.tensor(DST_PAGES[name])] = 0
    assert all(not storage_bytes(c).any() for _, c in dst.values())
    kv = plan.caches["kv"]
    assert kv.segments_before == 4 and kv.src.shape[0] == 4  # arena fields: the other field lies between pages
    assert plan.caches["state"].src.shape[0] == 3  # state pages 2, 3 -> 4, 5 are adjacent on both sides
    assert plan.nbytes == 4 * (KV.page_bytes + IDX.page_bytes + STATE.page_bytes)


def test_arena_whole_pages_move_each_physical_page_once():
    src, dst = arena(8, seed=2), arena(10, seed=None)
    plan = plan_transfer(describe_caches(src), describe_caches(dst), SRC_PAGES, DST_PAGES, whole_pages=True)
    # an arena is named after its first member by name, whatever the insertion order
    assert set(plan.caches) == {"index", "state"} and plan.caches["index"].caches == ("kv", "index")
    assert plan.caches["index"].src.shape[0] == 2  # 3,4,5 -> 6,7,8 coalesce into one segment
    apply(plan, src, dst)
    verify(plan, dst, expected_checksums(plan, src))
    with pytest.raises(InputError, match="same pages"):
        plan_transfer(describe_caches(src), describe_caches(dst), {**SRC_PAGES, "index": [0, 1, 2, 3]},
                      DST_PAGES, whole_pages=True)
    with pytest.raises(InputError, match="every field of arena"):
        plan_transfer(describe_caches(src), describe_caches(dst), {"kv": [1]}, {"kv": [2]}, whole_pages=True)


def test_whole_pages_verify_every_row_of_fields_with_other_page_sizes():
    """An arena of an fp8_ds_mla field of 16 rows per page beside an MXFP4 indexer field of 64
    (issue 44 item 2): each field's checksum covers its own rows; before, every field was
    checked over the first field's rows [0, 16) and a change in row 40 of the index field passed."""
    index = Mxfp4Indexer(head_dim=128, page_size=64)

    def mixed(pages, seed):
        stride = KV.page_bytes + index.page_bytes
        buf = torch.zeros(pages * stride, dtype=torch.uint8)
        if seed is not None:
            buf.random_(0, 256, generator=torch.Generator().manual_seed(seed))
        return {"kv": (KV, buf.as_strided((pages, KV.page_bytes), (stride, 1), 0)),
                "index": (index, buf.as_strided((pages, index.page_bytes), (stride, 1), KV.page_bytes))}

    src, dst = mixed(4, seed=8), mixed(5, seed=None)
    pages = {"kv": [1, 3], "index": [1, 3]}
    there = {"kv": [4, 0], "index": [4, 0]}
    plan = plan_transfer(describe_caches(src), describe_caches(dst), pages, there, whole_pages=True)
    sums = expected_checksums(plan, src)
    apply(plan, src, dst)
    verify(plan, dst, sums)
    layout, cache = dst["index"]
    cache[0, layout.region("values").offset + 40 * 64 + 5] ^= 0x10  # row 40 of dst page 0 (request page 1)
    with pytest.raises(IntegrityError, match=r"cache 'index': page 0 \(sender's page 3, request page 1\) differs in "
                                             r"region 'values'"):
        verify(plan, dst, sums)
    (entry,) = plan.caches.values()
    assert entry.rows_of("kv").tolist() == [[0, 16]] * 2 and entry.rows_of("index").tolist() == [[0, 64]] * 2


def test_row_range_moves_only_those_rows():
    src, dst = arena(8, seed=3), arena(10, seed=None)
    rows = {"kv": (5, 40)}  # rows 5..15 of page 0, all of page 1, 0..7 of page 2; nothing of page 3
    plan = plan_transfer(describe_caches(src), describe_caches(dst), {"kv": [3, 4, 5, 0]}, {"kv": [6, 7, 8, 1]},
                         rows=rows)
    assert plan.caches["kv"].src_pages.tolist() == [3, 4, 5]
    assert plan.caches["kv"].nbytes == 35 * KV.row_bytes
    apply(plan, src, dst)
    got = KV.gather(dst["kv"][1], torch.arange(6 * 16, 9 * 16))
    want = KV.gather(src["kv"][1], torch.arange(3 * 16, 6 * 16))
    assert torch.equal(got[5:40], want[5:40]) and not got[:5].any() and not got[40:].any()
    verify(plan, dst, expected_checksums(plan, src))


def test_coalesce_merges_runs_contiguous_on_both_sides_only():
    src = torch.tensor([[0, 10], [10, 10], [20, 5], [100, 4]])
    dst = torch.tensor([[50, 10], [60, 10], [0, 5], [104, 4]])
    a, b = coalesce(src, dst)
    assert a.tolist() == [[0, 20], [20, 5], [100, 4]] and b.tolist() == [[50, 20], [0, 5], [104, 4]]


@pytest.mark.parametrize("src_pages, dst_pages, rows, match", [
    ({"kv": [8]}, {"kv": [0]}, None, "beyond the cache's 8 pages"),
    ({"kv": [0]}, {"kv": [10]}, None, "beyond the cache's 10 pages"),
    ({"kv": [0, 1]}, {"kv": [0]}, None, "2 source pages but 1 destination"),
    ({"kv": [0, 1]}, {"kv": [3, 3]}, None, "names a page twice"),
    ({"kv": [0]}, {"kv": [0]}, {"kv": (0, 17)}, "beyond the request"),
    ({"kv": [0]}, {"kv": [0]}, {"kv": (4, 4)}, "beyond the request"),
    ({"kv": [0]}, {"index": [0]}, None, "same caches"),
    ({"nope": [0]}, {"nope": [0]}, None, "no such cache"),
])
def test_bad_plans_are_refused(src_pages, dst_pages, rows, match):
    with pytest.raises(InputError, match=match):
        plan_transfer(describe_caches(arena(8, 0)), describe_caches(arena(10, None)), src_pages, dst_pages, rows=rows)


def test_bad_types_are_refused():
    a, b = describe_caches(arena(8, 0)), describe_caches(arena(10, None))
    with pytest.raises(InputTypeError):
        plan_transfer(a, b, {"kv": [0.0]}, {"kv": [1]})
    with pytest.raises(InputTypeError):
        plan_transfer(a, b, {"kv": torch.tensor([[0]])}, {"kv": [1]})
    with pytest.raises(InputTypeError):
        plan_transfer(a, b, {"kv": [0]}, {"kv": [1]}, rows={"kv": [0, 4]})


def test_overlapping_destination_segments_are_refused():
    """Two caches described over one storage whose pages overlap (a bad arena declaration)."""
    def overlapping():
        buf = torch.zeros(4 * KV.page_bytes, dtype=torch.uint8)
        return {"a": (KV, buf.as_strided((3, KV.page_bytes), (KV.page_bytes, 1), 0)),
                "b": (KV, buf.as_strided((3, KV.page_bytes), (KV.page_bytes, 1), 100))}

    src, dst = describe_caches(overlapping()), describe_caches(overlapping())
    with pytest.raises(InputError, match="overlap"):
        plan_transfer(src, dst, {"a": [0], "b": [0]}, {"a": [1], "b": [0]})


def test_handshake_names_the_difference():
    here = describe_caches(arena(8, 0))
    assert from_json(to_json(here)) == here
    handshake(here, from_json(to_json(describe_caches(arena(3, None)))))  # page counts may differ
    hca = CompressorState(head_dim=128, ratio=128, page_size=16)
    other = dict(here, state=describe_caches({"state": (hca, hca.allocate(2))})["state"])
    with pytest.raises(HandshakeError, match="'state': params differs"):
        handshake(here, other)
    wide = STATE.allocate(8, page_stride=STATE.page_bytes // 4 + 8)  # float32 elements: 8 more per page
    strided = describe_caches({**arena(8, 0), "state": (STATE, wide)})
    with pytest.raises(HandshakeError, match="'state': page_stride differs"):
        handshake(here, strided)
    with pytest.raises(HandshakeError, match="other caches"):
        handshake(here, {k: v for k, v in here.items() if k != "state"})
    fp = dict(here, kv=here["kv"].__class__(**{**here["kv"].to_json(), "fingerprint": "0" * 64}))
    with pytest.raises(HandshakeError, match="fingerprint"):
        handshake(here, fp)
    with pytest.raises(HandshakeError):
        from_json("[{\"name\": 1}]")
    bad = [dict(d.to_json(), num_pages="8") for d in here.values()]
    with pytest.raises(HandshakeError, match="num_pages = '8', not a non-negative int"):
        from_json(json.dumps(bad))
    with pytest.raises(HandshakeError, match="not JSON"):
        from_json("{")


def test_the_handshake_compares_every_field_with_its_full_message():
    """Each compared field alone differing fails the handshake with the whole message (a check
    of the prefix alone passed even when a field such as ``arena`` was ignored)."""
    here = describe_caches(arena(8, 0))
    changes = {"arena": ("kv", "kv"), "page_bytes": ("state", here["state"].page_bytes + 4),
               "page_stride": ("state", here["state"].page_stride + 64), "profile": ("kv", "vllm"),
               "page_size": ("index", 64), "fingerprint": ("index", "0" * 64)}
    for field, (name, theirs) in changes.items():
        other = dict(here, **{name: attrs.evolve(here[name], **{field: theirs})})
        with pytest.raises(HandshakeError) as err:
            handshake(here, other)
        assert str(err.value) == f"cache {name!r}: {field} differs: here {getattr(here[name], field)!r}, " \
                                 f"at the peer {theirs!r}"
    # the same caches, the index field in its own memory at the peer: the arenas differ
    split = describe_caches({**arena(8, 0), "index": (IDX, IDX.allocate(8, page_stride=KV.page_bytes +
                                                                       IDX.page_bytes))})
    with pytest.raises(HandshakeError) as err:
        handshake(here, split)
    assert str(err.value) == "cache 'kv': arena differs: here 'index', at the peer 'kv'"


def test_verify_names_cache_page_and_region_and_diff_shows_the_bytes(tmp_path):
    from kvformats.caches.diff import diff_caches
    from kvformats.caches.files import load_caches
    from kvformats.transfer import save_request_pages

    src, dst = arena(8, seed=4), arena(10, seed=None)
    plan = plan_transfer(describe_caches(src), describe_caches(dst), SRC_PAGES, DST_PAGES)
    sums = expected_checksums(plan, src)
    apply(plan, src, dst)
    dst["index"][1][7, IDX.region("scale").offset + 3] ^= 1  # dst page 7 = request page 1
    with pytest.raises(IntegrityError, match=r"cache 'index': page 7 \(sender's page 4, request page 1\) differs "
                                             r"in region 'scale'"):
        verify(plan, dst, sums)
    save_request_pages(tmp_path / "a.safetensors", plan, src, side="src")
    save_request_pages(tmp_path / "b.safetensors", plan, dst, side="dst")
    a, b = load_caches(tmp_path / "a.safetensors")["index"], load_caches(tmp_path / "b.safetensors")["index"]
    report = diff_caches(a.layout, a.cache, b.cache)
    assert not report["equal"] and report["regions"]["scale"]["bytes_differ"] == 1
    assert report["first"][0]["page"] == 1


def test_checksum_sees_one_byte_and_a_swap():
    from kvformats.transfer import reference_checksums

    cache = KV.allocate(2)
    cache.random_(0, 256, generator=torch.Generator().manual_seed(5))
    rows = torch.tensor([[0, 16], [0, 16]])
    base = reference_checksums(KV, cache, torch.tensor([0, 1]), rows)
    flipped = cache.clone()
    flipped[1, 200] ^= 0x80
    assert (reference_checksums(KV, flipped, torch.tensor([0, 1]), rows) != base).any(-1).nonzero().tolist() == [[1, 0]]
    swapped = cache.clone()
    swapped[0, 0], swapped[0, 1] = int(cache[0, 1]), int(cache[0, 0])
    if cache[0, 0] != cache[0, 1]:
        assert not torch.equal(reference_checksums(KV, swapped, torch.tensor([0]), rows[:1]), base[:1])


@pytest.mark.parametrize("include_pad", [False, True])
def test_triton_checksum_equals_the_torch_reference(include_pad):
    pytest.importorskip("triton")
    from kvformats.transfer import page_checksums

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the kernel runs in Triton's interpreter
    caches = arena(6, seed=6, device=dev)
    pages = torch.tensor([5, 0, 3])
    rows = torch.tensor([[0, 16], [3, 9], [15, 16]])
    for name, (layout, cache) in caches.items():
        want = page_checksums(layout, cache, pages, rows, include_pad=include_pad, backend="torch")
        got = page_checksums(layout, cache, pages, rows, include_pad=include_pad, backend="triton")
        assert torch.equal(got, want), name
        assert (want != 0).any()


def test_the_triton_checksum_refuses_a_cpu_cache_outside_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    from kvformats.errors import BackendUnavailableError
    from kvformats.transfer import page_checksums
    from kvformats_kernels.settings import SETTINGS

    monkeypatch.setattr(SETTINGS, "interpret", False)
    layout, cache = arena(2, seed=1)["kv"]
    before = cache.clone()
    with pytest.raises(BackendUnavailableError, match="CUDA caches"):
        page_checksums(layout, cache, torch.tensor([0]), torch.tensor([[0, 4]]), backend="triton")
    assert torch.equal(cache, before)


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_any_valid_plan_moves_exactly_its_rows(data):
    """Random page pairs, row ranges and modes on the arena: after applying the plan each moved
    row equals its source, every other destination byte is unchanged, and verify passes."""
    n = data.draw(st.integers(1, 5), label="pages")
    sp = data.draw(st.permutations(range(8)), label="src")[:n]
    dp = data.draw(st.permutations(range(10)), label="dst")[:n]
    whole = data.draw(st.booleans(), label="whole_pages")
    rows = None
    if not whole and data.draw(st.booleans(), label="row range"):
        start = data.draw(st.integers(0, n * 16 - 1))
        rows = {"kv": (start, data.draw(st.integers(start + 1, n * 16)))}
    src, dst = arena(8, seed=n), arena(10, seed=None)
    pages = {name: list(sp) for name in src}
    there = {name: list(dp) for name in src}
    plan = plan_transfer(describe_caches(src), describe_caches(dst), pages, there, rows=rows, whole_pages=whole)
    apply(plan, src, dst)
    verify(plan, dst, expected_checksums(plan, src))
    start, stop = rows["kv"] if rows else (0, n * 16)
    got = KV.gather(dst["kv"][1], (torch.tensor(dp)[:, None] * 16 + torch.arange(16)).flatten())
    want = KV.gather(src["kv"][1], (torch.tensor(sp)[:, None] * 16 + torch.arange(16)).flatten())
    assert torch.equal(got[start:stop], want[start:stop])
    assert not got[:start].any() and not got[stop:].any()
    for name in ("kv", "index", "state"):  # pages outside the plan stay zero
        layout, cache = dst[name]
        others = torch.tensor([p for p in range(10) if p not in dp])
        assert not layout.byte_pages(cache)[0][others].any()
