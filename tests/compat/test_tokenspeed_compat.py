"""kvformats.compat.tokenspeed: tokenspeed's names and signatures (against the table read from the
upstream files, spec/tokenspeed-signatures.json), and every function's results and written bytes
against the native kvformats call on the same inputs, random and adversarial, on both backends
(the Triton kernels under the interpreter without CUDA); typed errors before any write; the
return conventions (views, strides, padded scale storage); torch.compile without graph breaks.
tokenspeed's own functions are compared on a GPU in test_tokenspeed_compat_gpu.py."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.codec import registry
from kvformats.compat import tokenspeed as ts
from kvformats.errors import InputError, InputTypeError, KVFormatError, LayoutError
from kvformats.formats import CompressorState, Fp8DsMla, Fp8Indexer, Mxfp4Indexer
from kvformats.layout import storage_bytes
from tests.harness.compat_calls import compat_call_pairs
from tests.compat.tokenspeed_forms import KINDS, check_forms
from tests.harness.dsv4_scenarios import make_batch, sentinel_cache
from tests.harness.routing import auto_resolves_to_triton

ROOT = Path(__file__).resolve().parents[2]
SIGS = json.loads((ROOT / "spec" / "tokenspeed-signatures.json").read_text())
HCA_SMALL = {"seq_lens": (256, 130, 40), "new_tokens": (3, 4, 40), "base": (0, 0, 0), "missing": ((0, 20),)}


@pytest.fixture(params=["reference", "triton"])
def backend(request, monkeypatch):
    """Both sides resolve ``backend="auto"`` the same way: the reference, or (param "triton") the
    Triton kernels, under the interpreter on CPU tensors with the kernels' device-record checks."""
    if request.param == "triton" and not torch.cuda.is_available():
        pytest.importorskip("triton")
        auto_resolves_to_triton(monkeypatch)
    registry._RESOLVED.clear()
    if request.param == "triton" and not torch.cuda.is_available():  # the kernels really run
        assert registry.is_kernel(registry.resolve_model_op("deepseek_v4", "swa_insert", "auto", torch.device("cpu")))
    yield request.param
    registry._RESOLVED.clear()


def same(a, b):
    """Equal results: the same structure, dtypes, shapes, strides and bytes (NaNs included)."""
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
        return
    if a is None or b is None:
        assert a is None and b is None
        return
    assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride())
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def clone_cache(c):
    st = storage_bytes(c).clone()
    return torch.empty(0, dtype=c.dtype).set_(st.untyped_storage(), c.storage_offset(), c.shape, c.stride())


# ----- names and signatures ---------------------------------------------------------------------
FORMS = {"f3e4d1e2": SIGS["functions"], **{key: form["functions"] for key, form in SIGS["forms"].items()}}
# drop-ins whose parameter list is the union of two versions' (docs/porting-from-tokenspeed.md,
# "Call forms"): equal to no single version's, taking each version's calls
UNIONS = {"fused_qnorm_rope_kv_insert", "deepseek_v4_csa_compress_kv_cache_insert",
          "deepseek_v4_hca_compress_kv_cache_insert", "gather_paged_indexer_fp8_cache"}


def test_names_are_tokenspeeds():
    assert ts.OPS_ALL == tuple(SIGS["ops_all"]["names"])
    assert len(ts.OPS_ALL) == 19
    assert ts.RELEASE_OPS_ALL == tuple(SIGS["forms"]["0.1.1"]["ops_all"]) and len(ts.RELEASE_OPS_ALL) == 10
    assert ts.MAIN_OPS_ALL == tuple(SIGS["forms"]["f4d8ec6e"]["ops_all"]["names"]) and len(ts.MAIN_OPS_ALL) == 21
    assert set(ts.__all__) == {*ts.OPS_ALL, *ts.RELEASE_OPS_ALL, *ts.MAIN_OPS_ALL, *ts.ENGINE_NAMES,
                               *SIGS["spec_imports"]["names"]}
    assert set(ts.RELEASE_OPS_ALL) - set(ts.OPS_ALL) - set(ts.ENGINE_NAMES) == {"deepseek_v4_prepare_indexer_q"}
    assert {n for form in FORMS.values() for n in form} | set(SIGS["constants"]) == set(ts.__all__)
    ns = {}
    exec("from kvformats.compat.tokenspeed import *", ns)
    assert set(ns) - {"__builtins__"} == set(ts.__all__)


@pytest.mark.parametrize("form,name", [(f, n) for f, fns in FORMS.items() for n in sorted(fns)])
def test_signature_takes_tokenspeeds_call_forms(form, name):
    """Every call form of each version (positional, by keyword, defaults left out) binds, each
    argument landing in the drop-in's parameter of that name (or its documented alias); the
    signature is the version's own wherever the versions agree."""
    want = FORMS[form][name]
    assert want.get("commit", SIGS["forms"].get(form, {}).get("commit", "")) in ("", *SIGS["commits"].values())
    sig = inspect.signature(getattr(ts, name))
    check_forms(name, sig, want["params"])
    got = [(p.name, p.kind, p.default) for p in sig.parameters.values()]
    if name not in UNIONS:
        exact = [[(p["name"], KINDS[p["kind"]], p.get("default", inspect.Parameter.empty)) for p in f[name]["params"]]
                 for f in FORMS.values() if name in f]
        assert got in exact  # one version's signature (the latest where one added a parameter)


