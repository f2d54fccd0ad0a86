"""kvformats.compat.tokenspeed under the call forms of tokenspeed 0.1.1 (the released wheel) and of
its main branch at f4d8ec6e, beside the seed's (f3e4d1e2 / 6a08766a): each form against the
native call on the same inputs, tokenspeed 0.1.1's own pure-torch functions (from its wheel,
fetched at test time) against the drop-ins on CPU, and the regressions of issue 43: the
compressor-state ape read as it is at each call, the calls tokenspeed accepts that the drop-in
refused (longer per-token tensors, persistent block tables, no request, outputs of another
integer dtype), the FP8 indexer writer's float32 scale rule, the GPU markers of the side-by-side
tests."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.compat import tokenspeed as ts
from kvformats.errors import InputError, InputTypeError
from kvformats.formats import CompressorState, Fp8DsMla, Fp8Indexer, Mxfp4Indexer
from kvformats.layout import storage_bytes
from tests.harness.dsv4_scenarios import make_batch, sentinel_cache
from tests.harness.released import IndexUnreachable

ROOT = Path(__file__).resolve().parents[2]


def same(a, b):
    """Equal results: the same structure, dtypes, shapes, strides and bytes."""
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
        return
    assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride())
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def clone_cache(c):
    st = storage_bytes(c).clone()
    return torch.empty(0, dtype=c.dtype).set_(st.untyped_storage(), c.storage_offset(), c.shape, c.stride())


def randomized(lay, pages, seed):
    cache = lay.allocate(pages)
    g = torch.Generator().manual_seed(seed)
    storage_bytes(cache).copy_(torch.randint(0, 256, storage_bytes(cache).shape, generator=g, dtype=torch.uint8))
    return cache


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """tokenspeed 0.1.1's deepseek_v4_ops (tests/compat/tokenspeed_release.py), its Hadamard
    kernel stood in for by kvformats' (the one definition the drop-ins use)."""
    from tests.compat.tokenspeed_release import load_release_ops

    try:
        return load_release_ops(tmp_path_factory.mktemp("tokenspeed-0.1.1"),
                                lambda x, scale=1.0, override=None, solution=None: dsv4.hadamard_transform(x, scale))
    except IndexUnreachable as err:
        pytest.skip(str(err))


# ----- tokenspeed 0.1.1 and main call forms ------------------------------------------------------
def _swa_inputs(t=6, h=2):
    g = torch.Generator().manual_seed(11)
    lay = Fp8DsMla(head_dim=512, rope_dim=64, page_size=4)
    cache = sentinel_cache(lay, 3)
    q = torch.randn(t, h, 512, generator=g).to(torch.bfloat16)
    kv = (torch.randn(t, 512, generator=g) * 30).to(torch.bfloat16)
    return q, kv, cache, torch.tensor([3, -1, 0, 11, 9]), torch.tensor([0, 5, 7, 31, 63, 9]), dsv4.cos_sin_cache(64, 64)


def test_swa_insert_q_out_and_validate_positions():
    """0.1.1: ``q_out`` receives the rotated queries and ``q`` is left as it was;
    ``validate_positions`` (required by keyword there) is accepted either way."""
    q, kv, cache, slots, pos, cs = _swa_inputs()
    want_q, want_c = q.clone(), clone_cache(cache)
    dsv4.swa_insert(want_q, kv, want_c, slots, pos, cs, 1e-6, page_size=4)
    for validate in (True, False):
        q_in, q_out, c = q.clone(), torch.full_like(q, 7), clone_cache(cache)
        assert ts.fused_qnorm_rope_kv_insert(q_in, kv, c, slots, pos, cs, 1e-6, 4, q_out,
                                             validate_positions=validate) is None
        same(q_out, want_q)
        same(q_in, q)
        same(storage_bytes(c), storage_bytes(want_c))
        q_in, c = q.clone(), clone_cache(cache)  # without q_out: in place, as at f3e4d1e2
        ts.fused_qnorm_rope_kv_insert(q_in, kv, c, slots, pos, cs, 1e-6, 4, validate_positions=validate)
        same(q_in, want_q)
    c = clone_cache(cache)
    for bad, err in ((torch.zeros(6, 2, 512, dtype=torch.float32), InputTypeError),
                     (torch.zeros(6, 3, 512, dtype=torch.bfloat16), InputError),
                     (torch.zeros(6, 512, 2, dtype=torch.bfloat16).transpose(1, 2), InputError)):
        with pytest.raises(err):
            ts.fused_qnorm_rope_kv_insert(q.clone(), kv, c, slots, pos, cs, 1e-6, 4, q_out=bad, validate_positions=True)
    same(storage_bytes(c), storage_bytes(cache))


