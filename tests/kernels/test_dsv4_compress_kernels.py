"""Triton compressor-path kernels (kvformats_kernels.dsv4.compress) against the torch reference.

Without CUDA the launchers run under the Triton interpreter on CPU tensors (small head dims);
with CUDA the same tests run compiled, and the ``gpu`` tests add production sizes through the
public API and CUDA-graph capture. Compressed rows are held to tokenspeed's bar (spec/upstream.md
§2.5, §13.1): scale (and pad) bytes equal, every value code equal or one code apart, fewer than
1e-4 of the values apart (on the GPU; a few-thousand-value interpreter sample allows 1e-3);
bytes outside the written rows equal, and the same rows written.
"""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.deepseek_v4.pooling import pool_reference
from kvformats.formats import CompressorState
from tests.harness.dsv4_scenarios import SENTINEL, make_batch, state_c, writers
from kvformats.testing.strategies import storage_bytes
from kvformats.testing.tolerance import code_distance

triton = pytest.importorskip("triton")
from kvformats_kernels.dsv4 import compress as K

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
HCA_SMALL = {"seq_lens": (256, 130, 300), "new_tokens": (3, 130, 50), "base": (0, 0, 20), "missing": ((0, 20),)}
CASES = {  # id: (ratio, head_dim, target page size, make_batch overrides)
    "csa": (4, 128, 4, {}),
    "csa512": (4, 512, 64, {"seq_lens": (13, 24), "new_tokens": (13, 6), "base": (0, 2), "missing": ((1, 4),)}),
    "hca": (128, 128, 2, HCA_SMALL),
    "csa66": (4, 66, 2, {"rope_dim": 2}),  # head dims that are not powers of two: padded rows
    "hca192": (128, 192, 2, dict(HCA_SMALL, rope_dim=64)),
}


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(params=["default"] if CUDA else ["default", "blocked", "split"])
def plan(request, launch_settings):
    """Launch plans: the default for the call size; several tokens per program with one
    program per token's chunks; every token's chunks split over programs (atomic join). On the
    GPU the production-size tests reach the other two (prefill, decode HCA), which saves compiles."""
    if request.param == "blocked":
        launch_settings("compress_bounds", "one_token_max_t", 0)
        launch_settings("compress_bounds", "split_max_t", 0)
    elif request.param == "split":
        launch_settings("compress_bounds", "split_max_t", 1 << 30)
    if request.param != "default":
        for k, v in list(K.CONFIG.items()):
            launch_settings("compress", k, dict(v, bd=min(v["bd"], 64)))
    return request.param


def to_dev(b):
    for name in ("state", "state_table", "base", "positions", "req", "state_slots", "target_table", "target_slots",
                 "weight", "cos_sin"):
        setattr(b, name, getattr(b, name).to(DEV))
    return b


def batch(case, **kw):
    ratio, h, tps, over = CASES[case]
    return to_dev(make_batch(ratio, h, tps, **{**over, **kw})), tps


def target_layout(fmt, h, tps, rope=64):
    if fmt == "fp8_ds_mla":
        return kvf.Fp8DsMla(head_dim=h, rope_dim=rope, page_size=tps)
    return kvf.get_format(fmt, head_dim=h, page_size=tps)


def check_rows(layout, got_rows, want_rows, max_fraction: float) -> float:
    """tokenspeed's bar on gathered rows; returns the fraction of values one code apart."""
    d = code_distance(layout, got_rows, want_rows)
    assert d.exact_equal, "scale / pad bytes differ"
    assert d.max_apart <= 1, "a value more than one code apart"
    fraction = d.apart / max(d.values, 1)
    print(f"[{layout.name}] {d.apart} of {d.values} values one code apart ({fraction:.2e}) on {DEV.type}")
    assert d.apart < max_fraction * d.values or d.apart <= 1, "too many values one code apart"  # 1: a small sample
    return fraction


