"""Index helpers against plain-Python loops (exact equality), on hypothesis-drawn batches with
base offsets, missing pages, invalid tokens and padding rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from tests.harness import dsv4_oracle as orc
from tests.harness.index_batches import batches


def _tokens(b):
    """(request, position) of every token in query_start_loc order."""
    out = []
    for r in range(b["r"]):
        for i in range(b["qlen"][r]):
            out.append((r, b["seq"][r] - b["qlen"][r] + i))
    return out


def T(x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype)


@given(batches(), st.integers(0, 6))
def test_compressed_slot_mapping(b, extra):
    ratio = max(b["ratio"], 2)
    n = b["qsl"][-1] + extra  # padding tokens beyond every request
    out = torch.full((n + 2,), 123, dtype=torch.int64)
    got = dsv4.compressed_slot_mapping(num_tokens=n, query_start_loc=T(b["qsl"]), seq_lens=T(b["seq"]),
                                       block_table=T(b["table"]), page_size=b["page"], ratio=ratio,
                                       block_table_base_offsets=T(b["base"]), out=out)
    want = [-1] * n
    for t, (r, p) in enumerate(_tokens(b)):
        if (p + 1) % ratio == 0:
            want[t] = orc.table_slot(b["table"], r, p // ratio, b["page"], b["base"])
    assert got.tolist() == want and out[n:].tolist() == [-1, -1]


@given(batches())
def test_table_slot_mapping(b):
    toks = _tokens(b)
    pos, req = T([p for _, p in toks]), T([r for r, _ in toks])
    valid = T([i % 3 != 1 for i in range(len(toks))], torch.bool)
    got = dsv4.table_slot_mapping(positions=pos, req_indices=req, block_table=T(b["table"]), page_size=b["page"],
                                  entry_stride=b["ratio"], block_table_base_offsets=T(b["base"]), is_valid_token=valid)
    want = [orc.table_slot(b["table"], r, p // b["ratio"], b["page"], b["base"]) if i % 3 != 1 else -1
            for i, (r, p) in enumerate(toks)]
    assert got.tolist() == want


@given(batches())
def test_global_topk_indices_and_lens(b):
    draw, toks = b["draw"], _tokens(b)
    k = draw(st.integers(1, 6))
    topk = [[draw(st.integers(-1, 40)) for _ in range(k)] for _ in toks]
    req = [r if i % 4 != 3 else 99 for i, (r, _) in enumerate(toks)]  # every 4th: request out of range
    valid = [i % 5 != 2 for i in range(len(toks))]
    g, lens = dsv4.global_topk_indices_and_lens(topk_indices=T(topk, torch.int32).reshape(len(toks), k),
                                                req_indices=T(req).reshape(-1), block_table=T(b["table"]),
                                                page_size=b["page"], is_valid_token=T(valid, torch.bool).reshape(-1))
    for i in range(len(toks)):
        ok = valid[i] and req[i] < b["r"]
        want = [orc.table_slot(b["table"], req[i], v, b["page"]) if ok and v >= 0 else -1 for v in topk[i]]
        assert g[i].tolist() == want
        assert int(lens[i]) == (sum(v >= 0 for v in topk[i]) if ok else 0)
    assert g.dtype == torch.int32 and lens.dtype == torch.int32


def _swa_row(p, swa_len, gather_start, row_base):
    return [row_base + q - gather_start if q >= gather_start else -1 for q in range(p - swa_len + 1, p + 1)]


@given(batches(), st.integers(0, 3))
def test_combine_topk_swa_indices(b, pad):
    draw, toks = b["draw"], _tokens(b)
    ratio, k, ww, cb = max(b["ratio"], 1), draw(st.integers(0, 5)), 200, draw(st.integers(0, 20))
    glen = [draw(st.integers(0, s)) for s in b["seq"]]
    n = len(toks) + pad
    topk = [[draw(st.integers(-1, 30)) for _ in range(k + 1)] for _ in range(n)]
    idx, lens = dsv4.combine_topk_swa_indices(
        topk_indices=T(topk, torch.int32).reshape(n, k + 1), query_start_loc=T(b["qsl"]), seq_lens=T(b["seq"]),
        gather_lens=T(glen), window_size=b["window"], ratio=ratio, topk=k, workspace_width=ww, compressed_base=cb)
    width = -(-(k + b["window"]) // 128) * 128
    assert idx.shape == (n, width)
    for t in range(n):
        row = [-1] * width
        length = 0
        if t < len(toks):
            r, p = toks[t]
            tl, sl = min((p + 1) // ratio, k), min(p + 1, b["window"])
            ent = [v + r * ww if v >= 0 else -1 for v in topk[t][:tl]]
            ent += _swa_row(p, sl, b["seq"][r] - glen[r], r * ww + cb)
            row[:len(ent)] = ent
            length = tl + sl
        assert idx[t].tolist() == row and int(lens[t]) == length


@given(batches())
def test_combine_dense_swa_indices(b):
    draw, toks = b["draw"], _tokens(b)
    ww, cb = 300, draw(st.integers(0, 12))
    clens = [draw(st.integers(0, 15)) for _ in range(b["r"])]
    glen = [draw(st.integers(0, s)) for s in b["seq"]]
    req = [r if i % 4 != 1 else -1 for i, (r, _) in enumerate(toks)]
    pos = [p for _, p in toks]
    idx, lens = dsv4.combine_dense_swa_indices(
        positions=T(pos).reshape(-1), req_indices=T(req).reshape(-1), seq_lens=T(b["seq"]), compressed_lens=T(clens),
        gather_lens=T(glen), window_size=b["window"], ratio=b["ratio"], workspace_width=ww, compressed_base=cb)
    width = -(-max(cb + b["window"], 1) // 128) * 128
    for t, (r, p) in enumerate(toks):
        row, length = [-1] * width, 0
        if req[t] >= 0:
            cl = 0 if b["ratio"] <= 1 else min((p + 1) // b["ratio"], clens[r], cb)
            sl = min(p + 1, b["window"])
            ent = [r * ww + j for j in range(cl)] + _swa_row(p, sl, b["seq"][r] - glen[r], r * ww + cb)
            row[:len(ent)], length = ent, cl + sl
        assert idx[t].tolist() == row and int(lens[t]) == length


@given(batches())
def test_decode_swa_indices_and_lens(b):
    toks = _tokens(b)
    n, w = len(toks), b["window"]
    valid = [i % 3 != 2 for i in range(n)]
    out_i = torch.full((n + 1, w), 55, dtype=torch.int32)
    out_l = torch.full((n + 1,), 55, dtype=torch.int32)
    idx, lens = dsv4.decode_swa_indices_and_lens(
        query_start_loc=T(b["qsl"]), seq_lens=T(b["seq"]), req_indices=T([r for r, _ in toks]).reshape(-1),
        block_table=T(b["table"]), window_size=w, page_size=b["page"], block_table_base_offsets=T(b["base"]),
        is_valid_token=T(valid, torch.bool).reshape(-1), out_indices=out_i, out_lens=out_l)
    for t, (r, p) in enumerate(toks):
        start = max(p - w + 1, 0)
        row = [orc.table_slot(b["table"], r, q, b["page"], b["base"]) for q in range(start, p + 1)]
        row = (row + [-1] * w)[:w] if valid[t] else [-1] * w
        assert idx[t].tolist() == row and int(lens[t]) == (p - start + 1 if valid[t] else 0)
    assert out_i[n].tolist() == [55] * w and int(out_l[n]) == 55  # rows past T untouched


@given(st.lists(st.integers(0, 600), max_size=12), st.sampled_from([1, 4, 128]), st.integers(0, 20))
def test_dense_prefill_local_compressed_indices(pos, ratio, width):
    out = torch.full((len(pos) + 1, width + 2), 9, dtype=torch.int32)
    got = dsv4.dense_prefill_local_compressed_indices(positions=T(pos).reshape(-1), ratio=ratio, width=width, out=out)
    for t, p in enumerate(pos):
        n = min((p + 1) // ratio, width)
        assert got[t].tolist() == [j if j < n else -1 for j in range(width)]
    assert out[:, width:].eq(9).all() and out[len(pos)].eq(9).all()


# ----- issue #25: entries never wrap -------------------------------------------------------------------
def test_table_entries_whose_slots_would_wrap_are_missing_pages():
    """An int64 entry 2**62 gave slot 1 (2**62 * 4 wraps to 0); pages whose slots pass the result's
    dtype now count as missing, exactly from max_page_entry on."""
    from kvformats.deepseek_v4.indices import max_page_entry

    top64, top32 = max_page_entry(4, 2**63 - 1), max_page_entry(4, 2**31 - 1)
    assert (top64, top32) == (2**61 - 1, 2**29 - 1)
    table = T([[2**62, top64, top64 + 1], [top32, top32 + 1, -1]])
    got = dsv4.table_slot_mapping(positions=T([0, 7, 9, 1, 5]), req_indices=T([0, 0, 0, 1, 1]), block_table=table,
                                  page_size=4)
    assert got.tolist() == [-1, 4 * top64 + 3, -1, 4 * top32 + 1, 4 * top32 + 5]
    assert dsv4.table_slot_mapping(positions=T([0]), req_indices=T([0]), block_table=T([[2**63 - 1]]),
                                   page_size=1).tolist() == [2**63 - 1]  # page_size 1: every entry fits
    got = dsv4.compressed_slot_mapping(num_tokens=2, query_start_loc=T([0, 2]), seq_lens=T([8]),
                                       block_table=table[:1], page_size=4, ratio=1)
    assert got.tolist() == [4 * top64 + 2, 4 * top64 + 3]
    glob, lens = dsv4.global_topk_indices_and_lens(topk_indices=T([[0, 5, 9], [1, 5, -1]], torch.int32),
                                                   req_indices=T([0, 1]), block_table=table, page_size=4)
    assert glob.tolist() == [[-1, -1, -1], [4 * top32 + 1, -1, -1]] and lens.tolist() == [3, 2]
    idx, _ = dsv4.decode_swa_indices_and_lens(query_start_loc=T([0, 1]), seq_lens=T([6]), req_indices=T([0]),
                                              block_table=table[1:], window_size=3, page_size=4)
    assert idx.tolist() == [[4 * top32 + 3, -1, -1]]


def test_index_rows_beyond_int32_are_minus_one():
    ww = 2**30  # request 2's workspace rows start at 2**31
    qsl, seq = T([0, 1, 2, 3]), T([5, 5, 5])
    out, lens = dsv4.combine_topk_swa_indices(
        topk_indices=T([[0, 1]] * 3, torch.int32), query_start_loc=qsl, seq_lens=seq, gather_lens=seq,
        window_size=3, ratio=2, topk=2, workspace_width=ww, compressed_base=10)
    assert out[:, :5].tolist() == [[0, 1, 12, 13, 14], [ww, ww + 1, ww + 12, ww + 13, ww + 14], [-1] * 5]
    assert lens.tolist() == [5, 5, 5]
    out, _ = dsv4.combine_dense_swa_indices(
        positions=T([4, 4, 4]), req_indices=T([0, 1, 2]), seq_lens=seq, compressed_lens=T([3, 3, 3]),
        gather_lens=seq, window_size=2, ratio=2, workspace_width=ww, compressed_base=3)
    assert out[2].eq(-1).all() and out[1, :2].tolist() == [ww, ww + 1]


@pytest.mark.parametrize("call, words", [
    (lambda: dsv4.combine_topk_swa_indices(
        topk_indices=T([[0, 1]], torch.int32), query_start_loc=T([0, 1]), seq_lens=T([5]), gather_lens=T([5]),
        window_size=3, ratio=2, topk=2, workspace_width=2**31, compressed_base=10), "workspace_width = 2147483648"),
    (lambda: dsv4.combine_topk_swa_indices(
        topk_indices=T([[0, 1]], torch.int32), query_start_loc=T([0, 1]), seq_lens=T([5]), gather_lens=T([5]),
        window_size=2**31 - 2, ratio=2, topk=2, workspace_width=100, compressed_base=0), "topk + window_size"),
    (lambda: dsv4.combine_dense_swa_indices(
        positions=T([4]), req_indices=T([0]), seq_lens=T([5]), compressed_lens=T([3]), gather_lens=T([5]),
        window_size=2, ratio=2, workspace_width=100, compressed_base=2**31), "compressed_base + window_size"),
    (lambda: dsv4.dense_prefill_local_compressed_indices(positions=T([4]), ratio=4, width=2**31), "width"),
    (lambda: dsv4.decode_swa_indices_and_lens(
        query_start_loc=T([0, 1]), seq_lens=T([6]), req_indices=T([0]), block_table=T([[0]]), window_size=2**31,
        page_size=4), "window_size"),
    (lambda: dsv4.table_slot_mapping(positions=T([0]), req_indices=T([0]), block_table=T([[0]]), page_size=2**63),
     "page_size"),
], ids=["workspace_width", "topk+window", "base+window", "width", "window", "page_size"])
def test_python_int_parameters_that_cannot_fit_are_input_errors(call, words):
    with pytest.raises(kvf.InputError, match="cannot fit") as info:
        call()
    assert words in str(info.value)
