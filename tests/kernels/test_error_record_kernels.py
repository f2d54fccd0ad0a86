"""The codec and paged kernels record value violations in the device error record exactly as the
reference does (spec/checks.md §2-3), write what the spec says for the offending rows, and
record nothing for valid input.

Without CUDA the public ops run on CPU tensors with the default GPU check path (``device_mode``:
no host value checks) and ``backend="triton"`` routed to the Triton launchers under the
interpreter; with CUDA the same tests run compiled on the GPU. Each case runs the reference and
the kernel on equal copies of its inputs and compares the two records word for word (so
``raise_pending`` gives one message on both backends) and the bytes they leave.
"""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.runtime import deferred
from kvformats.testing.strategies import storage_bytes

pytest.importorskip("triton")

import kvformats_kernels as kk  # noqa: E402  (after conftest chose interpreter or GPU)
from recording import DEV, check_words, expect, take_record  # noqa: E402
from kvformats_kernels import state  # noqa: E402
from tests.harness.capabilities import kernel_formats, quant_block  # noqa: E402

SENTINEL = 0xA5
FORMATS = kernel_formats()  # every format with Triton kernels, whichever package registered them
# the quantized row formats (a scaled block); the compressor states hold float32 rows
BYTE_FORMATS = [f for f in FORMATS if quant_block(kvf.get_format(f))[0]]
PAGES, PAGE_SIZE = 3, 4
CAPACITY = PAGES * PAGE_SIZE
CHECK = deferred.Check


def raw(t) -> torch.Tensor:
    if isinstance(t, (tuple, list)):
        return torch.cat([raw(u) for u in t])
    return t.contiguous().view(torch.uint8).reshape(-1)


def same(a, b) -> bool:
    """Bitwise equal, NaN payloads aside (NaN at the same places)."""
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        if not torch.equal(na, nb):
            return False
        a, b = a.masked_fill(na, 0), b.masked_fill(nb, 0)
    return torch.equal(raw(a), raw(b))


def layout_of(fmt: str):
    return kvf.get_format(fmt, page_size=PAGE_SIZE)


def random_cache(lay, pages: int = PAGES, seed: int = 0) -> torch.Tensor:
    """A cache over random bytes (finite floats for compressor_state)."""
    cache = lay.allocate(pages, device=DEV)
    g = torch.Generator().manual_seed(seed)
    if cache.dtype == torch.uint8:
        storage_bytes(cache).copy_(torch.randint(0, 256, (storage_bytes(cache).numel(),), generator=g,
                                                 dtype=torch.uint8))
    else:
        cache.copy_(torch.randn(cache.shape, generator=g))
    return cache