def _compress_case(case):
    ratio, h, tps, over = {"csa": (4, 128, 4, {}),
                           "hca": (128, 128, 2, {"seq_lens": (256, 130, 40), "new_tokens": (3, 4, 40),
                                                 "base": (0, 0, 0), "missing": ((0, 20),)})}[case]
    b = make_batch(ratio, h, tps, **over)
    cache = sentinel_cache(Fp8DsMla(head_dim=h, rope_dim=64, page_size=tps), int(b.target_table.max()) + 1)
    fn = ts.deepseek_v4_csa_compress_kv_cache_insert if ratio == 4 else ts.deepseek_v4_hca_compress_kv_cache_insert
    return ratio, tps, b, cache, fn


def _args(b, cache, tps, kv_slots=None):
    return (b.state, b.req, b.positions, b.state_slots, b.state_table, b.state.shape[1], b.weight, b.eps, b.cos_sin,
            cache, b.target_slots if kv_slots is None else kv_slots, tps)


@pytest.mark.parametrize("case", ["csa", "hca"])
def test_compress_insert_call_forms(case):
    """f3e4d1e2's ``(..., kv_cache_block_size, compress_ratio, block_table_base_offsets)`` and
    0.1.1's ``(..., kv_cache_block_size, kv_write_mask, compress_ratio)``, positional and by
    keyword: the same bytes as the native call; a False mask entry writes nothing for its token."""
    ratio, tps, b, cache, fn = _compress_case(case)
    want = clone_cache(cache)
    dsv4.compress_kv_insert(b.state, want, ratio=ratio, kv_page_size=tps, **b.kwargs())
    zero_base = torch.zeros_like(b.base)
    want0 = clone_cache(cache)
    dsv4.compress_kv_insert(b.state, want0, ratio=ratio, kv_page_size=tps,
                            **{**b.kwargs(), "block_table_base_offsets": zero_base})
    calls = {
        "f3e4d1e2 positional": (lambda c: fn(*_args(b, c, tps), ratio, b.base), want),
        "f3e4d1e2 keyword": (lambda c: fn(*_args(b, c, tps), compress_ratio=ratio, block_table_base_offsets=b.base),
                             want),
        "f3e4d1e2 ratio positional, base by keyword": (
            lambda c: fn(*_args(b, c, tps), ratio, block_table_base_offsets=b.base), want),
        "f3e4d1e2 ratio and None positional": (lambda c: fn(*_args(b, c, tps), ratio, None), want0),
        "0.1.1 positional, no mask": (lambda c: fn(*_args(b, c, tps), None, ratio), want0),
        "0.1.1 mask positional, ratio by keyword": (
            lambda c: fn(*_args(b, c, tps), torch.ones_like(b.positions, dtype=torch.bool), compress_ratio=ratio),
            want0),
        "0.1.1 keyword": (lambda c: fn(*_args(b, c, tps), kv_write_mask=None, compress_ratio=ratio), want0),
    }
    if b.base.any():
        assert not torch.equal(storage_bytes(want), storage_bytes(want0))  # the base offsets are read
    for name, (call, expected) in calls.items():
        c = clone_cache(cache)
        assert call(c) is None, name
        same(storage_bytes(c), storage_bytes(expected))
    # kv_write_mask: a masked token's row is not written (its kv slot as if -1)
    mask = torch.ones(b.positions.shape[0] + 3, dtype=torch.bool)  # longer than the tokens: its head is read
    mask[torch.nonzero(b.target_slots >= 0)[::2, 0]] = False  # every other token that writes a row
    c, expected = clone_cache(cache), clone_cache(cache)
    fn(*_args(b, c, tps), mask, ratio, b.base)
    masked = torch.where(mask[:b.positions.shape[0]], b.target_slots, -1)
    dsv4.compress_kv_insert(b.state, expected, ratio=ratio, kv_page_size=tps, **{**b.kwargs(), "kv_slots": masked})
    same(storage_bytes(c), storage_bytes(expected))
    assert not torch.equal(storage_bytes(c), storage_bytes(want))
    # bad masks and twice-given arguments: typed errors, nothing written
    c = clone_cache(cache)
    for bad, err in (((mask[:2], ratio), InputError), ((mask.int(), ratio), InputTypeError),
                     ((ratio, b.base), None)):
        if err is None:
            with pytest.raises(InputTypeError):
                fn(*_args(b, c, tps), *bad, block_table_base_offsets=b.base)
            continue
        with pytest.raises(err):
            fn(*_args(b, c, tps), *bad)
    with pytest.raises(InputError):
        fn(*_args(b, c, tps), None, 4 if ratio == 128 else 128)
    same(storage_bytes(c), storage_bytes(cache))