def row_bytes_index(layout, cache, slots) -> torch.Tensor:
    """Storage byte indices of every region of the rows at ``slots``."""
    u8, stride = layout.byte_pages(cache)
    page, row = slots // layout.page_size, slots % layout.page_size
    parts = []
    for r in layout.regions:
        if not r.per_page:
            start = u8.storage_offset() + page * stride + r.offset + row * r.row_stride
            parts.append((start[:, None] + torch.arange(r.nbytes, device=slots.device)[None, :]).reshape(-1))
    return torch.cat(parts)


def check_caches(layout, got, want, written_slots, max_fraction):
    """Written rows within the bar, every other byte equal, the same rows changed."""
    all_slots = torch.arange(got.shape[0] * layout.page_size, device=got.device)
    g_all = layout.gather(got, all_slots, backend="reference")
    w_all = layout.gather(want, all_slots, backend="reference")
    assert torch.equal((g_all != SENTINEL).any(1), (w_all != SENTINEL).any(1)), "different rows written"
    idx = row_bytes_index(layout, got, written_slots)
    gb, wb = storage_bytes(got).clone(), storage_bytes(want).clone()
    gb[idx], wb[idx] = 0, 0
    assert torch.equal(gb, wb), "bytes outside the written rows differ"
    return check_rows(layout, g_all[written_slots], w_all[written_slots], max_fraction)


CPU_FRACTION = 1e-3  # interpreter samples hold a few thousand values: one flip is ~3e-4
GPU_FRACTION = 1e-4  # tokenspeed's own bar, over samples of 40 k+ values


def run_insert(fmt, b, tps, *, direct=True, extra_stride=64, **kw):
    """(kernel cache, reference cache, layout) after one insert from identical sentinel caches."""
    layout = target_layout(fmt, b.weight.shape[0], tps, b.cos_sin.shape[1])
    got, want = (sentinel_cache(layout, b.target_table.numel(), DEV, extra_stride) for _ in range(2))
    args = (b.positions, b.req, b.state_slots, b.state_table, b.base, b.weight, b.eps, b.cos_sin, b.target_slots)
    if fmt == "fp8_ds_mla":
        if direct:
            K.compress_kv_insert(b.state, got, layout, b.ratio, *args)
        else:
            dsv4.compress_kv_insert(b.state, got, ratio=b.ratio, kv_page_size=tps, backend="triton", **b.kwargs(), **kw)
        dsv4.compress_kv_insert(b.state, want, ratio=b.ratio, kv_page_size=tps, backend="reference", **b.kwargs())
    else:
        if direct:
            K.indexer_compress_insert(b.state, got, layout, *args)
        else:
            dsv4.indexer_compress_insert(b.state, got, index_format=fmt, index_page_size=tps, backend="triton",
                                         **b.kwargs("index_slots"), **kw)
        dsv4.indexer_compress_insert(b.state, want, index_format=fmt, index_page_size=tps, backend="reference",
                                     **b.kwargs("index_slots"))
    return got, want, layout


def sentinel_cache(layout, pages, device, extra_stride=64):
    """A cache with padded page strides, every storage byte SENTINEL (dsv4_scenarios', on ``device``)."""
    cache = layout.allocate(pages, device=device, page_stride=layout.page_bytes + extra_stride)
    storage_bytes(cache).fill_(SENTINEL)
    return cache


