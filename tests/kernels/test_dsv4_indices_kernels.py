"""DeepSeek V4 index-helper kernels == their torch references, element for element.

Without CUDA the launchers run under the Triton interpreter (conftest) on CPU tensors at small
sizes; with CUDA the same tests run compiled, and the ``gpu`` tests add larger sizes through
the public API and one CUDA-graph capture + replay of all seven ops. Each comparison builds its
inputs twice (the kernel and the reference each get fresh copies) and compares the returned
tensors and every watched buffer (out= arenas with sentinel rows), so entries an op must leave
untouched are checked too.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvformats import deepseek_v4 as dsv4
from kvformats.codec import registry
from tests.harness.dsv4_scenarios import make_batch
from tests.harness.index_batches import batches

triton = pytest.importorskip("triton")

from kvformats_kernels import settings  # noqa: E402
from kvformats_kernels.dsv4 import indices as K  # noqa: E402  (after conftest chose interpreter or GPU)

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SENTINEL = 77
# several programs and several column steps, on both row-tile paths (few rows: one per program)
SMALL = {"block": 8, "block_m": 2, "block_j": 32, "few_rows": 4, "few_block_j": 32}


@contextlib.contextmanager
def blocks(small: bool):
    saved = settings.snapshot("indices")
    if small:
        for op, cfg in saved.items():
            settings.change("indices", op, {**cfg, **{k: v for k, v in SMALL.items() if k in cfg}})
    try:
        yield
    finally:
        settings.restore("indices", saved)


def T(x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype, device=DEV).reshape(-1)


def arena(rows: int, cols: int | None = None) -> torch.Tensor:
    shape = (rows,) if cols is None else (rows, cols)
    return torch.full(shape, SENTINEL, dtype=torch.int32 if cols else torch.int64, device=DEV)


def assert_same(a, b):
    if isinstance(b, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert_same(u, v)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.cpu(), b.cpu())


def compare(op: str, build, small: bool = True):
    """``build() -> (args, watched)``: run the kernel and the reference on separate builds."""
    args, watched = build()
    with blocks(small):
        got = K.LAUNCHERS[op](*args)
    ref_args, ref_watched = build()
    want = registry.resolve_model_op("deepseek_v4", op, "reference", DEV)(*ref_args)
    assert_same(got, want)
    assert_same(watched, ref_watched)
    return got


def tokens(b):
    """(request, position) of every token of a drawn batch, in query_start_loc order."""
    return [(r, b["seq"][r] - b["qlen"][r] + i) for r in range(b["r"]) for i in range(b["qlen"][r])]


def spoil(data, reqs, requests):
    """Some request indices replaced by −1 or out-of-range ones (invalid tokens)."""
    return [data.draw(st.sampled_from([r, r, r, -1, requests, 99])) for r in reqs]


def maybe(data, value):
    return value if data.draw(st.booleans()) else None


# ----------------------------------------------------------------------------- registration


def test_every_index_op_has_a_launcher():
    refs = {"table_slot_mapping", "compressed_slot_mapping", "global_topk_indices_and_lens",
            "combine_topk_swa_indices", "combine_dense_swa_indices", "decode_swa_indices_and_lens",
            "dense_prefill_local_compressed_indices"}
    assert set(K.LAUNCHERS) == refs and refs <= set(dsv4.MODEL_OPS)
    for op in refs:  # what backend="triton" (and "auto" on CUDA tensors) runs
        assert registry.resolve_model_op("deepseek_v4", op, "triton", torch.device("cuda")) is K.LAUNCHERS[op]


# ----------------------------------------------------------------------------- hypothesis: kernel == reference


@given(batches(), st.data())
def test_table_slot_mapping(b, data):
    toks = tokens(b) + [(data.draw(st.integers(-1, 5)), data.draw(st.integers(-3, 50))) for _ in range(3)]
    req = spoil(data, [r for r, _ in toks], b["r"])
    valid = maybe(data, [data.draw(st.booleans()) for _ in toks])
    base = maybe(data, b["base"])

    def build():
        return (T([p for _, p in toks]), T(req), T(b["table"]).reshape(b["r"], -1), b["page"], b["ratio"],
                None if base is None else T(base), None if valid is None else T(valid, torch.bool)), []

    compare("table_slot_mapping", build)


@given(batches(), st.data())
def test_compressed_slot_mapping(b, data):
    shift, extra = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 5))
    qsl = [q + shift for q in b["qsl"]]  # tokens before qsl[0] belong to no request
    n = qsl[-1] + extra
    out_rows = maybe(data, n + data.draw(st.integers(0, 4)))
    step = data.draw(st.sampled_from([1, 2]))  # out may be a strided view
    base = maybe(data, b["base"])

    def build():
        buf = None if out_rows is None else arena(out_rows * step)
        return (n, T(qsl), T(b["seq"]), T(b["table"]).reshape(b["r"], -1), b["page"], b["ratio"],
                None if base is None else T(base), None if buf is None else buf[::step]), [] if buf is None else [buf]

    compare("compressed_slot_mapping", build)


@given(batches(), st.data())
def test_global_topk_indices_and_lens(b, data):
    toks = tokens(b)
    k = data.draw(st.integers(0, 40))
    hi = len(b["table"][0]) * b["page"] + 3  # some indices past the table
    topk = [[data.draw(st.sampled_from([-1, data.draw(st.integers(0, hi))])) for _ in range(k)] for _ in toks]
    req = spoil(data, [r for r, _ in toks], b["r"])
    valid = maybe(data, [data.draw(st.booleans()) for _ in toks])
    transposed = data.draw(st.booleans())

    def build():
        t = torch.tensor(topk, dtype=torch.int32, device=DEV).reshape(len(toks), k)
        t = t.t().contiguous().t() if transposed else t  # column-major rows
        return (t, T(req), T(b["table"]).reshape(b["r"], -1), b["page"],
                None if valid is None else T(valid, torch.bool)), []

    compare("global_topk_indices_and_lens", build)


@given(batches(), st.data())
def test_combine_topk_swa_indices(b, data):
    shift, pad = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
    qsl = [q + shift for q in b["qsl"]]
    n = qsl[-1] - qsl[0] + pad  # rows past the last request: all −1
    topk = data.draw(st.integers(0, 40))
    cols = topk + data.draw(st.integers(0, 2))
    idx = [[data.draw(st.sampled_from([-1, -3, data.draw(st.integers(0, 50))])) for _ in range(cols)]
           for _ in range(n)]
    glen = [data.draw(st.integers(0, s + 2)) for s in b["seq"]]  # past seq_len: gather_start < 0
    ww, cb = data.draw(st.sampled_from([200, 1 << 20])), data.draw(st.integers(0, 20))
    dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))

    def build():
        t = torch.tensor(idx, dtype=dtype, device=DEV).reshape(n, cols)
        return (t, T(qsl), T(b["seq"]), T(glen), b["window"], b["ratio"], topk, ww, cb), []

    compare("combine_topk_swa_indices", build)


@given(batches(), st.data())
def test_combine_dense_swa_indices(b, data):
    toks = tokens(b)
    req = spoil(data, [r for r, _ in toks], b["r"])
    clens = [data.draw(st.integers(-1, 15)) for _ in range(b["r"])]
    glen = [data.draw(st.integers(0, s + 2)) for s in b["seq"]]
    ratio = data.draw(st.sampled_from([0, 1, 2, 4, 128]))
    ww, cb = data.draw(st.sampled_from([300, 1 << 20])), data.draw(st.integers(0, 40))

    def build():
        return (T([p for _, p in toks]), T(req), T(b["seq"]), T(clens), T(glen), b["window"], ratio, ww, cb), []

    compare("combine_dense_swa_indices", build)


@given(batches(), st.data())
def test_decode_swa_indices_and_lens(b, data):
    toks = tokens(b)
    req = spoil(data, [r for r, _ in toks], b["r"])
    window = data.draw(st.sampled_from([b["window"], 20, 40]))
    valid = maybe(data, [data.draw(st.booleans()) for _ in toks])
    base = maybe(data, b["base"])
    outs = data.draw(st.sampled_from(["none", "indices", "lens", "both", "column-major"]))
    n = len(toks)

    def build():
        oi = arena(n + 2, window) if outs in ("indices", "both") else None
        oi = arena(window, n + 2).t() if outs == "column-major" else oi
        ol = arena(n + 2).int() if outs in ("lens", "both") else None
        args = (T(b["qsl"]), T(b["seq"]), T(req), T(b["table"]).reshape(b["r"], -1), window, b["page"],
                None if base is None else T(base), None if valid is None else T(valid, torch.bool), oi, ol)
        return args, [o for o in (oi, ol) if o is not None]

    compare("decode_swa_indices_and_lens", build)


@given(st.lists(st.integers(-3, 700), max_size=12), st.sampled_from([1, 4, 128]), st.integers(0, 40),
       st.sampled_from(["none", "wider", "column-major"]))
def test_dense_prefill_local_compressed_indices(pos, ratio, width, out):
    def build():
        buf = None
        if out == "wider":
            buf = arena(len(pos) + 1, width + 3)
        elif out == "column-major":
            buf = arena(width + 2, len(pos) + 1).t()
        return (T(pos), ratio, width, buf), [] if buf is None else [buf]

    compare("dense_prefill_local_compressed_indices", build)


# ----------------------------------------------------------------------------- fixed scenarios


def fixed(*args):
    """A build of constant arguments; a callable among them makes a fresh out buffer per build
    (and is watched)."""
    def build():
        made = [a() if callable(a) else a for a in args]
        return tuple(made), [m for a, m in zip(args, made) if callable(a)]
    return build


@pytest.mark.parametrize("small", [False, True])
def test_dsv4_scenario_slots(small):
    """The compress tests' batch (base offsets, missing pages): the kernel gives the oracle's
    state and compressed slots."""
    b = make_batch(4, 64, 2, seed=3)
    pos, req, state_table, base = (x.to(DEV) for x in (b.positions, b.req, b.state_table, b.base))
    got = compare("table_slot_mapping", fixed(pos, req, state_table, 4, 1, base, None), small)
    assert torch.equal(got.cpu(), b.state_slots)
    got = compare("table_slot_mapping", fixed(pos, req, b.target_table.to(DEV), 2, 4, None, None), small)
    assert torch.equal(got.cpu(), b.target_slots)


@pytest.mark.parametrize("small", [False, True])
def test_int32_inputs_and_bounds(small):
    """int32 index tensors, a column-major table, windows of 1, partly full, full and past
    full, top-k rows exactly full, positions across page boundaries."""
    i32 = torch.int32
    table = torch.tensor([[5, -1, 2, 7, 1], [0, 3, -1, 4, 6], [8, 9, 10, 11, 12]], dtype=i32,
                         device=DEV).t().contiguous().t()
    qsl, seq, base, glen = T([0, 1, 4, 9], i32), T([1, 9, 40], i32), T([0, 1, 3], i32), T([1, 9, 12], i32)
    req, pos = T([0, 1, 1, 1, 2, 2, 2, 2, 2], i32), T([0, 6, 7, 8, 35, 36, 37, 38, 39], i32)
    valid = T([1, 1, 0, 1, 1, 1, 1, 1, 1], torch.bool)
    compare("table_slot_mapping", fixed(pos, req, table, 8, 1, base, valid), small)
    compare("compressed_slot_mapping", fixed(12, qsl, seq, table, 2, 4, base, None), small)
    topk = torch.arange(-1, 80, 3, dtype=i32, device=DEV)[None, :].repeat(9, 1)
    g, lens = compare("global_topk_indices_and_lens", fixed(topk, req, table, 16, valid), small)
    assert lens.tolist() == [26, 26, 0, 26, 26, 26, 26, 26, 26] and g[2].eq(-1).all()
    _, lens = compare("combine_topk_swa_indices", fixed(topk, qsl, seq, glen, 4, 4, 9, 1000, 50), small)
    assert lens.tolist() == [1, 1 + 4, 2 + 4, 2 + 4, 9 + 4, 9 + 4, 9 + 4, 9 + 4, 9 + 4]
    _, lens = compare("combine_dense_swa_indices",
                      fixed(pos, req, seq, T([0, 1, 10], i32), glen, 4, 4, 1000, 9), small)
    assert lens.tolist() == [1, 1 + 4, 1 + 4, 1 + 4, 9 + 4, 9 + 4, 9 + 4, 9 + 4, 9 + 4]
    for window in (1, 5, 40, 41):
        _, lens = compare("decode_swa_indices_and_lens",
                          fixed(qsl, seq, req, table, window, 8, base, valid, None, None), small)
        assert lens.tolist()[:3] == [1, min(7, window), 0]
    compare("dense_prefill_local_compressed_indices", fixed(pos, 4, 10, None), small)


@pytest.mark.parametrize("small", [False, True])
def test_runs_of_empty_requests(small):
    """Requests with no tokens share their query_start_loc entry: every token still finds the
    one request that holds it (the binary search must go right past equal offsets)."""
    qlen = [0, 0, 3, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0]
    qsl = [0]
    for q in qlen:
        qsl.append(qsl[-1] + q)
    seq = [q + 4 * i + 3 for i, q in enumerate(qlen)]
    table = T(list(range(len(qlen)))).reshape(len(qlen), 1)  # slot = request * 64 + position
    got = compare("compressed_slot_mapping", fixed(qsl[-1] + 2, T(qsl), T(seq), table, 64, 1, None, None), small)
    assert got.tolist() == [2 * 64 + 11, 2 * 64 + 12, 2 * 64 + 13, 7 * 64 + 31, 7 * 64 + 32, 11 * 64 + 47, -1, -1]
    _, lens = compare("combine_topk_swa_indices",
                      fixed(T([1] * 12, torch.int32).reshape(6, 2), T(qsl), T(seq), T(seq), 4, 1, 2, 100, 5), small)
    assert lens.tolist() == [2 + 4] * 6


@pytest.mark.parametrize("small", [False, True])
def test_entries_that_would_wrap_are_minus_one(small):
    """Block-table entries whose slots pass the result's dtype (int64 slot mappings, int32 index
    rows) are missing pages, index-row entries beyond int32 are −1: the kernels equal the
    reference there too (issue #25: an entry 2**62 gave slot 1, a workspace offset wrapped)."""
    top64, top32 = (2**63) // 4 - 1, 2**31 // 4 - 1  # the largest entries that fit, page_size 4
    table = T([[2**62, top64, top64 + 1, 3], [top32, top32 + 1, 2**40, -1]]).reshape(2, 4)
    pos, req = T([0, 5, 9, 13, 2, 6, 10, 14]), T([0, 0, 0, 0, 1, 1, 1, 1])
    got = compare("table_slot_mapping", fixed(pos, req, table, 4, 1, None, None), small)
    assert got.tolist() == [-1, top64 * 4 + 1, -1, 13, top32 * 4 + 2, (top32 + 1) * 4 + 2, 2**42 + 2, -1]
    # request 0 at positions 0..3 (page 0: 2**62), request 1 at 10..15 (pages 2: 2**40 and 3: −1)
    got = compare("compressed_slot_mapping", fixed(10, T([0, 4, 10]), T([4, 16]), table, 4, 1, None, None), small)
    assert got.tolist() == [-1] * 4 + [2**42 + 2, 2**42 + 3] + [-1] * 4
    topk = T([[0, 5, 9, 13], [2, 6, 10, 14]], torch.int32).reshape(2, 4)
    g, lens = compare("global_topk_indices_and_lens", fixed(topk, T([0, 1]), table, 4, None), small)
    assert g.tolist() == [[-1, -1, -1, 13], [top32 * 4 + 2, -1, -1, -1]] and lens.tolist() == [4, 4]
    idx, _ = compare("decode_swa_indices_and_lens",
                     fixed(T([0, 1, 2]), T([7, 8]), T([0, 1]), table, 8, 4, None, None, None, None), small)
    assert idx.tolist() == [[-1] * 8, [top32 * 4, top32 * 4 + 1, top32 * 4 + 2, top32 * 4 + 3, -1, -1, -1, -1]]
    ww = 2**30  # request 2's rows start at 2**31: past int32
    qsl, seq, glen = T([0, 1, 2, 3]), T([5, 5, 5]), T([5, 5, 5])
    out, lens = compare("combine_topk_swa_indices",
                        fixed(T([[0, 1]] * 3).reshape(3, 2), qsl, seq, glen, 3, 2, 2, ww, 10), small)
    assert out[:, :5].tolist() == [[0, 1, 12, 13, 14], [ww, ww + 1, ww + 12, ww + 13, ww + 14], [-1] * 5]
    assert lens.tolist() == [5, 5, 5]
    big = T([2**40, -5, 2**31 - 1]).reshape(1, 3)  # int64 top-k entries beyond int32 too
    out, _ = compare("combine_topk_swa_indices", fixed(big, T([0, 1]), T([9]), T([9]), 1, 1, 3, 100, 0), small)
    assert out[0, :3].tolist() == [-1, -5, 2**31 - 1]
    out, _ = compare("combine_dense_swa_indices",
                     fixed(T([4, 4, 4]), T([0, 1, 2]), seq, T([3, 3, 3]), glen, 2, 2, ww, 3), small)
    assert out[:, :5].tolist() == [[0, 1, 6, 7, -1], [ww, ww + 1, ww + 6, ww + 7, -1], [-1] * 5]


def test_no_requests_and_no_rows():
    """Empty block tables (R = 0 or no columns) and zero-row calls give the reference's shapes
    and all −1 rows."""
    empty, nocols, one, zero = torch.zeros((0, 3), dtype=torch.int64, device=DEV), T([]).reshape(2, 0), T([0]), T([])
    pos, req = T([0, 5, 9]), T([0, 1, 0])
    topk = T([0, -1, 3] * 3, torch.int32).reshape(3, 3)
    for table in (empty, nocols):
        r = table.shape[0]
        qsl, seq = T(list(range(0, 2 * r + 1, 2))), T([6] * r)
        compare("table_slot_mapping", fixed(pos, req, table, 4, 1, None, None))
        compare("compressed_slot_mapping", fixed(5, qsl, seq, table, 4, 2, None, lambda: arena(7)))
        compare("global_topk_indices_and_lens", fixed(topk, req, table, 4, None))
        got = compare("decode_swa_indices_and_lens", fixed(qsl, seq, req, table, 3, 4, None, None, None, None))
        assert got[0].eq(-1).all()
    got = compare("combine_topk_swa_indices", fixed(T([1] * 8).reshape(4, 2), T([3]), zero, zero, 3, 4, 2, 100, 5))
    assert got[0].shape == (4, 128) and got[0].eq(-1).all() and got[1].eq(0).all()
    compare("combine_dense_swa_indices", fixed(pos, req, zero, zero, zero, 3, 4, 100, 0))
    compare("table_slot_mapping", fixed(zero, zero, empty, 4, 1, None, None))
    compare("compressed_slot_mapping", fixed(0, one, zero, empty, 4, 2, None, lambda: arena(3)))
    compare("global_topk_indices_and_lens", fixed(topk[:0], zero, empty, 4, None))
    compare("combine_topk_swa_indices", fixed(zero.reshape(0, 1), one, zero, zero, 3, 4, 1, 100, 5))
    compare("combine_dense_swa_indices", fixed(zero, zero, T([4]), T([1]), T([2]), 3, 4, 100, 0))
    compare("decode_swa_indices_and_lens",
            fixed(one, zero, zero, empty, 3, 4, None, None, lambda: arena(2, 3), lambda: arena(2).int()))
    compare("dense_prefill_local_compressed_indices", fixed(zero, 4, 7, None))
    compare("dense_prefill_local_compressed_indices", fixed(pos, 4, 0, lambda: arena(4, 2)))


# ----------------------------------------------------------------------------- GPU: public API, CUDA graphs


def batch_inputs(seed: int, requests: int, tokens: int, pad: int, max_seq: int, k: int = 2048, page: int = 64):
    """Engine-like inputs on DEV: ``tokens`` tokens split over ``requests`` requests (random
    history before them), ``pad`` padding rows (request −1, invalid, top-k all −1), block tables
    of ``page``-row pages with −1 holes and base offsets, top-k rows with −1 holes."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randint(0, tokens + 1, (requests - 1,), generator=g)).values
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([tokens])])
    qlen = qsl[1:] - qsl[:-1]
    seq = qlen + torch.randint(0, max_seq - tokens, (requests,), generator=g)
    cols = -(-max_seq // page) + 1
    table = torch.randperm(requests * cols, generator=g).reshape(requests, cols)
    table[torch.rand(requests, cols, generator=g) < 0.05] = -1
    base = torch.randint(0, 3, (requests,), generator=g)
    req = torch.repeat_interleave(torch.arange(requests), qlen)
    pos = seq[req] - qlen[req] + torch.arange(tokens) - qsl[req]
    comp = torch.div(pos + 1, 4, rounding_mode="floor")
    topk = (torch.rand(tokens, k, generator=g) * comp[:, None]).long()
    topk[(torch.arange(k)[None, :] >= comp[:, None]) | (torch.rand(tokens, k, generator=g) < 0.1)] = -1
    req = torch.cat([req, torch.full((pad,), -1)])
    x = dict(qsl=qsl, seq=seq, glen=torch.minimum(seq, torch.randint(0, 2 * max_seq, (requests,), generator=g)),
             clens=torch.div(seq, 128, rounding_mode="floor"), table=table, base=base, req=req,
             pos=torch.cat([pos, torch.full((pad,), -1)]), valid=req >= 0,
             topk=torch.cat([topk, torch.full((pad, k), -1)]).int())
    return {name: t.to(DEV) for name, t in x.items()}


def all_ops(x, backend: str, outs=None):
    """The seven ops on ``x`` (SWA window 128, top-k 512 for the prefill rows, ratio 4 / 128)."""
    n = x["req"].shape[0]
    outs = outs or {}
    common = dict(backend=backend)
    return [
        dsv4.table_slot_mapping(positions=x["pos"], req_indices=x["req"], block_table=x["table"], page_size=64,
                                block_table_base_offsets=x["base"], is_valid_token=x["valid"], **common),
        dsv4.table_slot_mapping(positions=x["pos"], req_indices=x["req"], block_table=x["table"], page_size=64,
                                entry_stride=4, **common),
        dsv4.compressed_slot_mapping(num_tokens=n, query_start_loc=x["qsl"], seq_lens=x["seq"],
                                     block_table=x["table"], page_size=2, ratio=128, out=outs.get("slots"),
                                     **common),
        dsv4.global_topk_indices_and_lens(topk_indices=x["topk"], req_indices=x["req"], block_table=x["table"],
                                          page_size=64, is_valid_token=x["valid"], **common),
        dsv4.combine_topk_swa_indices(topk_indices=x["topk"], query_start_loc=x["qsl"], seq_lens=x["seq"],
                                      gather_lens=x["glen"], window_size=128, ratio=4, topk=512,
                                      workspace_width=8192, compressed_base=2048, **common),
        dsv4.combine_dense_swa_indices(positions=x["pos"], req_indices=x["req"], seq_lens=x["seq"],
                                       compressed_lens=x["clens"], gather_lens=x["glen"], window_size=128,
                                       ratio=128, workspace_width=4096, compressed_base=1024, **common),
        dsv4.decode_swa_indices_and_lens(query_start_loc=x["qsl"], seq_lens=x["seq"], req_indices=x["req"],
                                         block_table=x["table"], window_size=128, page_size=64,
                                         block_table_base_offsets=x["base"], is_valid_token=x["valid"],
                                         out_indices=outs.get("swa"), out_lens=outs.get("swa_lens"), **common),
        dsv4.dense_prefill_local_compressed_indices(positions=x["pos"], ratio=4, width=512,
                                                    out=outs.get("local"), **common),
    ]


def out_buffers(n: int) -> dict:
    return dict(slots=arena(n + 3), swa=arena(n + 2, 128), swa_lens=arena(n + 2).int(), local=arena(n + 1, 600))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("requests,tokens,pad", [(8, 8192, 100), (64, 64, 0), (3, 40, 24)])
def test_gpu_public_api_matches_reference(requests, tokens, pad):
    x = batch_inputs(5, requests, tokens, pad, max_seq=40000)
    got = all_ops(x, "triton", out_buffers(tokens + pad))
    want = all_ops(x, "reference", out_buffers(tokens + pad))
    assert_same(got, want)
    assert got[3][1].sum() > 0 and (got[4][0] >= 0).any()  # the inputs reach the table and the window


@gpu
@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    """Capture the seven ops on one batch, load another batch of the same shapes (−1 padding
    rows included) into the captured buffers, replay: the graph's outputs equal the eager
    kernels' and the reference's on the new batch, out= buffers included."""
    shape = dict(requests=6, tokens=48, pad=16, max_seq=9000)
    x, outs = batch_inputs(1, **shape), out_buffers(64)
    all_ops(x, "triton", outs)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = all_ops(x, "triton", outs)
    new, new_outs = batch_inputs(2, **shape), out_buffers(64)
    for name in x:
        x[name].copy_(new[name])
    for name in outs:
        outs[name].copy_(new_outs[name])
    graph.replay()
    torch.cuda.synchronize()
    eager = all_ops(batch_inputs(2, **shape), "triton", out_buffers(64))
    want_outs = out_buffers(64)
    want = all_ops(batch_inputs(2, **shape), "reference", want_outs)
    assert_same(captured, eager)
    assert_same(captured, want)
    assert_same([outs[k] for k in sorted(outs)], [want_outs[k] for k in sorted(want_outs)])
    assert captured[6][1][48:].eq(0).all() and captured[3][0][48:].eq(-1).all()  # padding rows