def test_csa_insert_reads_the_shortest_of_three():
    """The CSA insert's tokens are the shortest of the state slot mapping, positions and the kv
    slot mapping (0.1.1's kernel counts them so; f3e4d1e2 read past a shorter kv slot mapping)."""
    ratio, tps, b, cache, fn = _compress_case("csa")
    n = b.positions.shape[0] - 3
    c, want = clone_cache(cache), clone_cache(cache)
    fn(*_args(b, c, tps, kv_slots=b.target_slots[:n]), block_table_base_offsets=b.base)
    kw = {k: (v[:n] if k in ("positions", "req_indices", "state_slots", "kv_slots") else v)
          for k, v in b.kwargs().items()}
    dsv4.compress_kv_insert(b.state, want, ratio=4, kv_page_size=tps, **kw)
    same(storage_bytes(c), storage_bytes(want))


def test_fp8_paged_gather_table_names():
    """``page_table`` (0.1.1, main at f4d8ec6e) or ``block_table`` (6a08766a), by position or by
    keyword; exactly one of them."""
    lay = Fp8Indexer(head_dim=128, page_size=4)
    cache = randomized(lay, 6, 12)
    table = torch.tensor([[3, 1, 0], [2, 5, 0]], dtype=torch.int32)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    want = ts.gather_paged_indexer_fp8_cache(cache, table, cu, 4)
    same(ts.gather_paged_indexer_fp8_cache(cache, page_table=table, cu_seq_lens=cu, block_size=4), want)
    same(ts.gather_paged_indexer_fp8_cache(cache, block_table=table, cu_seq_lens=cu, block_size=4), want)
    same(ts.gather_paged_indexer_fp8_cache(cache_2d=cache, block_table=table, cu_seq_lens=cu, block_size=4), want)
    for kw in (dict(page_table=table, block_table=table, cu_seq_lens=cu, block_size=4),
               dict(cu_seq_lens=cu, block_size=4), dict(page_table=table, block_size=4)):
        with pytest.raises(InputTypeError):
            ts.gather_paged_indexer_fp8_cache(cache, **kw)


def test_dequantize_and_gather_max_gather_len():
    """main at f4d8ec6e: ``max_gather_len``, tokenspeed's launch-width hint on Blackwell, changes
    no byte whatever its value."""
    lay = Fp8DsMla(head_dim=512, rope_dim=64, page_size=4)
    cache = randomized(lay, 7, 13)
    table = torch.tensor([[3, 1, -1, 0], [2, 5, 6, 4]], dtype=torch.int32)
    kw = dict(cache_2d=cache, seq_lens=torch.tensor([9, 14]), gather_lens=torch.tensor([9, 5]), block_table=table,
              block_size=4, offset=2, block_table_base_offsets=torch.tensor([0, 1]))
    want = torch.full((2, 12, 512), 7.0, dtype=torch.bfloat16)
    ts.deepseek_v4_dequantize_and_gather_k_cache(out=want, **kw)
    for m in (None, 0, 3, 9, 10, 4096):
        out = torch.full((2, 12, 512), 7.0, dtype=torch.bfloat16)
        assert ts.deepseek_v4_dequantize_and_gather_k_cache(out=out, max_gather_len=m, **kw) is None
        same(out, want)
    with pytest.raises(InputTypeError):
        ts.deepseek_v4_dequantize_and_gather_k_cache(out=want.clone(), max_gather_len=9.0, **kw)