# ----------------------------------------------------------------------------- save, pool
def test_save_compressor_state_equals_reference():
    g = torch.Generator().manual_seed(5)
    layout = CompressorState(head_dim=64, ratio=4, page_size=4)
    table = torch.tensor([[3, -1, 0], [1, 2, -1]], device=DEV)
    base = torch.tensor([1, 0], device=DEV)
    positions = torch.tensor([4, 5, 6, 9, 10, 0, 7, 8], device=DEV)
    req = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1], device=DEV)
    slots = dsv4.table_slot_mapping(positions=positions, req_indices=req, block_table=table, page_size=4,
                                    block_table_base_offsets=base)
    kv, score, ape = (torch.randn(n, 128, generator=g).to(DEV) for n in (8, 8, 4))
    got, want = (torch.full((4, 4, 256), 7.0, device=DEV) for _ in range(2))
    K.save_compressor_state(layout, kv, score.to(torch.bfloat16), ape, got, positions, slots)
    dsv4.save_compressor_state(kv, score.to(torch.bfloat16), ape, want, ratio=4, positions=positions, slots=slots,
                               backend="reference")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert int((got != 7.0).any(2).sum()) == int((slots >= 0).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_takes_the_ape_halves_as_a_strided_view(dtype):
    """``ape`` as its halves ``[ratio, 2, W/2]`` (here a strided view of an engine's window-order
    table, as the tokenspeed drop-in passes it) stores what the ``[ratio, W]`` table stores, through
    the kernel and the reference, and the view is read where it points (no copy kept)."""
    g = torch.Generator().manual_seed(6)
    layout = CompressorState(head_dim=64, ratio=4, page_size=4)
    positions = torch.tensor([4, 5, 6, 9, 10, 0, 7, 8], device=DEV)
    slots = torch.tensor([0, 3, 5, -1, 7, 9, 12, 14], device=DEV)
    kv, score = (torch.randn(8, 128, generator=g).to(DEV) for _ in range(2))
    ape = torch.randn(4, 128, generator=g).to(DEV, dtype)
    runtime = torch.cat([ape[:, :64], ape[:, 64:]], 0).reshape(4, 128)  # window order
    halves = runtime.view(2, 4, 64).transpose(0, 1)
    assert halves.data_ptr() == runtime.data_ptr() and torch.equal(halves.reshape(4, 128), ape)
    want = torch.full((4, 4, 256), 7.0, device=DEV)
    dsv4.save_compressor_state(kv, score, ape, want, ratio=4, positions=positions, slots=slots, backend="reference")
    for run in (lambda c: K.save_compressor_state(layout, kv, score, halves, c, positions, slots),
                lambda c: dsv4.save_compressor_state(kv, score, halves, c, ratio=4, positions=positions, slots=slots,
                                                     backend="reference")):
        got = torch.full((4, 4, 256), 7.0, device=DEV)
        run(got)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    with pytest.raises(kvf.InputError, match="ape"):
        dsv4.save_compressor_state(kv, score, halves[:, :1], want, ratio=4, positions=positions, slots=slots)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pool_matches_reference(case, plan):
    b, _ = batch(case)
    got = K.pool_compressor_state(b.state, b.ratio, b.positions, b.req, b.state_table, b.base, b.weight, b.eps)
    want = pool_reference(b.state, b.ratio, b.positions, b.req, b.state_table, b.base, b.weight, b.eps)
    exact = (got.view(torch.int32) == want.view(torch.int32)).float().mean().item()
    print(f"[pool {case} {plan}] {exact:.4f} of the float32 values bit-equal on {DEV.type}")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pool_golden_c():
    """spec/upstream.md §12 C (ratio 4, head_dim 2) through the kernel."""
    out = K.pool_compressor_state(state_c().to(DEV), 4, torch.tensor([3, 7], device=DEV),
                                  torch.tensor([0, 0], device=DEV), torch.tensor([[0, 1]], device=DEV), None,
                                  torch.tensor([1.0, 0.5], device=DEV), 1e-6)
    want = torch.tensor([[0.83951861, 0.56903607], [0.83646274, 0.57016009]], dtype=torch.float64)
    assert (out.cpu().double() - want).abs().max().item() < 2e-7


def test_pool_first_group_and_missing_windows():
    """p = 3 pools only the newer half; an all-missing window (empty table row, request out of
    the table) pools to exact zeros, like the reference."""
    b = to_dev(make_batch(4, 128, 4, seq_lens=(8, 8), new_tokens=(8, 8), base=(0, 0), missing=()))
    b.state_table[1] = -1
    req = b.req.clone()
    req[-1] = 5
    got = K.pool_compressor_state(b.state, 4, b.positions, req, b.state_table, None, b.weight, b.eps)
    want = pool_reference(b.state, 4, b.positions, req, b.state_table, None, b.weight, b.eps)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[8:], torch.zeros_like(got[8:]))
    assert got[3].abs().sum() > 0