def test_constants_and_spec_helpers():
    for name, c in SIGS["constants"].items():
        assert getattr(ts, name) == c["value"] and type(getattr(ts, name)) is type(c["value"])
    for h, r in ((512, 64), (192, 64), (128, 64)):
        lay = Fp8DsMla(head_dim=h, rope_dim=r)
        assert ts.deepseek_v4_nope_dim(h, r) == h - r
        assert ts.deepseek_v4_swa_token_stride(h, r) == h - r + 2 * r
        assert ts.deepseek_v4_swa_scale_dim(h, r) == (h - r) // 64 + 1
        assert ts.deepseek_v4_swa_row_bytes(h, r) == lay.row_bytes
    assert ts.deepseek_v4_swa_row_bytes(512, 64) == 584
    for d in (128, 256, 512):
        assert ts.deepseek_v4_indexer_fp8_row_bytes(d) == Fp8Indexer(head_dim=d).row_bytes
        assert ts.deepseek_v4_indexer_fp8_scale_bytes(d) == d // 32
        assert ts.deepseek_v4_indexer_fp8_layout_from_row_bytes(Fp8Indexer(head_dim=d).row_bytes) == (d, d // 32)
    for d in (32, 64, 128, 256):
        rb = Mxfp4Indexer(head_dim=d).row_bytes
        assert ts.deepseek_v4_indexer_mxfp4_row_bytes(d) == rb
        assert ts.deepseek_v4_indexer_mxfp4_layout_from_row_bytes(rb) == (d, d // 2, d // 32)
    for bad in (lambda: ts.deepseek_v4_nope_dim(64, 64), lambda: ts.deepseek_v4_swa_scale_dim(100, 64),
                lambda: ts.deepseek_v4_indexer_fp8_scale_bytes(100), lambda: ts.deepseek_v4_indexer_mxfp4_row_bytes(33),
                lambda: ts.deepseek_v4_indexer_mxfp4_row_bytes(48),
                lambda: ts.deepseek_v4_indexer_fp8_layout_from_row_bytes(130),
                lambda: ts.deepseek_v4_indexer_mxfp4_layout_from_row_bytes(70)):
        with pytest.raises(LayoutError):
            bad()


# ----- cache writers ----------------------------------------------------------------------------
def test_swa_insert(backend):
    g = torch.Generator().manual_seed(1)
    t, h = 6, 2
    lay = Fp8DsMla(head_dim=512, rope_dim=64, page_size=4)
    cache = sentinel_cache(lay, 3)
    q = torch.randn(t, h, 512, generator=g).to(torch.bfloat16)
    kv = (torch.randn(t, 512, generator=g) * 30).to(torch.bfloat16)
    kv[1, :64] = 0
    kv[2, 64:128] = -0.0
    cs = dsv4.cos_sin_cache(64, 64)
    pos = torch.tensor([0, 5, 7, 31, 63, 9])
    slots = torch.tensor([3, -1, 0, 11, 40])  # fewer slots than tokens; 40 is beyond the cache (skipped)
    q1, q2 = q.clone(), q.clone()
    c1, c2 = clone_cache(cache), clone_cache(cache)
    assert ts.fused_qnorm_rope_kv_insert(q1, kv, c1, slots, pos, cs, 1e-6, 4) is None
    dsv4.swa_insert(q2, kv, c2, slots, pos, cs, 1e-6, page_size=4)
    same(q1, q2)
    same(storage_bytes(c1), storage_bytes(c2))
    assert not torch.equal(storage_bytes(c1), storage_bytes(cache))


def _compress_args(b, cache, tps):
    return (b.state, b.req, b.positions, b.state_slots, b.state_table, b.state.shape[1], b.weight, b.eps, b.cos_sin,
            cache, b.target_slots, tps)


@pytest.mark.parametrize("case", ["csa", "hca"])
def test_compress_kv_insert(case, backend):
    ratio, h, tps, over = {"csa": (4, 128, 4, {}), "hca": (128, 128, 2, HCA_SMALL)}[case]
    b = make_batch(ratio, h, tps, **over)
    lay = Fp8DsMla(head_dim=h, rope_dim=64, page_size=tps)
    cache = sentinel_cache(lay, int(b.target_table.max()) + 1)
    c1, c2 = clone_cache(cache), clone_cache(cache)
    fn = ts.deepseek_v4_csa_compress_kv_cache_insert if ratio == 4 else ts.deepseek_v4_hca_compress_kv_cache_insert
    fn(*_compress_args(b, c1, tps), block_table_base_offsets=b.base)
    dsv4.compress_kv_insert(b.state, c2, ratio=ratio, kv_page_size=tps, **b.kwargs())
    same(storage_bytes(c1), storage_bytes(c2))
    assert not torch.equal(storage_bytes(c1), storage_bytes(cache))
    # tokenspeed's length rule: the tokens are the shortest of the slot mappings and positions
    n = b.positions.shape[0] - 3
    pad = torch.full((3,), -1, dtype=b.state_slots.dtype)
    c3, c4 = clone_cache(cache), clone_cache(cache)
    args = list(_compress_args(b, c3, tps))
    args[1] = torch.cat([b.req, torch.zeros(3, dtype=b.req.dtype)])  # longer: the extra entries are not read
    args[3] = b.state_slots[:n]
    args[10] = torch.cat([b.target_slots, pad]) if ratio == 4 else b.target_slots
    fn(*args, block_table_base_offsets=b.base)
    kw = b.kwargs()
    kw = {k: (v[:n] if k in ("positions", "req_indices", "state_slots", "kv_slots") else v) for k, v in kw.items()}
    dsv4.compress_kv_insert(b.state, c4, ratio=ratio, kv_page_size=tps, **kw)
    same(storage_bytes(c3), storage_bytes(c4))


@pytest.mark.parametrize("use_fp4", [True, False])
def test_indexer_insert(use_fp4, backend):
    b = make_batch(4, 128, 64)
    lay = (Mxfp4Indexer if use_fp4 else Fp8Indexer)(head_dim=128, page_size=64)
    cache = sentinel_cache(lay, int(b.target_table.max()) + 1, extra_stride=0)
    c1, c2 = clone_cache(cache), clone_cache(cache)
    ts.deepseek_v4_csa_indexer_cache_insert(*_compress_args(b, c1, 64), use_fp4)  # no base offsets
    kw = b.kwargs("index_slots")
    kw["block_table_base_offsets"] = None
    dsv4.indexer_compress_insert(b.state, c2, index_format=lay.name, index_page_size=64, **kw)
    same(storage_bytes(c1), storage_bytes(c2))


def _reorder_c4(ape):
    """tokenspeed's weight-loading reorder of a C4 ape (spec/upstream.md §5.2): the first halves of
    the four rows, then the second halves, refolded to [4, W]."""
    h = ape.shape[1] // 2
    return torch.cat([ape[:, :h], ape[:, h:]], dim=0).reshape(ape.shape)


def test_save_state_example_c():
    """Example C (spec/upstream.md §12): tokenspeed's callers pass the reordered ape."""
    kv = torch.tensor([[0.5 * p + j for j in range(4)] for p in range(8)])
    score = torch.tensor([[0.1 * ((3 * p + j) % 5) for j in range(4)] for p in range(8)])
    ape = torch.tensor([[0.01 * (10 * r + j) for j in range(4)] for r in range(4)])
    runtime = _reorder_c4(ape)
    assert torch.allclose(runtime[1], torch.tensor([0.20, 0.21, 0.30, 0.31]))
    state = torch.zeros(2, 4, 8)
    ts.save_deepseek_v4_compressor_state(kv, score, runtime, state, torch.arange(8), torch.arange(8), 4, 4)
    want = torch.zeros(2, 4, 8)
    dsv4.save_compressor_state(kv, score, ape, want, ratio=4, positions=torch.arange(8), slots=torch.arange(8))
    same(state, want)
    assert torch.allclose(state[0, 0], torch.tensor([0, 1, 2, 3, 0, 0.11, 0.22, 0.33]))
    assert torch.allclose(state[1, 1], torch.tensor([2.5, 3.5, 4.5, 5.5, 0.10, 0.21, 0.32, 0.43]))
    runtime.mul_(2)  # a weight changed in place is read again (reordered on every call)
    ts.save_deepseek_v4_compressor_state(kv, score, runtime, state, torch.arange(8), torch.arange(8), 4, 4)
    dsv4.save_compressor_state(kv, score, ape * 2, want, ratio=4, positions=torch.arange(8), slots=torch.arange(8))
    same(state, want)


@pytest.mark.parametrize("ratio", [4, 128])
def test_save_state(ratio, backend):
    g = torch.Generator().manual_seed(2)
    lay = CompressorState(head_dim=64, ratio=ratio, page_size=4 if ratio == 4 else 8)
    w, n = lay.width, 10
    kv, score = torch.randn(n, w, generator=g), torch.randn(n, w, generator=g)
    ape = torch.randn(ratio, w, generator=g)
    runtime = _reorder_c4(ape) if ratio == 4 else ape
    state = torch.randn(6, lay.page_size, 2 * w, generator=g)
    slots = torch.tensor([0, 5, -1, 7, 12, 3, 22, -1])  # shorter than kv: tokenspeed writes the first 8
    pos = torch.arange(100, 100 + n)
    s1, s2 = state.clone(), state.clone()
    ts.save_deepseek_v4_compressor_state(kv, score, runtime, s1, slots, pos, lay.page_size, ratio)
    dsv4.save_compressor_state(kv[:8], score[:8], ape, s2, ratio=ratio, positions=pos[:8], slots=slots)
    same(s1, s2)


def _rows(g, n, d):
    x = torch.randn(n, d, generator=g) * torch.logspace(-6, 6, n)[:, None]
    x[0] = 0
    x[1] = -0.0
    x[2, :32] = 1e-30
    x[3, ::2] = 6 * 2.0 ** 5  # exact block maxima
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_indexer_write_read(fmt, backend):
    g = torch.Generator().manual_seed(3)
    lay = (Fp8Indexer if fmt == "fp8" else Mxfp4Indexer)(head_dim=128, page_size=16)
    write = getattr(ts, f"write_deepseek_v4_indexer_{fmt}_cache")
    read = getattr(ts, f"read_deepseek_v4_indexer_{fmt}_cache")
    x = _rows(g, 12, 128)
    slots = torch.tensor([0, 17, -1, 40, 5, 63, 1, 2, 33, -1, 60, 61, 62, 9])  # longer than x: first 12 written
    cache = lay.allocate(4)
    storage_bytes(cache).copy_(torch.randint(0, 256, storage_bytes(cache).shape, generator=g, dtype=torch.uint8))
    c1, c2 = clone_cache(cache), clone_cache(cache)
    assert write(x, c1, slots, 16) is None
    lay.encode(x, c2, slots[:12])
    same(storage_bytes(c1), storage_bytes(c2))
    read_slots = torch.tensor([0, 17, -1, 40, 63, 7, 30])  # written, skipped and random (NaN, 0xFF) rows
    same(read(c1, read_slots, 16), lay.decode(c2, read_slots))


def test_dequantize_fp8_ds_mla(backend):
    g = torch.Generator().manual_seed(4)
    lay = Fp8DsMla(head_dim=512, rope_dim=64, page_size=8)
    cache = lay.allocate(3, page_stride=lay.page_bytes + 576)
    storage_bytes(cache).copy_(torch.randint(0, 256, storage_bytes(cache).shape, generator=g, dtype=torch.uint8))
    slots = torch.tensor([0, 23, -1, 7, 8, 16])
    same(ts.dequantize_deepseek_v4_fp8_ds_mla_cache(cache, slots, 8, head_dim=512, rope_dim=64),
         lay.decode(cache, slots))
    empty = ts.dequantize_deepseek_v4_fp8_ds_mla_cache(cache, slots[:0], 8, head_dim=512, rope_dim=64)
    assert empty.shape == (0, 512) and empty.dtype == torch.bfloat16


# ----- query and output transforms ---------------------------------------------------------------
@pytest.mark.parametrize("t", [0, 5])
def test_prepare_indexer_q(t, backend):
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(t, 3, 128, generator=g) * torch.logspace(-3, 4, 3)[None, :, None]).to(torch.bfloat16)
    pos = torch.randint(0, 64, (t,), generator=g)
    cs = dsv4.cos_sin_cache(64, 64)
    for weights in (torch.randn(t, 3, generator=g), torch.randn(t, 3, 1, generator=g)):
        got = ts.deepseek_v4_prepare_indexer_q_mxfp4(q, pos, cs, weights, 128 ** -0.5, 3 ** -0.5)
        (packed, scale), w = dsv4.prepare_indexer_q_mxfp4(q, pos, cs, weights, 128 ** -0.5, 3 ** -0.5)
        same(got, ((packed.contiguous(), scale), w))
        assert got[0][0].is_contiguous() and got[0][1].is_contiguous() and got[0][1].dtype == torch.int32
        same(ts.deepseek_v4_prepare_indexer_q_fp8(q, pos, cs, weights, 128 ** -0.5, 3 ** -0.5),
             dsv4.prepare_indexer_q_fp8(q, pos, cs, weights, 128 ** -0.5, 3 ** -0.5))


@pytest.mark.parametrize("tma", [True, False])
def test_inv_rope_fp8_quant(tma, backend):
    g = torch.Generator().manual_seed(6)
    t, groups, hpg, d = 5, 2, 2, 512
    o = (torch.randn(t, groups * hpg, d, generator=g) * 100).to(torch.bfloat16)
    o[0, 0] = 0
    pos = torch.randint(0, 64, (t,), generator=g)
    cs = dsv4.cos_sin_cache(64, 64)
    got = ts.deepseek_v4_fused_inv_rope_fp8_quant(o, pos, cs, groups, hpg, tma_aligned_scales=tma)
    same(got, dsv4.inv_rope_fp8_quant(o, pos, cs, n_groups=groups, heads_per_group=hpg, tma_aligned_scales=tma))
    q, s = got
    # tokenspeed's views: q is [T, G, Hg*D] over a [G, T, Hg*D] buffer; the scales are stored
    # token-fastest with T padded to 4 (zeros), [G, inner, T_pad] seen as [T, G, inner]
    inner, t_pad = (hpg * d // 128 + 3) // 4 if tma else hpg * d // 128, 8
    assert q.stride() == (hpg * d, t * hpg * d, 1) and q.dtype == torch.float8_e4m3fn
    assert s.shape == (t, groups, inner) and s.stride() == (1, inner * t_pad, t_pad)
    assert s.dtype == (torch.int32 if tma else torch.float32)
    store = torch.empty(0, dtype=s.dtype).set_(s.untyped_storage())
    assert store.numel() == groups * inner * t_pad
    assert torch.count_nonzero(store.view(groups, inner, t_pad)[:, :, t:]) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hadamard_transform(dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, 128, generator=g).to(dtype)
    y = ts.hadamard_transform(x, scale=128 ** -0.5)
    assert y.dtype == dtype and y.shape == x.shape
    same(y, dsv4.hadamard_transform(x, 128 ** -0.5).to(dtype))
    same(ts.hadamard_transform(x), dsv4.hadamard_transform(x, 1.0).to(dtype))  # tokenspeed's default scale 1


# ----- index helpers and paged reads -------------------------------------------------------------
def _step():
    """Three requests: a prefill continuation, a decode token, an empty one; holes in the tables."""
    qsl = torch.tensor([0, 6, 7, 7])
    seq = torch.tensor([14, 30, 3])
    req = torch.tensor([0, 0, 0, 0, 0, 0, 1])
    pos = torch.tensor([8, 9, 10, 11, 12, 13, 29])
    table = torch.tensor([[3, 1, -1, 0], [2, 5, 6, 4], [-1, -1, -1, -1]], dtype=torch.int32)
    return qsl, seq, req, pos, table


def test_index_helpers(backend):
    qsl, seq, req, pos, table = _step()
    out = torch.full((10,), 77, dtype=torch.int64)
    got = ts.deepseek_v4_compressed_slot_mapping(num_tokens=7, query_start_loc=qsl, seq_lens=seq, block_table=table,
                                                 block_size=2, compress_ratio=2, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (7,) and (out[7:] == -1).all()
    same(got, dsv4.compressed_slot_mapping(num_tokens=7, query_start_loc=qsl, seq_lens=seq, block_table=table,
                                           page_size=2, ratio=2))
    topk = torch.tensor([[0, 3, -1], [5, 1, 2], [7, -1, -1], [0, 1, 2], [9, 9, 9], [1, -1, 0], [4, 2, 6]],
                        dtype=torch.int32)
    valid = torch.tensor([True, True, False, True, True, True, True])
    same(ts.deepseek_v4_compute_global_topk_indices_and_lens(topk_indices=topk, token_to_req_indices=req,
                                                             block_table=table, block_size=2, is_valid_token=valid),
         dsv4.global_topk_indices_and_lens(topk_indices=topk, req_indices=req, block_table=table, page_size=2,
                                           is_valid_token=valid))
    glen = torch.tensor([10, 4, 3])
    same(ts.deepseek_v4_combine_topk_swa_indices(topk_indices=topk, query_start_loc=qsl, seq_lens=seq, gather_lens=glen,
                                                 window_size=4, compress_ratio=4, topk=3, workspace_width=40,
                                                 compressed_base=20),
         dsv4.combine_topk_swa_indices(topk_indices=topk, query_start_loc=qsl, seq_lens=seq, gather_lens=glen,
                                       window_size=4, ratio=4, topk=3, workspace_width=40, compressed_base=20))
    clens = torch.tensor([2, 7, 0])
    same(ts.deepseek_v4_combine_dense_swa_indices(positions=pos, token_to_req_indices=req, seq_lens=seq,
                                                  compressed_lens=clens, gather_lens=glen, window_size=4,
                                                  compress_ratio=4, workspace_width=40, compressed_base=20),
         dsv4.combine_dense_swa_indices(positions=pos, req_indices=req, seq_lens=seq, compressed_lens=clens,
                                        gather_lens=glen, window_size=4, ratio=4, workspace_width=40,
                                        compressed_base=20))
    base = torch.tensor([1, 0, 0])
    oi, ol = torch.full((9, 5), 55, dtype=torch.int32), torch.full((9,), 55, dtype=torch.int32)
    got = ts.deepseek_v4_decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req,
                                                     block_table=table, window_size=5, block_size=4,
                                                     block_table_base_offsets=base, is_valid_token=valid,
                                                     out_indices=oi, out_lens=ol)
    assert got[0] is oi and got[1] is ol
    want = dsv4.decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, req_indices=req, block_table=table,
                                            window_size=5, page_size=4, block_table_base_offsets=base,
                                            is_valid_token=valid)
    same((oi[:7], ol[:7]), want)
    assert (oi[7:] == 55).all() and (ol[7:] == 55).all()
    same(ts.deepseek_v4_decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req,
                                                    block_table=table, window_size=5, block_size=4),
         dsv4.decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, req_indices=req, block_table=table,
                                          window_size=5, page_size=4))
    out = torch.full((9, 12), 3, dtype=torch.int32)
    got = ts.deepseek_v4_build_dense_prefill_local_compressed_indices(positions=pos, compress_ratio=4, width=6, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (7, 6) and got.stride() == (12, 1)
    same(got, dsv4.dense_prefill_local_compressed_indices(positions=pos, ratio=4, width=6, out=out.clone()))


def test_dequantize_and_gather(backend):
    g = torch.Generator().manual_seed(8)
    lay = Fp8DsMla(head_dim=512, rope_dim=64, page_size=4)
    cache = lay.allocate(7)
    storage_bytes(cache).copy_(torch.randint(0, 256, storage_bytes(cache).shape, generator=g, dtype=torch.uint8))
    table = torch.tensor([[3, 1, -1, 0], [2, 5, 6, 4]], dtype=torch.int32)
    seq, glen, base = torch.tensor([9, 14]), torch.tensor([9, 5]), torch.tensor([0, 1])
    out = torch.full((2, 12, 512), 7.0, dtype=torch.bfloat16)
    o1, o2 = out.clone(), out.clone()
    assert ts.deepseek_v4_dequantize_and_gather_k_cache(out=o1, cache_2d=cache, seq_lens=seq, gather_lens=glen,
                                                        block_table=table, block_size=4, offset=2,
                                                        block_table_base_offsets=base) is None
    lay.dequantize_gather(cache, o2, block_table=table, seq_lens=seq, gather_lens=glen, block_table_base_offsets=base,
                          offset=2)
    same(o1, o2)


def test_mxfp4_gathers(backend):
    g = torch.Generator().manual_seed(9)
    lay = Mxfp4Indexer(head_dim=128, page_size=4)
    cache = lay.allocate(6)
    storage_bytes(cache).copy_(torch.randint(0, 256, storage_bytes(cache).shape, generator=g, dtype=torch.uint8))
    slots = torch.tensor([0, 23, -1, 7, 9])
    values, scales = torch.full((8, 80), 0xCC, dtype=torch.uint8), torch.full((8, 6), 0xDD, dtype=torch.uint8)
    assert ts.deepseek_v4_gather_indexer_mxfp4_cache(cache_2d=cache, slot_mapping=slots, values_out=values,
                                                     scales_out=scales, block_size=4) is None
    rows = lay.gather(cache, slots)
    assert torch.equal(values[:5, :64], rows[:, :64]) and torch.equal(scales[:5, :4], rows[:, 64:])
    assert (values[5:] == 0xCC).all() and (values[:, 64:] == 0xCC).all() and (scales[:, 4:] == 0xDD).all()
    table = torch.tensor([[3, 1, -1], [2, 5, 0]], dtype=torch.int32)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    v1, s1 = torch.full((11, 64), 0xCC, dtype=torch.uint8), torch.full((11, 4), 0xDD, dtype=torch.uint8)
    v2, s2 = v1.clone(), s1.clone()
    assert ts.indexer_mxfp4_paged_gather(cache, v1, s1, table, cu, 4) is None
    lay.gather_paged(cache, block_table=table, cu_seq_lens=cu, out=(v2, s2))
    same((v1, s1), (v2, s2))


def test_fp8_paged_gather(backend):
    g = torch.Generator().manual_seed(10)
    lay = Fp8Indexer(head_dim=128, page_size=4)
    cache = lay.allocate(6)
    storage_bytes(cache).copy_(torch.randint(0, 256, storage_bytes(cache).shape, generator=g, dtype=torch.uint8))
    table = torch.tensor([[3, 1, -1], [2, 5, 0]], dtype=torch.int32)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    k, s = ts.gather_paged_indexer_fp8_cache(cache, table, cu, 4)
    values, scales = lay.gather_paged(cache, block_table=table, cu_seq_lens=cu)
    assert k.dtype == torch.float8_e4m3fn and k.shape == (9, 128) and k.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (9,) and s.is_contiguous()
    same(k.view(torch.uint8), values)
    same(s.view(torch.uint8).view(9, 4), scales)
    # k * scale is the slot reader's row (tokenspeed's own check of this op)
    want = lay.decode(cache, torch.tensor([12, 13, 14, 15, 4, 5, 8, 9, 10]))
    torch.testing.assert_close(k.float() * s[:, None], want, equal_nan=True, rtol=0, atol=0)
    k0, s0 = ts.gather_paged_indexer_fp8_cache(cache, table, torch.zeros(3, dtype=torch.int32), 4)
    assert k0.shape == (0, 128) and s0.shape == (0,)


# ----- bad input: kvformats' typed errors, nothing written ---------------------------------------
def test_bad_input_raises_typed_errors_before_any_write():
    b = make_batch(4, 128, 4)
    lay = Fp8DsMla(head_dim=128, rope_dim=64, page_size=4)
    cache = sentinel_cache(lay, int(b.target_table.max()) + 1)
    before = storage_bytes(cache).clone()
    args = _compress_args(b, cache, 4)
    idx = Fp8Indexer(head_dim=128, page_size=4).allocate(2)
    bad = {
        "csa ratio": (InputError, lambda: ts.deepseek_v4_csa_compress_kv_cache_insert(*args, compress_ratio=128)),
        "hca ratio": (InputError, lambda: ts.deepseek_v4_hca_compress_kv_cache_insert(*args, compress_ratio=4)),
        "pages": (InputError, lambda: ts.deepseek_v4_csa_compress_kv_cache_insert(*args[:5], 8, *args[6:])),
        "req indices shorter than the tokens (CSA)": (InputError, lambda: ts.deepseek_v4_csa_compress_kv_cache_insert(
            b.state, b.req[:-2], *args[2:])),
        "req indices shorter than the tokens": (InputError, lambda: ts.deepseek_v4_csa_indexer_cache_insert(
            b.state, b.req[:-1], *args[2:9], idx, b.target_slots, 4, False)),
        "slots shorter than index_k, then beyond the cache": (InputError, lambda: ts.write_deepseek_v4_indexer_fp8_cache(
            torch.zeros(3, 128), idx, torch.tensor([0, 9]), 4)),
        "kv slot beyond the cache": (InputError, lambda: ts.deepseek_v4_csa_compress_kv_cache_insert(
            *args[:10], torch.where(b.target_slots >= 0, b.target_slots + 10 ** 6, -1), 4)),
        "float cache": (InputTypeError, lambda: ts.read_deepseek_v4_indexer_fp8_cache(idx.float(), torch.arange(2), 4)),
        "row width": (LayoutError, lambda: ts.read_deepseek_v4_indexer_fp8_cache(idx[:, :-4], torch.arange(2), 4)),
        "index_k dims": (InputError, lambda: ts.write_deepseek_v4_indexer_fp8_cache(torch.zeros(2, 1, 128), idx,
                                                                                    torch.arange(2), 4)),
        "index slot beyond the cache": (InputError, lambda: ts.write_deepseek_v4_indexer_fp8_cache(
            torch.zeros(2, 128), idx, torch.tensor([0, 8]), 4)),
        "rope_dim": (InputError, lambda: ts.deepseek_v4_fused_inv_rope_fp8_quant(
            torch.zeros(1, 2, 512), torch.zeros(1, dtype=torch.int64), dsv4.cos_sin_cache(64, 4), 1, 2, rope_dim=32)),
        "nope_dim": (InputError, lambda: ts.deepseek_v4_fused_inv_rope_fp8_quant(
            torch.zeros(1, 2, 512), torch.zeros(1, dtype=torch.int64), dsv4.cos_sin_cache(64, 4), 1, 2, nope_dim=384)),
        "save block_size": (InputError, lambda: ts.save_deepseek_v4_compressor_state(
            torch.zeros(2, 256), torch.zeros(2, 256), torch.zeros(4, 256), b.state, torch.arange(2), torch.arange(2), 8,
            4)),
        "workspace": (InputError, lambda: ts.deepseek_v4_gather_indexer_mxfp4_cache(
            cache_2d=Mxfp4Indexer(head_dim=128, page_size=4).allocate(1), slot_mapping=torch.arange(3),
            values_out=torch.zeros(2, 64, dtype=torch.uint8), scales_out=torch.zeros(3, 4, dtype=torch.uint8),
            block_size=4)),
        "workspace dtype": (InputTypeError, lambda: ts.deepseek_v4_gather_indexer_mxfp4_cache(
            cache_2d=Mxfp4Indexer(head_dim=128, page_size=4).allocate(1), slot_mapping=torch.arange(3),
            values_out=torch.zeros(3, 64, dtype=torch.int8), scales_out=torch.zeros(3, 4, dtype=torch.uint8),
            block_size=4)),
        "fp16 activations": (InputTypeError, lambda: ts.fused_qnorm_rope_kv_insert(
            torch.zeros(1, 1, 512, dtype=torch.float16), torch.zeros(1, 512, dtype=torch.float16),
            Fp8DsMla(page_size=4).allocate(1), torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
            dsv4.cos_sin_cache(64, 4), 1e-6, 4)),
        "dequantize out dtype": (InputTypeError, lambda: ts.deepseek_v4_dequantize_and_gather_k_cache(
            out=torch.zeros(1, 4, 512), cache_2d=Fp8DsMla(page_size=4).allocate(1), seq_lens=torch.tensor([4]),
            gather_lens=None, block_table=torch.zeros(1, 1, dtype=torch.int32), block_size=4, offset=0)),
    }
    for name, (err, call) in bad.items():
        with pytest.raises(err) as info:
            call()
        assert isinstance(info.value, KVFormatError), name
    assert torch.equal(storage_bytes(cache), before)


# ----- torch.compile --------------------------------------------------------------------------
def test_compiles_without_graph_breaks():
    qsl, seq, req, pos, table = _step()
    q = torch.randn(7, 2, 128).to(torch.bfloat16)
    w = torch.randn(7, 2)
    cs = dsv4.cos_sin_cache(64, 64)

    def step(qsl, seq, table, pos, q, w):
        slots = ts.deepseek_v4_compressed_slot_mapping(num_tokens=7, query_start_loc=qsl, seq_lens=seq,
                                                       block_table=table, block_size=2, compress_ratio=2)
        local = ts.deepseek_v4_build_dense_prefill_local_compressed_indices(
            positions=pos, compress_ratio=4, width=8, out=torch.empty(7, 8, dtype=torch.int32))
        qf, wo = ts.deepseek_v4_prepare_indexer_q_fp8(q, pos, cs, w, 128 ** -0.5, 0.5)
        return slots, local, qf.view(torch.uint8), wo

    args = (qsl, seq, table, pos, q, w)
    assert torch._dynamo.explain(step)(*args).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(got, step(*args)):
        assert torch.equal(a, b)
    torch._dynamo.reset()


def test_compress_insert_and_save_compile_without_graph_breaks():
    b = make_batch(4, 128, 4)
    lay = Fp8DsMla(head_dim=128, rope_dim=64, page_size=4)
    cache = sentinel_cache(lay, int(b.target_table.max()) + 1)
    c1, c2 = clone_cache(cache), clone_cache(cache)
    kv, score = torch.randn(b.positions.shape[0], 256), torch.randn(b.positions.shape[0], 256)
    ape = _reorder_c4(torch.randn(4, 256))
    s1, s2 = b.state.clone(), b.state.clone()

    def step(state, kv_cache, positions, req):
        ts.save_deepseek_v4_compressor_state(kv, score, ape, state, b.state_slots, positions, 4, 4)
        ts.deepseek_v4_csa_compress_kv_cache_insert(state, req, positions, b.state_slots, b.state_table, 4, b.weight,
                                                    b.eps, b.cos_sin, kv_cache, b.target_slots, 4,
                                                    block_table_base_offsets=b.base)
        return kv_cache[:, :8].float()

    assert torch._dynamo.explain(step)(s1.clone(), clone_cache(cache), b.positions, b.req).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(s1, c1, b.positions, b.req)
    want = step(s2, c2, b.positions, b.req)
    assert torch.equal(got, want) and torch.equal(s1, s2)
    assert torch.equal(storage_bytes(c1), storage_bytes(c2))
    torch._dynamo.reset()


# ----- serving properties -------------------------------------------------------------------------
HOST_READ = {"fp8_indexer.gather_paged"}  # sized from cu_seq_lens[-1] on the host, as tokenspeed's is


def test_every_drop_in_runs_like_the_native_call_and_records_nothing(device_mode):
    """The benchmark pairs (tests.harness.compat_calls) on the GPU's default check path: each
    drop-in returns what the native call returns, and neither records a violation."""
    pairs = compat_call_pairs("cpu", rows=8)
    assert len(pairs) >= 25
    for name, (native, compat) in pairs.items():
        a, b = native(), compat()
        if isinstance(b, (torch.Tensor, tuple)):
            if name == "prepare_indexer_q_mxfp4":
                (p, s), w = a
                a = ((p.contiguous(), s), w)
            if name == "fp8_indexer.gather_paged":
                a = (a[0].view(torch.float8_e4m3fn), a[1].view(torch.float32).squeeze(1))
            same(b, a)
        assert kvf.pending_error("cpu") is None, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [64, 8192])