@pytest.mark.parametrize("t", [0, 5])
def test_prepare_indexer_q(t, release):
    """0.1.1's BF16 query prep: kvformats' RoPE tail then its Hadamard transform (bf16), weights
    times head_scale: equal to tokenspeed 0.1.1's own function on the same inputs."""
    g = torch.Generator().manual_seed(14)
    q = (torch.randn(t, 3, 128, generator=g) * torch.logspace(-3, 4, 3)[None, :, None]).to(torch.bfloat16)
    pos = torch.randint(0, 64, (t,), generator=g)
    cs = dsv4.cos_sin_cache(64, 64)
    for weights in (torch.randn(t, 3, generator=g), torch.randn(t, 3, 1, generator=g).to(torch.bfloat16)):
        got = ts.deepseek_v4_prepare_indexer_q(q, pos, cs, weights, 3 ** -0.5)
        want = (dsv4.hadamard_transform(dsv4.rope_tail(q, pos, cs), 128 ** -0.5),
                weights.reshape(t, 3).float() * 3 ** -0.5)
        same(got, want)
        assert got[0].dtype == torch.bfloat16 and got[0].is_contiguous() and got[1].dtype == torch.float32
        same(got, release.deepseek_v4_prepare_indexer_q(q, pos, cs, weights, 3 ** -0.5))
    for bad, err in (((q.reshape(t * 3, 128), pos, cs, torch.zeros(t, 3), 0.5), InputError),
                     ((q, pos, cs, torch.zeros(t, 4), 0.5), InputError),
                     ((q, pos, cs, torch.zeros(t, 3, dtype=torch.int32), 0.5), InputTypeError),
                     ((q, pos, cs, torch.zeros(t, 3), "0.5"), InputTypeError)):
        with pytest.raises(err):
            ts.deepseek_v4_prepare_indexer_q(*bad)


def test_release_torch_paths_equal_the_drop_ins(release):
    """tokenspeed 0.1.1's pure-torch FP8 indexer functions (reader, paged gather, the capturable
    writer its FP8 path stores with) against the drop-ins: the same bytes."""
    g = torch.Generator().manual_seed(15)
    lay = Fp8Indexer(head_dim=128, page_size=16)
    x = (torch.randn(40, 128, generator=g) * torch.logspace(-4, 4, 40)[:, None]).to(torch.bfloat16)
    slots = torch.randperm(64, generator=g)[:40]
    c_ts, c_kvf = lay.allocate(4), lay.allocate(4)
    release._write_deepseek_v4_indexer_fp8_cache_capturable(x, c_ts, slots, torch.ones(40, dtype=torch.bool), 16)
    ts.write_deepseek_v4_indexer_fp8_cache(x, c_kvf, slots, 16)
    same(c_ts, c_kvf)
    read = torch.tensor([0, 17, -1, 40, 63, 7])
    same(release.read_deepseek_v4_indexer_fp8_cache(c_ts, read, 16),
         ts.read_deepseek_v4_indexer_fp8_cache(c_kvf, read, 16))
    table = torch.tensor([[3, 1, 0], [2, 0, 1], [1, 1, 1], [0, 2, 3]], dtype=torch.int32)  # a persistent table
    for cu in ([0, 20, 33], [0, 0, 48], [0], []):
        cu = torch.tensor(cu, dtype=torch.int32)
        same(ts.gather_paged_indexer_fp8_cache(c_kvf, page_table=table, cu_seq_lens=cu, block_size=16),
             release.gather_paged_indexer_fp8_cache(c_ts, page_table=table, cu_seq_lens=cu, block_size=16))