# ----------------------------------------------------------------------------- inserts
@pytest.mark.parametrize("case", sorted(CASES))
def test_compress_kv_insert_matches_reference(case, plan):
    b, tps = batch(case)
    got, want, layout = run_insert("fp8_ds_mla", b, tps)
    w = writers(b)
    assert int(w.sum()) >= 2
    check_caches(layout, got, want, b.target_slots[w], CPU_FRACTION if not CUDA else 1e-2)


@pytest.mark.parametrize("fmt", ["mxfp4_indexer", "fp8_indexer"])
def test_indexer_compress_insert_matches_reference(fmt, plan):
    b = to_dev(make_batch(4, 128, 4, seed=3))
    got, want, layout = run_insert(fmt, b, 4, extra_stride=12)
    check_caches(layout, got, want, b.target_slots[writers(b)], CPU_FRACTION if not CUDA else 1e-2)


def test_writes_only_group_ends_with_valid_slots():
    """Non-group-ends, state slot -1, target slot -1, a target slot beyond the cache and a rope
    position beyond cos_sin write nothing (the last two reach the kernel only without host
    checks); a request outside the table writes the zero-window row, as the reference."""
    b = to_dev(make_batch(4, 128, 4, seq_lens=(24, 8), new_tokens=(24, 8), base=(0, 0), missing=()))
    layout = target_layout("fp8_ds_mla", 128, 4)
    got = sentinel_cache(layout, b.target_table.numel(), DEV)
    cap = b.target_table.numel() * 4
    b.state_slots[3] = -1           # p = 3
    b.target_slots[7] = -1          # p = 7
    b.target_slots[11] = cap + 3    # p = 11: beyond the cache
    b.req[27] = 9                   # request 1, p = 3: outside the table -> zero row
    cs = b.cos_sin[:20]             # p = 23 rotates at 20: not in the table
    K.compress_kv_insert(b.state, got, layout, 4, b.positions, b.req, b.state_slots, b.state_table, b.base,
                         b.weight, b.eps, cs, b.target_slots)
    rows = layout.gather(got, torch.arange(cap, device=DEV), backend="reference")
    written = set((rows != SENTINEL).any(1).nonzero().reshape(-1).tolist())
    assert written == set(b.target_slots[[15, 19, 27, 31]].tolist())
    zero_row = layout.gather(got, b.target_slots[27:28], backend="reference")[0]
    assert zero_row[:64].tolist() == [0] * 64 and zero_row[-2:].tolist() == [0x69, 0]
    assert int((storage_bytes(got) != SENTINEL).sum()) <= 4 * layout.row_bytes


# ----------------------------------------------------------------------------- golden rows
def _single_row_window(h, p, kv_half):
    """State (1 row per page) in which only position p of the window ending at p exists, its
    newer half holding ``kv_half``: the softmax weight is exactly 1. With weight 2^15 and eps
    2^30 (var < 64 vanishes in it) the RMSNorm multiplies by exactly 2^-15 * 2^15, so the
    pooled row is ``kv_half`` itself."""
    state = torch.zeros(1, 1, 4 * 2 * h)
    state[0, 0, h:2 * h] = kv_half
    assert float(kv_half.double().square().mean()) < 64
    table = torch.full((1, p + 1), -1, dtype=torch.int64)
    table[0, p] = 0
    return {"state": state.to(DEV), "table": table.to(DEV), "weight": torch.full((h,), 2.0 ** 15, device=DEV),
                "eps": 2.0 ** 30}


def _golden_insert(fmt, h, kv_half, cos_sin):
    w = _single_row_window(h, 7, kv_half)
    layout = target_layout(fmt, h, 64)
    cache = sentinel_cache(layout, 1, DEV)
    one = torch.tensor([0], device=DEV)
    args = (torch.tensor([7], device=DEV), one, one, w["table"], None, w["weight"], w["eps"], cos_sin.to(DEV), one)
    if fmt == "fp8_ds_mla":
        K.compress_kv_insert(w["state"], cache, layout, 4, *args)
    else:
        K.indexer_compress_insert(w["state"], cache, layout, *args)
    return layout.gather(cache, one, backend="reference")[0].cpu()


