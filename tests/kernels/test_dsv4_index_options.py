"""The index-op options tokenspeed's semantics need (issue 43): ``compressed_slot_mapping``'s
per-token ``req_indices`` and ``is_valid_token``; ``global_topk_indices_and_lens``' base offsets,
``lens="scan"``, ``out_valid_lens`` and its ``out_indices`` / ``out_lens``.

* the Triton kernels equal the torch references element for element (without CUDA under the
  Triton interpreter, conftest), outputs given as strided views of sentinel arenas that are
  watched whole;
* the references give the documented values on hand-made rows;
* bad arguments raise kvformats' typed errors before anything is written;
* the drop-ins that now make one native call are replayed as a whole, and a replayed call
  launches what its full path launches for every form (the options are keyed).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.errors import InputError, InputTypeError
from tests.harness.index_batches import batches
from tests.kernels.test_dsv4_indices_kernels import DEV, T, arena, compare, fixed, maybe, spoil, tokens

pytest.importorskip("triton")

I32 = torch.int32


def _int32_arena(rows: int, cols: int | None = None, step: int = 1):
    """(a sentinel-filled int32 arena, its view of ``rows`` [x ``cols``] with row step ``step``)."""
    buf = arena(rows * step, cols) if cols is not None else arena(rows * step).to(I32)
    return buf, buf[::step]


# ----------------------------------------------------------------------------- kernel == reference


@settings(max_examples=40)
@given(batches(), st.data())
def test_compressed_slot_mapping_with_request_indices(b, data):
    """Per-token requests (some outside [0, R)), any query_start_loc values (unsorted too: it is
    only read for the positions), an optional mask, out as a strided view of a watched arena."""
    toks = tokens(b)
    n = len(toks) + data.draw(st.integers(0, 3))
    req = spoil(data, [r for r, _ in toks] + [data.draw(st.integers(-1, b["r"])) for _ in range(n - len(toks))],
                b["r"])
    qsl = list(b["qsl"])
    if data.draw(st.booleans()):
        qsl = [data.draw(st.integers(-3, 50)) for _ in qsl]
    valid = maybe(data, [data.draw(st.booleans()) for _ in range(n)])
    base = maybe(data, b["base"])
    out_rows = maybe(data, n + data.draw(st.integers(0, 3)))
    step = data.draw(st.sampled_from([1, 2]))
    req32 = data.draw(st.booleans())

    def build():
        buf = None if out_rows is None else arena(out_rows * step)
        return (n, T(qsl), T(b["seq"]), T(b["table"]).reshape(b["r"], -1), b["page"], b["ratio"],
                None if base is None else T(base), None if buf is None else buf[::step],
                T(req, I32 if req32 else torch.int64), None if valid is None else T(valid, torch.bool)), \
            [] if buf is None else [buf]

    compare("compressed_slot_mapping", build)


@settings(max_examples=25)
@given(batches(), st.data())
def test_compressed_slot_mapping_mask_without_request_indices(b, data):
    qsl = b["qsl"]
    n = qsl[-1] + data.draw(st.integers(0, 3))
    valid = [data.draw(st.booleans()) for _ in range(n)]

    def build():
        return (n, T(qsl), T(b["seq"]), T(b["table"]).reshape(b["r"], -1), b["page"], b["ratio"], None, None,
                None, T(valid, torch.bool)), []

    compare("compressed_slot_mapping", build)


@settings(max_examples=50)
@given(batches(), st.data())
def test_global_topk_options(b, data):
    """Base offsets (negative ones too), both lens modes, the valid count, outputs given as
    strided views of watched arenas or allocated."""
    toks = tokens(b) or [(0, 0)]
    k = data.draw(st.integers(0, 40))
    hi = (len(b["table"][0]) + 4) * b["page"] + 3
    topk = [[data.draw(st.sampled_from([-1, data.draw(st.integers(0, hi))])) for _ in range(k)] for _ in toks]
    req = spoil(data, [r for r, _ in toks], b["r"])
    valid = maybe(data, [data.draw(st.booleans()) for _ in toks])
    base = maybe(data, [data.draw(st.integers(-2, 4)) for _ in range(b["r"])])
    lens = data.draw(st.sampled_from(["count", "scan"]))
    outs = data.draw(st.sampled_from(["none", "counts", "all"]))
    step = data.draw(st.sampled_from([1, 2]))
    n = len(toks)

    def build():
        t = torch.tensor(topk, dtype=I32, device=DEV).reshape(n, k)
        watched, views = [], [None, None, None]
        if outs != "none":
            counts, views[2] = _int32_arena(n, step=step)
            watched.append(counts)
        if outs == "all":
            idx, views[0] = _int32_arena(n, k, step)
            sizes, views[1] = _int32_arena(n, step=step)
            watched += [idx, sizes]
        return (t, T(req), T(b["table"]).reshape(b["r"], -1), b["page"],
                None if valid is None else T(valid, torch.bool), None if base is None else T(base, I32), lens,
                *views), watched

    compare("global_topk_indices_and_lens", build)


@pytest.mark.parametrize("small", [False, True])
def test_global_topk_base_edges(small):
    """Shifted entries beyond int32 (a negative base), below the first page, rows with no entry,
    an empty top-k, no table rows: the kernel equals the reference, lens and counts included."""
    big = 2**31 - 1
    topk = T([[big, 0, 5, -1], [-1, -1, -1, -1], [3, -1, 9, -1], [7, 7, -1, 2]], I32).reshape(4, 4)
    table = T([[4, 1, -1, 6], [2, 3, 9, 8]]).reshape(2, 4)
    req, base = T([0, 1, 1, 0]), T([-1, 1])
    for lens in ("count", "scan"):
        got = compare("global_topk_indices_and_lens",
                      fixed(topk, req, table, 4, None, base, lens, None, None, lambda: arena(4).to(I32)), small)
        # request 0's base -1: entries move up a page; 2**31 - 1 + 4 passes int32 (-1), 0 -> 4 (page 1,
        # entry 1: slot 4), 5 -> 9 (page 2: missing)
        assert got[0][0].tolist() == [-1, 4, -1, -1]
    compare("global_topk_indices_and_lens",
            fixed(topk[:, :0], req, table, 4, None, base, "scan", None, None, lambda: arena(4).to(I32)), small)
    compare("global_topk_indices_and_lens",
            fixed(topk, req, table[:0], 4, None, base[:0], "scan", None, None, lambda: arena(4).to(I32)), small)


# ----------------------------------------------------------------------------- documented values


def test_global_topk_values():
    topk = torch.tensor([[0, 5, -1, 9, -1], [-1, -1, -1, -1, -1], [8, -1, 1, -1, -1], [2, 3, -1, -1, 4]], dtype=I32)
    req, table = torch.tensor([0, 0, 1, 2]), torch.tensor([[3, -1, 7], [1, 2, 5]])  # request 2: no row
    valid = torch.tensor([True, True, True, True])
    counts = torch.full((4,), 9, dtype=I32)
    g, lens = dsv4.global_topk_indices_and_lens(topk_indices=topk, req_indices=req, block_table=table, page_size=4,
                                                is_valid_token=valid, lens="scan", out_valid_lens=counts)
    assert g.tolist() == [[12, -1, -1, 29, -1], [-1] * 5, [20, -1, 5, -1, -1], [-1] * 5]
    assert lens.tolist() == [4, 0, 3, 0]  # one past the last entry >= 0; 0 for request 2
    assert counts.tolist() == [2, 0, 2, 0]  # the mapped slots
    # base offsets: request 1's row starts at logical page 1 (entries 4..15); 1 and 3 fall before it
    base = torch.tensor([0, 1])
    g, lens = dsv4.global_topk_indices_and_lens(topk_indices=topk, req_indices=req, block_table=table, page_size=4,
                                                block_table_base_offsets=base)
    assert g[2].tolist() == [8 + 0, -1, -1, -1, -1] and lens.tolist() == [3, 0, 1, 0]
    _, scan = dsv4.global_topk_indices_and_lens(topk_indices=topk, req_indices=req, block_table=table, page_size=4,
                                                block_table_base_offsets=base, lens="scan")
    assert scan.tolist() == [4, 0, 3, 0]  # the scan extent reads the given row


def test_compressed_slot_mapping_values():
    """Per-token requests: token t of request r at seq_lens[r] - qlen[r] + (t - qsl[r])."""
    qsl, seq = torch.tensor([0, 2, 5]), torch.tensor([4, 6])
    table = torch.tensor([[10, 11], [20, 21]])
    req = torch.tensor([1, 1, 1, 0, 5, -1])  # tokens 0-2 of request 1 (positions 3, 4, 5), 3 of request 0
    got = dsv4.compressed_slot_mapping(num_tokens=6, query_start_loc=qsl, seq_lens=seq, block_table=table,
                                       page_size=2, ratio=2, req_indices=req)
    # request 1: t - qsl[1] = -2, -1, 0 -> positions 1, 2, 3: groups end at 1 and 3 (rows 0 and 1)
    # request 0: position 4 - 2 + 3 = 5: row 2 (page 1)
    assert got.tolist() == [20 * 2, -1, 20 * 2 + 1, 11 * 2 + 0, -1, -1]
    mask = torch.tensor([False, True, True, True, True, True])
    got = dsv4.compressed_slot_mapping(num_tokens=6, query_start_loc=qsl, seq_lens=seq, block_table=table,
                                       page_size=2, ratio=2, req_indices=req, is_valid_token=mask)
    assert got.tolist() == [-1, -1, 20 * 2 + 1, 11 * 2 + 0, -1, -1]
    # query_start_loc that decreases: only read for the positions, no error with req_indices
    dsv4.compressed_slot_mapping(num_tokens=6, query_start_loc=torch.tensor([3, 0, 1]), seq_lens=seq,
                                 block_table=table, page_size=2, ratio=2, req_indices=req)
    with pytest.raises(InputError):
        dsv4.compressed_slot_mapping(num_tokens=6, query_start_loc=torch.tensor([3, 0, 1]), seq_lens=seq,
                                     block_table=table, page_size=2, ratio=2)


# ----------------------------------------------------------------------------- bad input


def _topk_case():
    return dict(topk_indices=torch.zeros(3, 4, dtype=I32), req_indices=torch.zeros(3, dtype=torch.int64),
                block_table=torch.zeros(2, 2, dtype=torch.int64), page_size=4)


BAD_TOPK = [
    ("lens", dict(lens="bogus"), InputError),
    ("lens not a str", dict(lens=1), InputError),
    ("base short", dict(block_table_base_offsets=torch.zeros(1, dtype=torch.int64)), InputError),
    ("base float", dict(block_table_base_offsets=torch.zeros(2)), InputTypeError),
    ("valid lens int64", dict(out_valid_lens=torch.zeros(3, dtype=torch.int64)), InputTypeError),
    ("valid lens short", dict(out_valid_lens=torch.zeros(2, dtype=I32)), InputError),
    ("out indices shape", dict(out_indices=torch.zeros(3, 5, dtype=I32)), InputError),
    ("out lens int64", dict(out_lens=torch.zeros(3, dtype=torch.int64)), InputTypeError),
]


@pytest.mark.parametrize("label,change,error", BAD_TOPK, ids=[c[0] for c in BAD_TOPK])
def test_global_topk_bad_options(label, change, error):
    kw = {**_topk_case(), **change}
    outs = [v for k, v in kw.items() if k.startswith("out_")]
    before = [o.clone() for o in outs]
    with pytest.raises(error):
        dsv4.global_topk_indices_and_lens(**kw)
    assert all(torch.equal(a, b) for a, b in zip(outs, before))


def _compressed_case():
    return dict(num_tokens=3, query_start_loc=torch.tensor([0, 3]), seq_lens=torch.tensor([5]),
                block_table=torch.zeros(1, 2, dtype=torch.int64), page_size=4, ratio=2,
                out=torch.full((4,), 7, dtype=torch.int64))


BAD_COMPRESSED = [
    ("req short", dict(req_indices=torch.zeros(2, dtype=torch.int64)), InputError),
    ("req float", dict(req_indices=torch.zeros(3)), InputTypeError),
    ("req 2-D", dict(req_indices=torch.zeros(3, 1, dtype=torch.int64)), InputError),
    ("mask int", dict(is_valid_token=torch.ones(3, dtype=I32)), InputTypeError),
    ("mask long", dict(is_valid_token=torch.ones(4, dtype=torch.bool)), InputError),
]


@pytest.mark.parametrize("label,change,error", BAD_COMPRESSED, ids=[c[0] for c in BAD_COMPRESSED])
def test_compressed_slot_mapping_bad_options(label, change, error):
    kw = {**_compressed_case(), **change}
    with pytest.raises(error):
        dsv4.compressed_slot_mapping(**kw)
    assert kw["out"].eq(7).all()


# ----------------------------------------------------------------------------- replay of the drop-ins


def test_drop_ins_replay_as_a_whole_with_every_option_keyed():
    """With launches logged (the path CUDA tensors take), the compact slot mapping and the top-k
    mapping in each call form (base offsets, masks, the valid count, longer per-token tensors)
    replay what their full path launches, and are replayed (a plan exists)."""
    from replay_fuzz import check_replay, stub_with_replay

    from kvformats.compat.tokenspeed_kernel import dsv4 as ts4
    from kvformats.runtime.replay_plan import Plan

    g = torch.Generator().manual_seed(4)
    n, k = 6, 8
    topk = torch.randint(-1, 12, (n, k), generator=g, dtype=I32)
    req = torch.tensor([0, 1, 1, 2, 0, 1, 1, 0])  # longer than the tokens: its first 6
    table = torch.randint(-1, 9, (3, 4), generator=g)
    valid = torch.tensor([True, False, True, True, True, True, True])
    base = torch.tensor([0, 1, 0, 5])
    counts = torch.empty(n, dtype=I32)
    qsl, seq = torch.tensor([0, 2, 4, 6]), torch.tensor([5, 9, 3])
    out = torch.empty(n + 2, dtype=torch.int64)
    forms = [
        lambda: ts4.dsv4_compute_global_topk_indices_and_lens(topk_indices=topk, token_to_req_indices=req,
                                                              block_table=table, block_size=4),
        lambda: ts4.dsv4_compute_global_topk_indices_and_lens(topk_indices=topk, token_to_req_indices=req,
                                                              block_table=table, block_size=4, is_valid_token=valid,
                                                              block_table_base_offsets=base, out_valid_lens=counts),
        lambda: ts4.dsv4_compute_global_topk_indices_and_lens(topk_indices=topk, token_to_req_indices=req,
                                                              block_table=table, block_size=4, out_valid_lens=counts),
        lambda: ts4.dsv4_compact_compressed_slot_mapping(
            num_tokens=n, token_to_req_indices=req, query_start_loc=qsl, seq_lens=seq, block_table=table,
            block_size=4, compress_ratio=2, block_table_base_offsets=None, is_valid_token=None, out=out),
        lambda: ts4.dsv4_compact_compressed_slot_mapping(
            num_tokens=n, token_to_req_indices=req, query_start_loc=qsl, seq_lens=seq, block_table=table,
            block_size=4, compress_ratio=4, block_table_base_offsets=base, is_valid_token=valid[:n], out=out),
    ]
    with stub_with_replay() as log:
        for _ in range(3):
            for form in forms:
                check_replay(form, log)
        for fn in (ts4.dsv4_compute_global_topk_indices_and_lens, ts4.dsv4_compact_compressed_slot_mapping):
            plans = [p for p in fn.__wrapped_plans__.values() if isinstance(p, Plan)]
            assert len(plans) >= 2, fn.__name__
    assert kvf.pending_error("cpu") is None


def test_drop_ins_compile_fullgraph_through_the_ops():
    """Under torch.compile the drop-ins' native calls are the torch.library ops (the public
    functions route there): no graph break, the eager bytes, ``out_valid_lens`` and ``out`` written."""
    from kvformats.compat.tokenspeed_kernel import dsv4 as ts4

    g = torch.Generator().manual_seed(9)
    topk = torch.randint(-1, 12, (6, 8), generator=g, dtype=I32)
    req = torch.tensor([0, 1, 1, 2, 0, 1, 1])
    table = torch.randint(-1, 9, (3, 4), generator=g)
    valid = torch.tensor([True, False, True, True, True, True])
    base = torch.tensor([0, 1, 0])
    qsl, seq = torch.tensor([0, 2, 4, 6]), torch.tensor([5, 9, 3])

    def step(counts, out):
        slots, lens = ts4.dsv4_compute_global_topk_indices_and_lens(
            topk_indices=topk, token_to_req_indices=req, block_table=table, block_size=4, is_valid_token=valid,
            block_table_base_offsets=base, out_valid_lens=counts)
        mapping = ts4.dsv4_compact_compressed_slot_mapping(
            num_tokens=6, token_to_req_indices=req, query_start_loc=qsl, seq_lens=seq, block_table=table,
            block_size=4, compress_ratio=2, block_table_base_offsets=None, is_valid_token=valid, out=out)
        return slots, lens, mapping

    def buffers():
        return torch.full((6,), 7, dtype=I32), torch.full((8,), 7, dtype=torch.int64)

    b1, b2, b3 = buffers(), buffers(), buffers()
    assert torch._dynamo.explain(step)(*b1).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*b2)
    want = step(*b3)
    for a, e in zip((*got, *b2), (*want, *b3)):
        assert torch.equal(a, e)
    assert not b3[0].eq(7).all() and b3[1][6:].eq(-1).all()
    torch._dynamo.reset()
