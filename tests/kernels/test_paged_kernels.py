"""Paged Triton kernels (dequantize_gather, gather_paged, decode_topk) == reference, byte for byte.

Without CUDA they run under the Triton interpreter (conftest) on CPU tensors at small shapes;
with CUDA the same tests run compiled, and the ``gpu`` tests add larger shapes through the
public API and a CUDA-graph capture + replay. Outputs start filled with a sentinel so that
rows the op must leave untouched are checked too.
"""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.codec import paged_ops as paged
from kvformats.codec import registry
from kvformats.errors import BackendUnavailableError

triton = pytest.importorskip("triton")

import kvformats_kernels as kk  # noqa: E402  (after conftest chose interpreter or GPU)
from tests.harness.capabilities import with_declared_cases  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SENTINEL = 0xA5

CURATED = {  # odd geometries and profiles worth their time
    "fp8_ds_mla": kvf.Fp8DsMla(page_size=4),
    "fp8_ds_mla-256": kvf.Fp8DsMla(head_dim=256, rope_dim=64, page_size=3),
    "fp8_ds_mla-rope32": kvf.Fp8DsMla(head_dim=160, rope_dim=32, page_size=2),
    "fp8_ds_mla_v32": kvf.get_format("fp8_ds_mla_v32", head_dim=320, page_size=3, profile="vllm"),
    "fp8_indexer": kvf.Fp8Indexer(page_size=4),
    "mxfp4_indexer": kvf.Mxfp4Indexer(page_size=4),
    "mxfp4_indexer-96": kvf.Mxfp4Indexer(head_dim=96, page_size=2),
    "fp8_indexer-p1": kvf.Fp8Indexer(head_dim=256, page_size=1),  # page size 1: once a Triton 3.6 compile failure
    "fp8_ds_mla_v41": kvf.Fp8DsMlaV41(page_size=4),
    "fp8_ds_mla_v41-96": kvf.Fp8DsMlaV41(head_dim=96, page_size=3),
    "fp4_ds_mla_v41": kvf.Fp4DsMlaV41(page_size=4),
    "fp4_ds_mla_v41-48": kvf.Fp4DsMlaV41(head_dim=48, page_size=5),
    # token-interleaved: one segment, records of data then scale bytes (any profile: reads
    # multiply by the stored scales whatever rule chose them)
    "fp8_ds_mla_v41_interleaved": kvf.Fp8DsMlaV41Interleaved(page_size=4),
    "fp8_ds_mla_v41_interleaved-96": kvf.Fp8DsMlaV41Interleaved(head_dim=96, page_size=3, profile="tokenspeed"),
    "fp4_ds_mla_v41_interleaved": kvf.Fp4DsMlaV41Interleaved(page_size=4),
    "fp4_ds_mla_v41_interleaved-48": kvf.Fp4DsMlaV41Interleaved(head_dim=48, page_size=5, profile="vllm"),
}
# ... and every other format with a Triton dequantize_gather, by its declared layouts (no edit here)
DECODE_LAYOUTS = {k: v for k, v in with_declared_cases(CURATED, op="dequantize_gather").items() if v.paged_reads}
BYTE_LAYOUTS = {k: v for k, v in DECODE_LAYOUTS.items()
                if k not in CURATED or k in ("fp8_ds_mla", "fp8_ds_mla-256", "fp8_ds_mla_v32", "fp8_indexer",
                                             "fp8_indexer-p1", "mxfp4_indexer", "mxfp4_indexer-96", "fp8_ds_mla_v41",
                                             "fp4_ds_mla_v41-48", "fp8_ds_mla_v41_interleaved-96",
                                             "fp4_ds_mla_v41_interleaved")}
ALL_LAYOUTS = dict(DECODE_LAYOUTS, compressor_state=kvf.CompressorState(head_dim=32, ratio=4, page_size=4))


def impl(layout):
    return kk.IMPLEMENTATIONS[layout.name]