def test_golden_a2_compressed_row_through_kernel():
    """spec/upstream.md §12 A2: example A's vector completed at p = 7 (ratio 4) rotates at 4."""
    import hashlib

    d = torch.arange(512)
    kv = (((37 * d) % 101 - 50).double() * torch.pow(2.0, (d // 64 - 8).double())).float()
    kv[128:192] = 0
    row = _golden_insert("fp8_ds_mla", 512, kv, dsv4.cos_sin_cache(64, 8))
    assert bytes(row[576:].tolist()) == bytes.fromhex("74756977787 97a00".replace(" ", ""))
    assert hashlib.sha256(bytes(row[:576].tolist())).hexdigest() == \
        "1da877a83acfdbc87f784dcda4e054fb7ea4afb92eeeee8dfe3cdce6ca8883e5"


def test_golden_f_indexer_row_through_kernel():
    """spec/upstream.md §12 F (query MXFP4 at position 5) as a compressed indexer row: the window's
    pooled row is F's q, and cos_sin row 4 (the rope position of p = 7) holds row 5."""
    q = torch.tensor([(((11 * i) % 23) - 11) * 0.0625 for i in range(128)])
    cs = dsv4.cos_sin_cache(64, 8)
    cs[4] = cs[5]
    row = _golden_insert("mxfp4_indexer", 128, q, cs)
    packed = ("1c b1 09 1c 64 02 3c be 1c 11 c1 ae f7 ba e0 1b ee bc ec 1c 1f 02 c4 be 65 11 4d ae b3 ba 0e 1b "
              "63 00 a4 b0 19 ab c0 92 f9 aa 0b 92 c0 09 2a b0 53 00 10 90 3a 99 0a 01 61 99 a1 01 c2 00 91 90")
    assert bytes(row[:64].tolist()) == bytes.fromhex(packed)
    assert bytes(row[64:].tolist()) == bytes.fromhex("7c7c7d7e")


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "mxfp4_indexer", "fp8_indexer"])
def test_insert_sample_within_bar(fmt):
    """~90 CSA rows (~11 k values): the fraction one code apart over a larger sample."""
    b = to_dev(make_batch(4, 128, 4, seed=9, seq_lens=(200, 160), new_tokens=(200, 160), base=(0, 3),
                          missing=((1, 20),)))
    got, want, layout = run_insert(fmt, b, 4)
    w = writers(b)
    assert int(w.sum()) >= 80
    check_caches(layout, got, want, b.target_slots[w], CPU_FRACTION if not CUDA else GPU_FRACTION)


# ----------------------------------------------------------------------------- GPU only
PROD = {  # id: (target format, ratio, head_dim, target page size), DeepSeek V4's sizes
    "csa": ("fp8_ds_mla", 4, 512, 64),
    "hca": ("fp8_ds_mla", 128, 512, 2),
    "index-mxfp4": ("mxfp4_indexer", 4, 128, 64),
    "index-fp8": ("fp8_indexer", 4, 128, 64),
}


def prod_batch(ratio, h, tps, size, seed=7):
    """"decode": 64 requests of one token, each ending a group; "prefill": a few long requests
    (base offsets, missing pages), every token of the step (one in ``ratio`` writes)."""
    if size == "decode":
        lens = tuple(ratio * (2 + k % 3) for k in range(64))
        return make_batch(ratio, h, tps, seed=seed, seq_lens=lens, new_tokens=(1,) * 64, base=(0,) * 64, missing=())
    if ratio == 4:
        return make_batch(4, h, tps, seed=seed, seq_lens=(3000, 1500, 700), new_tokens=(3000, 1000, 700),
                          base=(0, 100, 0), missing=((1, 200), (2, 3)))
    return make_batch(128, h, tps, seed=seed, seq_lens=(16384, 8192, 2000), new_tokens=(16384, 4000, 2000),
                      base=(0, 8, 0), missing=((0, 100), (1, 600)))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("size", ["prefill", "decode"])
@pytest.mark.parametrize("case", sorted(PROD))
def test_gpu_insert_production_sizes(case, size):
    fmt, ratio, h, tps = PROD[case]
    b = to_dev(prod_batch(ratio, h, tps, size))
    got, want, layout = run_insert(fmt, b, tps, direct=False)
    w = writers(b)
    check_caches(layout, got, want, b.target_slots[w], GPU_FRACTION)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("size", ["prefill", "decode"])
@pytest.mark.parametrize("case", ["csa", "hca", "index-mxfp4"])
def test_gpu_pool_production_sizes(case, size):
    _, ratio, h, tps = PROD[case]
    b = to_dev(prod_batch(ratio, h, tps, size))
    pick = slice(None, None, 7 if size == "prefill" else 1)  # the reference holds [T, window, h] tensors
    kw = {"ratio": ratio, "positions": b.positions[pick], "req_indices": b.req[pick], "block_table": b.state_table,
              "rms_weight": b.weight, "rms_eps": b.eps, "block_table_base_offsets": b.base}
    got = dsv4.pool_compressor_state(b.state, backend="triton", **kw)
    want = dsv4.pool_compressor_state(b.state, backend="reference", **kw)
    exact = (got.view(torch.int32) == want.view(torch.int32)).float().mean().item()
    print(f"[pool {case} {size}] {exact:.6f} of {got.numel()} float32 values bit-equal on the GPU")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@gpu
@pytest.mark.gpu
def test_gpu_save_public_api():
    g = torch.Generator().manual_seed(3)
    layout = CompressorState(head_dim=512, ratio=4, page_size=4)
    n, pages = 8192, 2100
    kv, score = (torch.randn(n, 1024, generator=g).to(DEV) for _ in range(2))
    ape = torch.randn(4, 1024, generator=g).to(DEV)
    slots = torch.randperm(pages * 4, generator=g)[:n].to(DEV)
    slots[::5] = -1
    positions = torch.randint(0, 1 << 20, (n,), generator=g).to(DEV)
    got, want = (layout.allocate(pages, device=DEV) for _ in range(2))
    for cache, backend in ((got, "triton"), (want, "reference")):
        dsv4.save_compressor_state(kv, score.to(torch.bfloat16), ape, cache, ratio=4, positions=positions,
                                   slots=slots, backend=backend)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(PROD))