# ----- issue 43 (a): the compressor-state ape, read as it is at each call ----------------------------
def _reorder_c4(ape):
    h = ape.shape[1] // 2
    return torch.cat([ape[:, :h], ape[:, h:]], dim=0).reshape(ape.shape)


def _save_case(seed=16):
    g = torch.Generator().manual_seed(seed)
    lay = CompressorState(head_dim=64, ratio=4, page_size=4)
    w = lay.width
    kv, score = torch.randn(6, w, generator=g), torch.randn(6, w, generator=g)
    return kv, score, torch.randn(4, w, generator=g), torch.zeros(3, 4, 2 * w), torch.tensor([0, 5, 7, -1, 2, 9])


def _want(kv, score, ape, state, slots):
    want = state.clone()
    dsv4.save_compressor_state(kv, score, ape, want, ratio=4, positions=torch.arange(6), slots=slots)
    return want


def test_save_reads_an_ape_reloaded_through_data():
    """A weight reload writes ``param.data`` in place, which leaves ``param._version`` as it was:
    the next save must use the new values (it used a copy kept per version)."""
    kv, score, ape, state, slots = _save_case()
    param = torch.nn.Parameter(_reorder_c4(ape), requires_grad=False)
    s1 = state.clone()
    ts.save_deepseek_v4_compressor_state(kv, score, param, s1, slots, torch.arange(6), 4, 4)
    same(s1, _want(kv, score, ape, state, slots))
    new = ape * -3 + 1
    version = param._version
    param.data.copy_(_reorder_c4(new))  # tokenspeed's own reorder at loading writes the ape this way
    assert param._version == version
    s2 = state.clone()
    ts.save_deepseek_v4_compressor_state(kv, score, param, s2, slots, torch.arange(6), 4, 4)
    same(s2, _want(kv, score, new, state, slots))
    param.data = _reorder_c4(new * 2)  # a new tensor behind the same parameter
    ts.save_deepseek_v4_compressor_state(kv, score, param, s2, slots, torch.arange(6), 4, 4)
    same(s2, _want(kv, score, new * 2, state, slots))


def test_save_takes_an_ape_made_under_inference_mode():
    """An ape created under ``torch.inference_mode()`` (an inference tensor has no version
    counter) is read like any other, inside and outside inference mode."""
    kv, score, ape, state, slots = _save_case(17)
    with torch.inference_mode():
        runtime = _reorder_c4(ape)
    assert runtime.is_inference()
    s1 = state.clone()
    ts.save_deepseek_v4_compressor_state(kv, score, runtime, s1, slots, torch.arange(6), 4, 4)
    same(s1, _want(kv, score, ape, state, slots))
    with torch.inference_mode():
        s2 = state.clone()
        ts.save_deepseek_v4_compressor_state(kv, score, runtime, s2, slots, torch.arange(6), 4, 4)
    same(s2, s1)


# ----- issue 43 (b): calls tokenspeed accepts ------------------------------------------------------
def _step():
    qsl = torch.tensor([0, 6, 7, 7])
    seq = torch.tensor([14, 30, 3])
    req = torch.tensor([0, 0, 0, 0, 0, 0, 1])
    pos = torch.tensor([8, 9, 10, 11, 12, 13, 29])
    table = torch.tensor([[3, 1, -1, 0], [2, 5, 6, 4], [-1, -1, -1, -1]], dtype=torch.int32)
    persistent = torch.cat([table, torch.arange(20, dtype=torch.int32).reshape(5, 4)])  # rows past the requests
    return qsl, seq, req, pos, table, persistent