def random_cache(layout, pages: int, pad: int, seed: int, shift: int = 0, device=DEV):
    """A cache over random bytes (NaN and subnormal codes included), page stride ``page + pad``
    cache elements, starting ``shift`` bytes into its arena."""
    page = layout.allocate(1)
    elems, word = page[0].numel(), page.element_size()
    total = ((max(pages - 1, 0) * (elems + pad) + elems) * word + 64 + shift)
    raw = torch.randint(0, 256, (total,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    if layout.container_dtype != torch.uint8:
        raw = torch.randn(total // word, generator=torch.Generator().manual_seed(seed)).view(torch.uint8)
    arena = raw.to(device).view(layout.container_dtype)
    return arena.as_strided(layout.cache_shape(pages), (elems + pad, *page.stride()[1:]), shift // word)


def table_of(rows: int, cols: int, pages: int, seed: int, dtype, strided: bool, device=DEV) -> torch.Tensor:
    """A block table with −1 holes and entries beyond the cache; optionally non-contiguous."""
    g = torch.Generator().manual_seed(seed)
    if strided:  # column-major, every other row of the storage: strides (2, 2 * rows)
        full = torch.randint(-1, pages + 2, (cols, 2 * rows), generator=g).to(dtype).to(device)
        return full.t()[::2]
    return torch.randint(-1, pages + 2, (rows, cols), generator=g).to(dtype).to(device)


def raw(t) -> torch.Tensor:
    if isinstance(t, tuple):
        return torch.cat([raw(u).reshape(-1) for u in t])
    return t.contiguous().view(torch.uint8).reshape(-1)


def assert_same(a, b):
    """Bitwise equal, NaN payloads aside (both NaN)."""
    if isinstance(a, tuple):
        for u, v in zip(a, b):
            assert_same(u, v)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        assert torch.equal(na, nb), "NaN positions differ"
        a, b = a.masked_fill(na, 0), b.masked_fill(nb, 0)
    assert torch.equal(raw(a), raw(b))


def sentinel_like(shape, dtype, device=DEV) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    return torch.full((n * torch.empty((), dtype=dtype).element_size(),), SENTINEL, dtype=torch.uint8,
                      device=device).view(dtype).reshape(shape)


# ----------------------------------------------------------------------------- registration


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_ds_mla_v32", "fp8_indexer", "mxfp4_indexer", "compressor_state",
                                 "fp8_ds_mla_v41", "fp4_ds_mla_v41", "fp8_ds_mla_v41_interleaved",
                                 "fp4_ds_mla_v41_interleaved"])
@pytest.mark.parametrize("op", paged.PAGED_OPS)
def test_paged_triton_ops_registered(fmt, op):
    if fmt == "compressor_state" and op != "decode_topk":
        with pytest.raises(BackendUnavailableError):
            registry.resolve(fmt, op, "triton", torch.device("cuda"))
        return
    assert registry.resolve(fmt, op, "triton", torch.device("cuda")) is getattr(kk.IMPLEMENTATIONS[fmt], op)


# ----------------------------------------------------------------------------- dequantize_gather


def _dg_case(layout, seed, table_dtype, strided, with_glen, with_base, device=DEV):
    pages, requests, width, offset = 7, 4, 13, 2
    cache = random_cache(layout, pages, pad=5 + seed % 3, seed=seed, device=device)
    seq_lens = torch.tensor([9, 30, 4, 11])
    glen = torch.tensor([6, 11, 0, 11]) if with_glen else None
    if not with_glen:
        seq_lens = torch.tensor([9, 11, 0, 5])
    base = torch.tensor([0, 3, 1, 2]) if with_base else None
    cols = 10 if layout.page_size > 2 else 18
    table = table_of(requests, cols, pages, seed, table_dtype, strided, device)
    idx = torch.int32 if seed % 2 else torch.int64
    args = dict(block_table=table, seq_lens=seq_lens.to(idx).to(device),
                gather_lens=None if glen is None else glen.to(idx).to(device),
                base=None if base is None else base.to(idx).to(device), offset=offset)
    out = sentinel_like((requests, width, layout.head_dim), layout.decode_dtype, device)
    return cache, out, args


def _run_dg(fn, layout, cache, out, a):
    fn(layout, cache, out, a["block_table"], a["seq_lens"], a["gather_lens"], a["base"], a["offset"])


@pytest.mark.parametrize("name", list(DECODE_LAYOUTS))
@pytest.mark.parametrize("table_dtype,strided", [(torch.int32, False), (torch.int64, True)])
@pytest.mark.parametrize("with_glen,with_base", [(True, True), (False, False), (True, False), (False, True)])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's inf products
def test_dequantize_gather_matches_reference(name, table_dtype, strided, with_glen, with_base):
    layout = DECODE_LAYOUTS[name]
    cache, out, a = _dg_case(layout, len(name) + with_glen, table_dtype, strided, with_glen, with_base)
    want = out.clone()
    paged.dequantize_gather_reference(layout, cache, want, a["block_table"], a["seq_lens"], a["gather_lens"],
                                      a["base"], a["offset"])
    _run_dg(impl(layout).dequantize_gather, layout, cache, out, a)
    assert_same(out, want)


@pytest.mark.parametrize("cs_stores", [0, 1], ids=["plain-stores", "streaming-stores"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_mxfp4_dequantize_gather_either_store_hint(cs_stores, launch_settings):
    """The MXFP4 dequantize_gather's streaming-store knob (indexer.dequantize_gather.mxfp4_cs_stores)
    either way: the hint may change speed, never the bytes written or the rows left alone."""
    from kvformats_kernels import tuning

    key = ("indexer", "dequantize_gather")
    launch_settings("config", key, dict(tuning.CONFIG[key], mxfp4_cs_stores=cs_stores))
    layout = DECODE_LAYOUTS["mxfp4_indexer"]
    cache, out, a = _dg_case(layout, 3, torch.int32, False, True, True)
    want = out.clone()
    paged.dequantize_gather_reference(layout, cache, want, a["block_table"], a["seq_lens"], a["gather_lens"],
                                      a["base"], a["offset"])
    _run_dg(impl(layout).dequantize_gather, layout, cache, out, a)
    assert_same(out, want)


@pytest.mark.parametrize("name", ["fp8_ds_mla", "mxfp4_indexer"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_dequantize_gather_strided_workspace(name):
    """A workspace whose element stride is not 1 (a transposed view): same bytes, tail untouched."""
    layout = DECODE_LAYOUTS[name]
    cache, out, a = _dg_case(layout, 3, torch.int64, False, True, True)
    wide = sentinel_like((layout.head_dim, out.shape[1], out.shape[0]), out.dtype).permute(2, 1, 0)
    want = wide.clone()
    paged.dequantize_gather_reference(layout, cache, want, a["block_table"], a["seq_lens"], a["gather_lens"],
                                      a["base"], a["offset"])
    _run_dg(impl(layout).dequantize_gather, layout, cache, wide, a)
    assert_same(wide.contiguous(), want.contiguous())


def test_dequantize_gather_public_api_and_empty():
    layout = DECODE_LAYOUTS["fp8_indexer"]
    cache = random_cache(layout, 3, 0, seed=9)
    out = sentinel_like((2, 6, layout.head_dim), torch.float32)
    table = torch.tensor([[0, 1], [2, -1]], device=DEV)
    seq = torch.tensor([5, 0], device=DEV)
    want = out.clone()
    layout.dequantize_gather(cache, want, block_table=table, seq_lens=seq, backend="reference")
    impl(layout).dequantize_gather(layout, cache, out, table, seq, None, None, 0)
    assert_same(out, want)
    impl(layout).dequantize_gather(layout, cache, out[:0], table[:0], seq[:0], None, None, 0)  # no requests
    impl(layout).dequantize_gather(layout, cache, out, table, seq, None, None, 6)  # no room: nothing
    assert_same(out, want)


@pytest.mark.parametrize("name", ["fp8_ds_mla", "fp8_indexer"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_dequantize_gather_never_writes_past_the_workspace(name):
    """gather_len beyond the workspace (unchecked inside CUDA-graph capture): only the rows that
    fit are written, as the reference does; the guard rows after the workspace stay intact."""
    layout = DECODE_LAYOUTS[name]
    cache = random_cache(layout, 6, 0, seed=2)
    arena = sentinel_like((3 * 9 + 4, layout.head_dim), layout.decode_dtype)
    out = arena[:27].view(3, 9, layout.head_dim)
    table = torch.randint(-1, 6, (3, 8), generator=torch.Generator().manual_seed(0)).to(DEV)
    seq, glen = torch.tensor([20, 30, 12], device=DEV), torch.tensor([20, 25, 3], device=DEV)
    want = arena.clone()
    paged.dequantize_gather_reference(layout, cache, want[:27].view(3, 9, -1), table, seq, glen, None, 2)
    impl(layout).dequantize_gather(layout, cache, out, table, seq, glen, None, 2)
    assert_same(arena, want)


# ----------------------------------------------------------------------------- gather_paged


def _gp_case(layout, seed, table_dtype, strided, shift, device=DEV):
    pages = 6
    cache = random_cache(layout, pages, pad=3 + seed % 5, seed=seed, shift=shift, device=device)
    lens = torch.tensor([5, 0, 9, 3])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    cols = -(-int(lens.max()) // layout.page_size) + 1
    table = table_of(lens.numel(), cols, pages, seed, table_dtype, strided, device)
    t_rows = int(cu[-1]) + 4  # rows past cu[-1] stay untouched
    views = []
    for i, seg in enumerate(layout.segments):
        pad = (4, 1)[i % 2] if shift else 8
        ws = sentinel_like((t_rows, seg.record_bytes + pad + shift), torch.uint8, device)
        views.append(ws[:, shift:shift + seg.record_bytes])
    return cache, views, table, cu.to(torch.int32 if seed % 2 else torch.int64).to(device)


@pytest.mark.parametrize("name", list(BYTE_LAYOUTS))
@pytest.mark.parametrize("table_dtype,strided,shift", [(torch.int32, False, 0), (torch.int64, True, 0),
                                                        (torch.int64, False, 1)])
@pytest.mark.parametrize("scan_max", [64, 0], ids=["scan", "binary-search"])
def test_gather_paged_matches_reference(name, table_dtype, strided, shift, scan_max, launch_settings):
    """Both ways of finding a row's request: one compare against all of cu_seq_lens (few
    requests, the default here) and the binary search (many requests)."""
    from kvformats_kernels import tuning

    key = ("rows", "gather_paged")
    launch_settings("config", key, dict(tuning.CONFIG[key], cu_scan_max=scan_max))
    layout = BYTE_LAYOUTS[name]
    cache, views, table, cu = _gp_case(layout, len(name), table_dtype, strided, shift)
    want = [v.clone() for v in views]
    paged.gather_paged_reference(layout, cache, want, table, cu)
    impl(layout).gather_paged(layout, cache, views, table, cu)
    for got, exp in zip(views, want):
        assert torch.equal(got, exp)
    # the bytes beside the views (row padding) are untouched too
    for v in views:
        full = v.as_strided((v.shape[0], v.stride(0)), (v.stride(0), 1), v.storage_offset() - shift)
        pad = full[:, :shift].reshape(-1).tolist() + full[:, shift + v.shape[1]:].reshape(-1).tolist()
        assert set(pad) <= {SENTINEL}


def test_gather_paged_public_api_int32_scales():
    """The public path with an int32 [T] scales workspace (one little-endian word per row)."""
    layout = BYTE_LAYOUTS["mxfp4_indexer"]
    cache = random_cache(layout, 4, 0, seed=5)
    table = torch.tensor([[3, 1], [0, -1]], device=DEV)
    cu = torch.tensor([0, 6, 9], device=DEV)
    vals = torch.full((12, 64), SENTINEL, dtype=torch.uint8, device=DEV)
    scales = torch.full((12,), -7, dtype=torch.int32, device=DEV)
    want = (vals.clone(), scales.clone())
    layout.gather_paged(cache, block_table=table, cu_seq_lens=cu, out=want, backend="reference")
    views = paged._workspaces(layout, cache, (vals, scales))
    impl(layout).gather_paged(layout, cache, views, table, cu)
    assert torch.equal(vals, want[0]) and torch.equal(scales, want[1])


# ----------------------------------------------------------------------------- decode_topk


@pytest.mark.parametrize("name", list(ALL_LAYOUTS))
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_decode_topk_matches_reference(name, transposed):
    layout = ALL_LAYOUTS[name]
    pages = 5
    cache = random_cache(layout, pages, 2, seed=len(name))
    g = torch.Generator().manual_seed(7)
    k = torch.randint(-1, pages * layout.page_size, (6, 5) if not transposed else (5, 6), generator=g).to(DEV)
    k = k.t() if transposed else k
    assert_same(impl(layout).decode_topk(layout, cache, k), paged.decode_topk_reference(layout, cache, k))


# ----------------------------------------------------------------------------- GPU only


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_indexer", "mxfp4_indexer"])
def test_gpu_paged_public_api(fmt):
    layout = kvf.get_format(fmt)
    pages = 900
    cache = random_cache(layout, pages, 576, seed=31)
    g = torch.Generator().manual_seed(32)
    requests = 6
    seq = torch.randint(1, 9000, (requests,), generator=g)
    glen = (seq * torch.rand(requests, generator=g)).long()
    glen[0] = seq[0]
    base = torch.randint(0, 3, (requests,), generator=g)
    table = torch.randint(-1, pages + 3, (requests, 9000 // layout.page_size + 2), generator=g)
    args = dict(block_table=table.to(DEV).to(torch.int32), seq_lens=seq.to(DEV), gather_lens=glen.to(DEV),
                block_table_base_offsets=base.to(DEV), offset=3)
    width = int(glen.max()) + 3 + 17
    got = sentinel_like((requests, width, layout.head_dim), layout.decode_dtype)
    want = got.clone()
    layout.dequantize_gather(cache, got, backend="triton", **args)
    layout.dequantize_gather(cache, want, backend="reference", **args)
    assert_same(got, want)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), glen.cumsum(0)]).to(DEV)
    t_rows = int(cu[-1]) + 100
    out_t = tuple(sentinel_like((t_rows, s.record_bytes), torch.uint8) for s in layout.segments)
    out_r = tuple(o.clone() for o in out_t)
    layout.gather_paged(cache, block_table=table.to(DEV), cu_seq_lens=cu, out=out_t, backend="triton")
    layout.gather_paged(cache, block_table=table.to(DEV), cu_seq_lens=cu, out=out_r, backend="reference")
    assert all(torch.equal(a, b) for a, b in zip(out_t, out_r))
    topk = torch.randint(-1, pages * layout.page_size, (300, 512), generator=g).to(DEV)
    assert_same(layout.decode_topk(cache, topk, backend="triton"), layout.decode_topk(cache, topk, backend="reference"))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_indexer", "mxfp4_indexer"])
def test_gpu_paged_cuda_graph_capture_and_replay(fmt):
    layout = kvf.get_format(fmt)
    pages, requests, width = 64, 3, 200
    cache = random_cache(layout, pages, 0, seed=41)
    table = torch.zeros((requests, 8), dtype=torch.int32, device=DEV)
    seq = torch.zeros(requests, dtype=torch.int64, device=DEV)
    glen = torch.zeros_like(seq)
    base = torch.zeros_like(seq)
    cu = torch.zeros(requests + 1, dtype=torch.int64, device=DEV)
    out = sentinel_like((requests, width, layout.head_dim), layout.decode_dtype)
    ws = tuple(sentinel_like((3 * width, s.record_bytes), torch.uint8) for s in layout.segments)
    topk = torch.zeros((16, 32), dtype=torch.int64, device=DEV)

    def ops():
        layout.dequantize_gather(cache, out, block_table=table, seq_lens=seq, gather_lens=glen,
                                 block_table_base_offsets=base, offset=1, backend="triton")
        layout.gather_paged(cache, block_table=table, cu_seq_lens=cu, out=ws, backend="triton")
        return layout.decode_topk(cache, topk, backend="triton")

    ops()  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dec = ops()
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        table.copy_(torch.randint(-1, pages + 2, table.shape, generator=g))
        s = torch.randint(0, 8 * layout.page_size, (requests,), generator=g)
        gl = (s * torch.rand(requests, generator=g)).long()
        seq.copy_(s), glen.copy_(gl), base.copy_(torch.randint(0, 2, (requests,), generator=g))
        cu.copy_(torch.cat([torch.zeros(1, dtype=torch.long), gl.cumsum(0)]))
        topk.copy_(torch.randint(-1, pages * layout.page_size, topk.shape, generator=g))
        out.fill_(0), [w.fill_(SENTINEL) for w in ws]
        out_want, ws_want = out.clone(), tuple(w.clone() for w in ws)
        graph.replay()
        torch.cuda.synchronize()
        paged.dequantize_gather_reference(layout, cache, out_want, table, seq, glen, base, 1)
        paged.gather_paged_reference(layout, cache, list(ws_want), table, cu)
        assert_same(out, out_want)
        assert all(torch.equal(a, b) for a, b in zip(ws, ws_want))
        assert_same(dec, paged.decode_topk_reference(layout, cache, topk))