def test_gpu_cuda_graph_padded_equals_eager(case):
    """64 decode tokens, the last 8 padding (slots -1), captured once and replayed: the same
    bytes as eager calls, also after the inputs change in place; eager within the bar."""
    fmt, ratio, h, tps = PROD[case]
    b = to_dev(prod_batch(ratio, h, tps, "decode", seed=11))
    b.state_slots[-8:] = -1
    b.target_slots[-8:] = -1
    layout = target_layout(fmt, h, tps)

    def call(cache):
        if fmt == "fp8_ds_mla":
            dsv4.compress_kv_insert(b.state, cache, ratio=ratio, kv_page_size=tps, backend="triton", **b.kwargs())
        else:
            dsv4.indexer_compress_insert(b.state, cache, index_format=fmt, index_page_size=tps, backend="triton",
                                         **b.kwargs("index_slots"))

    pages = b.target_table.numel()
    eager, graphed = sentinel_cache(layout, pages, DEV), sentinel_cache(layout, pages, DEV)
    call(eager)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(graphed)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(storage_bytes(graphed), storage_bytes(eager))
    _, want, _ = run_insert(fmt, b, tps, direct=False)
    check_caches(layout, eager, want, b.target_slots[writers(b)], GPU_FRACTION)
    b.state.copy_(torch.randn(b.state.shape, generator=torch.Generator().manual_seed(12)).to(DEV))
    storage_bytes(eager).fill_(SENTINEL)
    storage_bytes(graphed).fill_(SENTINEL)
    call(eager)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(storage_bytes(graphed), storage_bytes(eager))