def test_longer_per_token_tensors_are_read_for_their_tokens():
    """``token_to_req_indices`` / ``is_valid_token`` longer than the tokens: tokenspeed reads
    the first T entries."""
    qsl, seq, req, pos, table, _ = _step()
    topk = torch.tensor([[0, 3, -1], [5, 1, 2], [7, -1, -1], [0, 1, 2], [9, 9, 9], [1, -1, 0], [4, 2, 6]],
                        dtype=torch.int32)
    valid = torch.tensor([True, True, False, True, True, True, True])
    long_req, long_valid = torch.cat([req, torch.tensor([2, 9])]), torch.cat([valid, torch.tensor([False, True])])
    same(ts.deepseek_v4_compute_global_topk_indices_and_lens(topk_indices=topk, token_to_req_indices=long_req,
                                                             block_table=table, block_size=2,
                                                             is_valid_token=long_valid),
         dsv4.global_topk_indices_and_lens(topk_indices=topk, req_indices=req, block_table=table, page_size=2,
                                           is_valid_token=valid))
    same(ts.deepseek_v4_decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req,
                                                    block_table=table, window_size=5, block_size=4,
                                                    is_valid_token=long_valid),
         dsv4.decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, req_indices=req, block_table=table,
                                          window_size=5, page_size=4, is_valid_token=valid))
    kw = dict(seq_lens=seq, compressed_lens=torch.tensor([2, 7, 0]), gather_lens=torch.tensor([10, 4, 3]),
              window_size=4, workspace_width=40, compressed_base=20)
    same(ts.deepseek_v4_combine_dense_swa_indices(positions=pos, token_to_req_indices=long_req, compress_ratio=4, **kw),
         dsv4.combine_dense_swa_indices(positions=pos, req_indices=req, ratio=4, **kw))


def test_persistent_block_tables():
    """Block tables (and base offsets) with more rows than requests, in the four functions whose
    requests another argument counts: the rows past them are not read."""
    qsl, seq, req, pos, table, persistent = _step()
    base, long_base = torch.tensor([1, 0, 0]), torch.tensor([1, 0, 0, 5, 5, 5, 5, 5])
    same(ts.deepseek_v4_decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req,
                                                    block_table=persistent, window_size=5, block_size=4,
                                                    block_table_base_offsets=long_base),
         dsv4.decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, req_indices=req, block_table=table,
                                          window_size=5, page_size=4, block_table_base_offsets=base))
    ds = Fp8DsMla(head_dim=512, rope_dim=64, page_size=4)
    cache = randomized(ds, 20, 18)
    kw = dict(cache_2d=cache, seq_lens=torch.tensor([9, 14]), gather_lens=torch.tensor([9, 5]), block_size=4,
              offset=2)
    o1, o2 = (torch.full((2, 12, 512), 7.0, dtype=torch.bfloat16) for _ in range(2))
    ts.deepseek_v4_dequantize_and_gather_k_cache(out=o1, block_table=persistent, block_table_base_offsets=long_base,
                                                 **kw)
    ts.deepseek_v4_dequantize_and_gather_k_cache(out=o2, block_table=persistent[:2], block_table_base_offsets=base[:2],
                                                 **kw)
    same(o1, o2)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    f8 = randomized(Fp8Indexer(head_dim=128, page_size=4), 20, 19)
    same(ts.gather_paged_indexer_fp8_cache(f8, persistent, cu, 4),
         ts.gather_paged_indexer_fp8_cache(f8, table[:2], cu, 4))
    mx = Mxfp4Indexer(head_dim=128, page_size=4)
    mcache = randomized(mx, 20, 20)
    v1, s1 = torch.full((11, 64), 0xCC, dtype=torch.uint8), torch.full((11, 4), 0xDD, dtype=torch.uint8)
    v2, s2 = v1.clone(), s1.clone()
    ts.indexer_mxfp4_paged_gather(mcache, v1, s1, persistent, cu, 4)
    mx.gather_paged(mcache, block_table=table[:2], cu_seq_lens=cu, out=(v2, s2))
    same((v1, s1), (v2, s2))


def test_fp8_paged_gather_without_requests():
    """No request: ``cu_seq_lens`` ``[0]`` (with a persistent table) or empty give empty results,
    as tokenspeed's gather returns them."""
    f8 = randomized(Fp8Indexer(head_dim=128, page_size=4), 3, 21)
    table = torch.tensor([[0, 1], [2, 0]], dtype=torch.int32)
    for cu in (torch.zeros(1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)):
        k, s = ts.gather_paged_indexer_fp8_cache(f8, table, cu, 4)
        assert (k.dtype, k.shape, s.dtype, s.shape) == (torch.float8_e4m3fn, (0, 128), torch.float32, (0,))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int64])