def test_drop_ins_never_synchronize_and_capture(rows):
    """Default mode on CUDA: no host synchronization, eagerly and inside CUDA-graph capture (the
    one op tokenspeed itself sizes on the host excepted)."""
    pairs = {name: compat for name, (_, compat) in compat_call_pairs("cuda", rows).items() if name not in HOST_READ}
    for call in pairs.values():
        call()
    torch.cuda.synchronize()
    bad = {}
    for name, call in pairs.items():
        graph = torch.cuda.CUDAGraph()
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
            with torch.cuda.graph(graph):
                call()
            graph.replay()
        except RuntimeError as err:
            bad[name] = str(err).splitlines()[0]
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert not bad


def test_cache_io_compiles_without_graph_breaks_on_a_new_geometry():
    """The readers, writers and gathers trace without building layout objects (a geometry first
    seen while compiling does not break the graph)."""
    x = torch.randn(6, 256).to(torch.bfloat16)
    slots = torch.tensor([0, 3, 9, -1, 12, 2])

    def step(c1, c2, c3, c4, values, scales):
        ts.write_deepseek_v4_indexer_fp8_cache(x, c1, slots, 5)
        ts.write_deepseek_v4_indexer_mxfp4_cache(x, c2, slots, 5)
        ts.write_deepseek_v4_indexer_mxfp4_cache(x[:, :128], c4, slots, 5)
        a = ts.read_deepseek_v4_indexer_fp8_cache(c1, slots, 5)
        b = ts.read_deepseek_v4_indexer_mxfp4_cache(c2, slots, 5)
        d = ts.dequantize_deepseek_v4_fp8_ds_mla_cache(c3, slots, 5, head_dim=512, rope_dim=64)
        ts.deepseek_v4_gather_indexer_mxfp4_cache(cache_2d=c4, slot_mapping=slots, values_out=values,
                                                  scales_out=scales, block_size=5)
        ts.indexer_mxfp4_paged_gather(c4, values[6:], scales[6:], torch.tensor([[2, 0]], dtype=torch.int32),
                                      torch.tensor([0, 7], dtype=torch.int32), 5)
        return a, b, d, ts.hadamard_transform(x, scale=0.5), c1, c2

    def inputs():
        return (Fp8Indexer(head_dim=256, page_size=5).allocate(4), Mxfp4Indexer(head_dim=256, page_size=5).allocate(4),
                Fp8DsMla(page_size=5).allocate(4), Mxfp4Indexer(head_dim=128, page_size=5).allocate(4),
                torch.zeros(16, 64, dtype=torch.uint8), torch.zeros(16, 4, dtype=torch.uint8))

    torch._dynamo.reset()
    got_in, want_in = inputs(), inputs()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*got_in)
    want = step(*want_in)
    for a, b in zip((*got, *got_in), (*want, *want_in)):
        assert torch.equal(a, b)
    torch._dynamo.reset()