def rows_for(lay, n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    if isinstance(lay, kvf.CompressorState):
        w = lay.width
        kv, score = torch.randn(n, w, generator=g).to(DEV), torch.randn(n, w, generator=g).to(DEV)
        return (kv, score), {"positions": torch.arange(n, device=DEV) * 3,
                             "ape": torch.randn(lay.ratio, w, generator=g).to(DEV)}
    if isinstance(lay, kvf.CompressorStateV41):
        return (torch.randn(n, lay.width, generator=g).to(DEV), torch.randn(n, lay.width, generator=g).to(DEV)), {}
    return (torch.randn(n, lay.head_dim, generator=g) * 4).to(torch.bfloat16).to(DEV), {}


def both(call):
    """``call(backend)`` with "reference", then "triton": [(record words, result), ...]."""
    take_record()
    runs = []
    for backend in ("reference", "triton"):
        result = call(backend)
        runs.append((take_record(), result))
    return runs


# ----- encode / decode / gather / decode_topk by slots -------------------------------------------
SLOT_CASES = {  # id -> (slots, index of the violation or None)
    "middle": ([1, CAPACITY, -1, 5], 1),
    "last": ([0, 7, CAPACITY - 1, CAPACITY + 40], 3),
    "first": ([CAPACITY + 3, 2, -1, 11], 0),
    "valid": ([3, -1, CAPACITY - 1, 0], None),
}


@pytest.mark.parametrize("case", list(SLOT_CASES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_records_like_the_reference_and_skips_the_row(fmt, case, routed):
    lay = layout_of(fmt)
    slots_list, bad = SLOT_CASES[case]
    slots = torch.tensor(slots_list, device=DEV)
    x, kw = rows_for(lay, slots.shape[0])
    caches = []

    def call(backend):
        cache = random_cache(lay)
        lay.encode(x, cache, slots, backend=backend, **kw)
        caches.append(cache)

    (ref_words, _), (kern_words, _) = both(call)
    assert kern_words == ref_words
    if bad is None:
        assert kern_words == [0] * deferred.WORDS
    else:
        assert kern_words == expect(CHECK.SLOT_RANGE, "encode", "slots", bad, slots_list[bad], CAPACITY)
    assert torch.equal(storage_bytes(caches[1]), storage_bytes(caches[0]))
    # the same bytes as with the offending row absent: nothing written for it, nothing elsewhere
    alone = random_cache(lay)
    lay.encode(x, alone, torch.where(slots >= CAPACITY, -1, slots), backend="reference", **kw)
    assert torch.equal(storage_bytes(caches[1]), storage_bytes(alone))
    assert kvf.pending_error(DEV) is None


@pytest.mark.parametrize("op", ["decode", "gather", "decode_topk"])
@pytest.mark.parametrize("case", list(SLOT_CASES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_reads_record_like_the_reference_and_give_zero_rows(fmt, case, op, routed):
    lay = layout_of(fmt)
    slots_list, bad = SLOT_CASES[case]
    slots = torch.tensor(slots_list, device=DEV)
    arg = slots.reshape(2, 2) if op == "decode_topk" else slots
    cache = random_cache(lay)
    before = storage_bytes(cache).clone()

    (ref_words, ref_out), (kern_words, kern_out) = both(lambda backend: getattr(lay, op)(cache, arg, backend=backend))
    assert kern_words == ref_words
    if bad is None:
        assert kern_words == [0] * deferred.WORDS
    else:
        argname = "topk_slots" if op == "decode_topk" else "slots"
        assert kern_words == expect(CHECK.SLOT_RANGE, op, argname, bad, slots_list[bad], CAPACITY)
    assert torch.equal(storage_bytes(cache), before), "a read changed the cache"
    assert same(kern_out, ref_out)
    outs = kern_out if isinstance(kern_out, tuple) else (kern_out,)
    for out in outs:
        flat = out.reshape(len(slots_list), -1)
        for i, s in enumerate(slots_list):
            if s < 0 or s >= CAPACITY:
                assert not raw(flat[i]).any(), f"row {i} (slot {s}) must be a zero row"


@pytest.mark.parametrize("fmt", FORMATS)
def test_message_is_the_same_on_both_backends(fmt, routed):
    lay = layout_of(fmt)
    cache = random_cache(lay)
    messages = []
    for backend in ("reference", "triton"):
        lay.decode(cache, torch.tensor([2, 50], device=DEV), backend=backend)
        err = kvf.pending_error(DEV)
        messages.append(str(err))
    assert messages[0] == messages[1]
    assert "decode: slots[1] = 50 is beyond the cache's capacity of 12 slots" in messages[1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_into_an_empty_cache_records(fmt, routed):
    """Zero pages: every non-negative slot is beyond the capacity, and the kernel still checks."""
    lay = layout_of(fmt)
    x, kw = rows_for(lay, 2)
    slots = torch.tensor([-1, 0], device=DEV)
    (ref_words, _), (kern_words, _) = both(lambda backend: lay.encode(x, lay.allocate(0, device=DEV), slots,
                                                                      backend=backend, **kw))
    assert kern_words == ref_words == expect(CHECK.SLOT_RANGE, "encode", "slots", 1, 0, 0)


def test_a_set_record_keeps_its_first_violation():
    lay = layout_of("fp8_indexer")
    cache = random_cache(lay)
    impl = kk.IMPLEMENTATIONS["fp8_indexer"]
    impl.decode(lay, cache, torch.tensor([0, 70], device=DEV))
    impl.gather(lay, cache, torch.tensor([90], device=DEV))
    assert take_record() == expect(CHECK.SLOT_RANGE, "decode", "slots", 1, 70, CAPACITY)


def test_state_encode_records_at_the_site_it_is_given():
    """save_compressor_state launches the compressor_state encode with its own site."""
    lay = layout_of("compressor_state")
    x, kw = rows_for(lay, 2)
    where = deferred.site("save_compressor_state", "slots")
    cache = random_cache(lay)
    before = storage_bytes(cache).clone()
    state.encode(lay, x, cache, torch.tensor([CAPACITY, -1], device=DEV), site=where, **kw)
    assert take_record() == [1, int(CHECK.SLOT_RANGE), where, 0, CAPACITY, CAPACITY, 0, 0]
    assert torch.equal(storage_bytes(cache), before)


# ----- dequantize_gather ------------------------------------------------------------------------
WIDTH, OFFSET = 6, 1
DG_CASES = {  # id -> (seq_lens, gather_lens or None, offset, expected record or None, requests writing nothing)
    "glen-over-seq": ([5, 4, 9], [3, 6, 2], OFFSET, (CHECK.GATHER_LEN, "gather_lens", 1, 6, 4), (1,)),
    "glen-negative": ([5, 4, 9], [3, 2, -1], OFFSET, (CHECK.GATHER_LEN, "gather_lens", 2, -1, 9), (2,)),
    "seq-negative": ([1, -2, 2], None, 4, (CHECK.GATHER_LEN, "gather_lens", 1, -2, -2), (1,)),
    "too-wide": ([5, 9, 4], [3, 6, 2], OFFSET, (CHECK.WORKSPACE_WIDTH, "out", 1, 7, WIDTH), ()),
    "too-wide-seq": ([9, 2, 1], None, 2, (CHECK.WORKSPACE_WIDTH, "out", 0, 11, WIDTH), ()),
    "no-room": ([5, 4, 9], [0, 2, 0], WIDTH, (CHECK.WORKSPACE_WIDTH, "out", 1, WIDTH + 2, WIDTH), (0, 1, 2)),
    "valid": ([5, 4, 9], [3, 4, 0], OFFSET, None, ()),
    "valid-no-room": ([5, 4, 9], [0, 0, 0], WIDTH, None, (0, 1, 2)),
}


@pytest.mark.parametrize("case", list(DG_CASES))
@pytest.mark.parametrize("fmt", BYTE_FORMATS)
def test_dequantize_gather_records_like_the_reference(fmt, case, routed):
    lay = layout_of(fmt)
    seq, glen, offset, want, silent = DG_CASES[case]
    cache = random_cache(lay, pages=4)
    table = torch.tensor([[0, 1, 2], [3, 0, -1], [2, 3, 1]], device=DEV)
    seq_t = torch.tensor(seq, device=DEV)
    glen_t = None if glen is None else torch.tensor(glen, device=DEV, dtype=torch.int32)
    start = torch.full((3, WIDTH, lay.head_dim), 7.0, dtype=lay.decode_dtype, device=DEV)

    def call(backend):
        out = start.clone()
        lay.dequantize_gather(cache, out, block_table=table, seq_lens=seq_t, gather_lens=glen_t, offset=offset,
                              backend=backend)
        return out

    (ref_words, ref_out), (kern_words, kern_out) = both(call)
    check_words(kern_words, ref_words, want, "dequantize_gather")
    assert same(kern_out, ref_out)
    for r in silent:
        assert torch.equal(raw(kern_out[r]), raw(start[r])), f"request {r} must write no row"
    if case == "too-wide":  # the rows that fit are written, those beyond the workspace cannot be
        assert not torch.equal(raw(kern_out[1, OFFSET:]), raw(start[1, OFFSET:]))
    assert torch.equal(raw(kern_out[:, :offset]), raw(start[:, :offset])), "rows before the offset changed"


# ----- gather_paged -----------------------------------------------------------------------------
def _workspaces(lay, rows: int):
    return tuple(torch.full((rows, seg.record_bytes), SENTINEL, dtype=torch.uint8, device=DEV)
                 for seg in lay.segments)


GP_CASES = {  # id -> (cu_seq_lens, workspace rows (None: num_rows=), num_rows, expected record or None)
    "decrease": ([0, 5, 3, 7], 9, None, (CHECK.CU_ORDER, 2, 3, 5)),
    "nonzero-start": ([2, 4, 6, 8], 9, None, (CHECK.CU_ORDER, 0, 2, 0)),
    "negative-start": ([-3, 4, 6, 8], 9, None, (CHECK.CU_ORDER, 0, -3, 0)),
    "decrease-and-short": ([0, 6, 2, 12], 9, None, (CHECK.CU_ORDER, 2, 2, 6)),
    "short": ([0, 3, 6, 12], 9, None, (CHECK.WORKSPACE_ROWS, 0, 12, 9)),
    "short-num-rows": ([0, 3, 6, 12], None, 10, (CHECK.WORKSPACE_ROWS, 0, 12, 10)),
    "empty-workspace": ([0, 2, 2, 2], 0, None, (CHECK.WORKSPACE_ROWS, 0, 2, 0)),
    "no-requests": ([4], 3, None, (CHECK.CU_ORDER, 0, 4, 0)),
    "valid": ([0, 3, 3, 8], 9, None, None),
    "valid-no-requests": ([0], 2, None, None),
}


@pytest.mark.parametrize("case", list(GP_CASES))
@pytest.mark.parametrize("fmt", BYTE_FORMATS)
def test_gather_paged_records_like_the_reference(fmt, case, routed):
    lay = layout_of(fmt)
    cu, rows, num_rows, want = GP_CASES[case]
    cache = random_cache(lay, pages=4)
    requests = len(cu) - 1
    table = torch.tensor([[0, 1, 2], [3, 0, -1], [2, 3, 1]][:requests], dtype=torch.int64,
                         device=DEV).reshape(requests, 3)
    cu_t = torch.tensor(cu, device=DEV, dtype=torch.int32)

    def call(backend):
        if rows is None:
            return lay.gather_paged(cache, block_table=table, cu_seq_lens=cu_t, num_rows=num_rows, backend=backend)
        out = _workspaces(lay, rows)
        lay.gather_paged(cache, block_table=table, cu_seq_lens=cu_t, out=out, backend=backend)
        return out

    (ref_words, ref_out), (kern_words, kern_out) = both(call)
    check_words(kern_words, ref_words, want, "gather_paged", "cu_seq_lens")
    t_rows = kern_out[0].shape[0]
    ordered = all(b >= a for a, b in zip(cu, cu[1:])) and cu[0] == 0
    if ordered:  # every row is specified: the reference's bytes
        assert torch.equal(raw(kern_out), raw(ref_out))
    else:  # rows at or beyond min(max(cu), rows) are untouched, by either backend
        limit = max(0, min(max(cu), t_rows))
        for out in (kern_out, ref_out):
            for ws in out:
                assert (ws[limit:] == SENTINEL).all()
    if rows is not None and ordered:  # rows past cu[-1] keep the sentinel
        for ws in kern_out:
            assert (ws[max(0, min(cu[-1], t_rows)):] == SENTINEL).all()


def test_gather_paged_message_is_the_same_on_both_backends(routed):
    lay = layout_of("fp8_ds_mla")
    cache = random_cache(lay)
    messages = []
    for backend in ("reference", "triton"):
        lay.gather_paged(cache, block_table=torch.zeros(2, 2, dtype=torch.int32, device=DEV),
                         cu_seq_lens=torch.tensor([0, 5, 3], device=DEV), out=_workspaces(lay, 8), backend=backend)
        messages.append(str(kvf.pending_error(DEV)))
    assert messages[0] == messages[1]
    assert "cu_seq_lens[2] = 3 after 5" in messages[1]