def test_outputs_of_another_integer_dtype(dtype):
    """``out=`` of another integer dtype: tokenspeed's stores cast into it; the drop-ins write the
    native result into it with the cast, and return what tokenspeed returns (views of it)."""
    qsl, seq, req, pos, table, _ = _step()
    kw = dict(num_tokens=7, query_start_loc=qsl, seq_lens=seq, block_table=table)
    out = torch.full((10,), 77, dtype=dtype)
    got = ts.deepseek_v4_compressed_slot_mapping(block_size=2, compress_ratio=2, out=out, **kw)
    want = dsv4.compressed_slot_mapping(page_size=2, ratio=2, **kw)
    assert got.data_ptr() == out.data_ptr() and got.shape == (7,) and (out[7:] == -1).all()
    same(got, want.to(dtype))
    oi, ol = torch.full((9, 5), 55, dtype=dtype), torch.full((9,), 55, dtype=dtype)
    got = ts.deepseek_v4_decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req,
                                                     block_table=table, window_size=5, block_size=4,
                                                     out_indices=oi, out_lens=ol)
    assert got[0] is oi and got[1] is ol
    want = dsv4.decode_swa_indices_and_lens(query_start_loc=qsl, seq_lens=seq, req_indices=req, block_table=table,
                                            window_size=5, page_size=4)
    same((oi[:7], ol[:7]), (want[0].to(dtype), want[1].to(dtype)))
    assert (oi[7:] == 55).all() and (ol[7:] == 55).all()
    out = torch.full((9, 12), 3, dtype=dtype)
    got = ts.deepseek_v4_build_dense_prefill_local_compressed_indices(positions=pos, compress_ratio=4, width=6, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (7, 6) and got.stride() == (12, 1)
    same(got.contiguous(), dsv4.dense_prefill_local_compressed_indices(positions=pos, ratio=4, width=6).to(dtype))
    assert (out[7:] == 3).all() and (out[:, 6:] == 3).all()
    for call in (lambda: ts.deepseek_v4_compressed_slot_mapping(block_size=2, compress_ratio=2,
                                                                out=torch.zeros(5, dtype=dtype), **kw),
                 lambda: ts.deepseek_v4_build_dense_prefill_local_compressed_indices(
                     positions=pos, compress_ratio=4, width=6, out=torch.zeros(7, 5, dtype=dtype)),
                 lambda: ts.deepseek_v4_decode_swa_indices_and_lens(
                     query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req, block_table=table, window_size=5,
                     block_size=4, out_lens=torch.zeros(6, dtype=dtype))):
        with pytest.raises(InputError):
            call()


# ----- issue 43 (c): the FP8 indexer writer's scale rule ---------------------------------------------
def test_fp8_indexer_scale_one_ulp_above_a_power_of_two(release):
    """float32 rows whose amax is one ulp above 448 * 2^k: the drop-in's scale is 2^k, as
    tokenspeed 0.1.1's writer computes it (float32: amax / 448 rounds to 2^k (1 + 2^-23), whose
    float32 log2 is k for k >= 4 or k <= -5); the Python writer of f3e4d1e2 / main computes in float64 and
    stores 2^(k+1). bf16 rows never reach such an amax. The porting guide says so."""
    rows = torch.zeros(4, 128)
    KS = (-20, -5, 4, 20)  # where float32 log2 rounds down onto k (for -4 <= k <= 3 it rounds up, as float64)
    amaxes = [float(torch.nextafter(torch.tensor(448.0 * 2.0 ** k), torch.tensor(math.inf))) for k in KS]
    for i, a in enumerate(amaxes):
        rows[i, i] = a
        rows[i, 64] = -a / 2
    assert [float(r.abs().max()) for r in rows] == amaxes
    lay = Fp8Indexer(head_dim=128, page_size=4)
    c_kvf, c_ts = lay.allocate(1), lay.allocate(1)
    slots = torch.arange(4)
    ts.write_deepseek_v4_indexer_fp8_cache(rows, c_kvf, slots, 4)
    release._write_deepseek_v4_indexer_fp8_cache_capturable(rows, c_ts, slots, torch.ones(4, dtype=torch.bool), 4)
    same(c_kvf, c_ts)
    scales = c_kvf[0, 4 * 128:].view(torch.float32).tolist()
    float64_rule = [2.0 ** math.ceil(math.log2(max(a / 448.0, 1e-10))) for a in amaxes]
    assert scales == [2.0 ** k for k in KS]
    assert float64_rule == [2 * s for s in scales]
    guide = (ROOT / "docs" / "porting-from-tokenspeed.md").read_text()
    assert "one ulp above 448" in guide and "float64" in guide


# ----- issue 43 (d): the GPU markers of the side-by-side tests ----------------------------------------
def test_side_by_side_device_tests_carry_their_marker():
    """In test_tokenspeed_compat_gpu.py, ``@gpu`` marks tests only, and every test that runs on the
    module's device (``DEV``) without taking the device as a parameter carries it."""
    tree = ast.parse((ROOT / "tests" / "compat" / "test_tokenspeed_compat_gpu.py").read_text())
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        marked = any(isinstance(d, ast.Name) and d.id == "gpu" for d in fn.decorator_list)
        if not fn.name.startswith("test_"):
            assert not marked, f"@gpu on {fn.name}, which is not a test"
            continue
        uses_dev = any(isinstance(n, ast.Name) and n.id == "DEV" for n in ast.walk(fn))
        takes_device = any(a.arg == "device" for a in fn.args.args)
        if uses_dev and not takes_device:
            assert marked, f"{fn.name} runs on DEV without @gpu"


def test_release_forms_compile_without_graph_breaks():
    """0.1.1's query prep and its masked compress insert, an int16 ``out=``, a persistent table and
    longer per-token tensors, under ``torch.compile(fullgraph=True)``: the results of the eager
    calls."""
    ratio, tps, b, cache, fn = _compress_case("csa")
    q = torch.randn(7, 2, 128).to(torch.bfloat16)
    pos, w, cs = torch.arange(7), torch.randn(7, 2), dsv4.cos_sin_cache(64, 64)
    mask = torch.ones(b.positions.shape[0], dtype=torch.bool)
    mask[torch.nonzero(b.target_slots >= 0)[::2, 0]] = False

    qsl, seq, req, _, table, persistent = _step()
    valid = torch.ones(9, dtype=torch.bool)  # longer than the 7 tokens

    def step(q, pos, w, kv_cache, mask):
        query, weights = ts.deepseek_v4_prepare_indexer_q(q, pos, cs, w, 0.5)
        fn(*_args(b, kv_cache, tps), mask, compress_ratio=4)
        local = ts.deepseek_v4_build_dense_prefill_local_compressed_indices(
            positions=pos, compress_ratio=4, width=8, out=torch.zeros(7, 8, dtype=torch.int16))
        idx, lens = ts.deepseek_v4_decode_swa_indices_and_lens(
            query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req, block_table=persistent, window_size=5,
            block_size=4, is_valid_token=valid)
        topk, topk_lens = ts.deepseek_v4_compute_global_topk_indices_and_lens(
            topk_indices=local.int(), token_to_req_indices=torch.cat([req, req]), block_table=table, block_size=2,
            is_valid_token=valid)
        return query, weights, local, idx, lens, topk, topk_lens, kv_cache[:, :16].clone()

    c1, c2, c3 = clone_cache(cache), clone_cache(cache), clone_cache(cache)
    assert torch._dynamo.explain(step)(q, pos, w, c1, mask).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, pos, w, c2, mask)
    want = step(q, pos, w, c3, mask)
    for a, e in zip(got, want):
        assert torch.equal(a, e)
    assert torch.equal(storage_bytes(c2), storage_bytes(c3))
    torch._dynamo.reset()
