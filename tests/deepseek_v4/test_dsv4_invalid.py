"""Invalid-argument table of the DeepSeek V4 operations: each bad call raises a typed error
(InputError / InputTypeError / LayoutError, also ValueError / TypeError) before any byte of any
cache (or q) is written."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from tests.harness.dsv4_scenarios import make_batch, sentinel_cache
from kvformats.testing.strategies import storage_bytes

IE, TE, LE = kvf.InputError, kvf.InputTypeError, kvf.LayoutError


class Ctx:
    def __init__(self):
        self.b = make_batch(4, 128, 4)
        self.kv_layout = kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=4)
        self.kv_cache = sentinel_cache(self.kv_layout, self.b.target_table.numel())
        self.idx_cache = sentinel_cache(kvf.Mxfp4Indexer(page_size=4), self.b.target_table.numel())
        self.state_before = self.b.state.clone()
        self.swa_cache = sentinel_cache(kvf.Fp8DsMla(), 2)
        g = torch.Generator().manual_seed(0)
        self.q = torch.randn(3, 2, 512, generator=g).to(torch.bfloat16)
        self.q0 = self.q.clone()
        self.kv = torch.randn(3, 512, generator=g).to(torch.bfloat16)

    def compress(self, **over):
        kw = dict(self.b.kwargs(), kv_page_size=4)
        kw.update(over)
        ratio = kw.pop("ratio", 4)
        state = kw.pop("state", self.b.state)
        cache = kw.pop("cache", self.kv_cache)
        dsv4.compress_kv_insert(state, cache, ratio=ratio, **kw)

    def indexer(self, **over):
        kw = dict(self.b.kwargs("index_slots"), index_format="mxfp4_indexer", index_page_size=4)
        kw.update(over)
        dsv4.indexer_compress_insert(self.b.state, self.idx_cache, **kw)

    def save(self, **over):
        kw = dict(kv=torch.ones(3, 256), score=torch.ones(3, 256), ape=torch.zeros(4, 256), state_cache=self.b.state,
                  ratio=4, positions=torch.arange(3), slots=torch.tensor([0, 1, 2]))
        kw.update(over)
        dsv4.save_compressor_state(kw.pop("kv"), kw.pop("score"), kw.pop("ape"), kw.pop("state_cache"), **kw)

    def swa(self, **over):
        kw = dict(q=self.q, kv=self.kv, kv_cache=self.swa_cache, slots=torch.tensor([0, 1, 2]),
                  positions=torch.arange(3), cos_sin_cache=dsv4.cos_sin_cache(64, 8), rms_eps=1e-6)
        kw.update(over)
        dsv4.swa_insert(**kw)

    def untouched(self):
        return (storage_bytes(self.kv_cache).eq(0xA5).all() and storage_bytes(self.idx_cache).eq(0xA5).all()
                and storage_bytes(self.swa_cache).eq(0xA5).all() and torch.equal(self.b.state, self.state_before)
                and torch.equal(self.q, self.q0))


def _short(c, name):
    return getattr(c.b, name)[:-1]


CASES = [
    ("compress: ratio 8", lambda c: c.compress(ratio=8), IE, "ratio"),
    ("compress: ratio 128 on a ratio-4 state", lambda c: c.compress(ratio=128), LE, "2 * W"),
    ("compress: positions shorter", lambda c: c.compress(positions=_short(c, "positions")), IE, "req_indices"),
    ("compress: state slots shorter", lambda c: c.compress(state_slots=_short(c, "state_slots")), IE, "state_slots"),
    ("compress: kv slots shorter", lambda c: c.compress(kv_slots=_short(c, "target_slots")), IE, "kv_slots"),
    ("compress: float positions", lambda c: c.compress(positions=c.b.positions.float()), TE, "positions"),
    ("compress: 1-D table", lambda c: c.compress(block_table=c.b.state_table[0]), IE, "block_table"),
    ("compress: base offsets vs table rows", lambda c: c.compress(block_table_base_offsets=c.b.base[:1]), IE,
     "block_table_base_offsets"),
    ("compress: weight vs state width", lambda c: c.compress(rms_weight=torch.ones(64)), LE, "2 * W"),
    ("compress: odd rope table", lambda c: c.compress(cos_sin_cache=torch.zeros(64, 63)), IE, "even"),
    ("compress: fp64 rope table", lambda c: c.compress(cos_sin_cache=c.b.cos_sin.double()), TE, "cos_sin_cache"),
    ("compress: short rope table", lambda c: c.compress(cos_sin_cache=c.b.cos_sin[:4]), IE, "rope positions"),
    ("compress: kv cache too narrow", lambda c: c.compress(cache=c.kv_cache[:, :100]), LE, "at least"),
    ("compress: kv page size 0", lambda c: c.compress(kv_page_size=0), IE, "kv_page_size"),
    ("compress: nope not multiple of 64", lambda c: c.compress(cos_sin_cache=torch.zeros(64, 32)), IE,
     "multiple of 64"),
    ("compress: kv slot beyond cache", lambda c: c.compress(kv_slots=c.b.target_slots.clamp_min(0) + 10_000), IE,
     "capacity"),
    ("compress: fp16 state", lambda c: c.compress(state=c.b.state.half()), TE, "state_cache"),
    ("csa wrapper with ratio 128", lambda c: dsv4.csa_compress_kv_insert(c.b.state, c.kv_cache, ratio=128), IE,
     "ratio 4"),
    ("hca wrapper with ratio 4", lambda c: dsv4.hca_compress_kv_insert(c.b.state, c.kv_cache, ratio=4), IE,
     "ratio 128"),
    ("indexer: unknown format", lambda c: c.indexer(index_format="int8"), IE, "index_format"),
    ("indexer: ratio 128", lambda c: c.indexer(ratio=128), IE, "ratio 4"),
    ("indexer: wrong cache format", lambda c: c.indexer(index_format="fp8_indexer"), LE, "fp8_indexer"),
    ("indexer: index slots shorter", lambda c: c.indexer(index_slots=_short(c, "target_slots")), IE, "index_slots"),
    ("save: kv/score mismatch", lambda c: c.save(score=torch.ones(2, 256)), IE, "score"),
    ("save: ape rows", lambda c: c.save(ape=torch.zeros(128, 256)), IE, "ape"),
    ("save: slots shorter", lambda c: c.save(slots=torch.tensor([0, 1])), IE, "slots"),
    ("save: slot beyond cache", lambda c: c.save(slots=torch.tensor([0, 1, 10_000])), IE, "capacity"),
    ("save: repeated slot", lambda c: c.save(slots=torch.tensor([0, 1, 1])), IE, "repeat"),
    ("save: both slots and table", lambda c: c.save(block_table=c.b.state_table, req_indices=torch.zeros(3,
                                                                                        dtype=torch.int64)), IE, "not both"),
    ("save: no slots", lambda c: c.save(slots=None), IE, "slots="),
    ("save: ratio 2", lambda c: c.save(ratio=2), IE, "ratio"),
    ("swa: fp16 q", lambda c: c.swa(q=c.q.half(), kv=c.kv.half()), TE, "fp16"),
    ("swa: kv dtype differs", lambda c: c.swa(kv=c.kv.float()), TE, "kv"),
    ("swa: more slots than tokens", lambda c: c.swa(slots=torch.arange(4)), IE, "at most"),
    ("swa: positions shorter", lambda c: c.swa(positions=torch.arange(2)), IE, "positions"),
    ("swa: position beyond table", lambda c: c.swa(positions=torch.tensor([0, 1, 8])), IE, "cos_sin_cache"),
    ("swa: negative position", lambda c: c.swa(positions=torch.tensor([0, -1, 2])), IE, "[0, 8)"),
    ("swa: repeated slot", lambda c: c.swa(slots=torch.tensor([4, 4, -1])), IE, "repeat"),
    ("swa: head dim 96", lambda c: c.swa(q=c.q[:, :, :96].contiguous(), kv=c.kv[:, :96]), IE, "multiple of 64"),
    ("swa: non-contiguous q", lambda c: c.swa(q=c.q.transpose(0, 1)), IE, "contiguous"),
    ("q prep: head dim 64", lambda c: dsv4.prepare_indexer_q_mxfp4(torch.ones(2, 1, 64), torch.arange(2),
                                                                    dsv4.cos_sin_cache(32, 4), torch.ones(2, 1), 1.0,
                                                                    1.0), IE, "index_q"),
    ("q prep: weights shape", lambda c: dsv4.prepare_indexer_q_fp8(torch.ones(2, 3, 128), torch.arange(2),
                                                                    dsv4.cos_sin_cache(64, 4), torch.ones(2, 2), 1.0,
                                                                    1.0), IE, "weights"),
    ("inv rope: groups", lambda c: dsv4.inv_rope_fp8_quant(torch.ones(2, 6, 512), torch.arange(2),
                                                           dsv4.cos_sin_cache(64, 4), n_groups=4, heads_per_group=2),
     IE, "o must be a 3-D tensor [N, 8, M]"),
    ("inv rope: tma needs 4 groups", lambda c: dsv4.inv_rope_fp8_quant(torch.ones(2, 2, 256), torch.arange(2),
                                                                       dsv4.cos_sin_cache(64, 4), n_groups=1,
                                                                       heads_per_group=2), IE, "== 4"),
    ("hadamard: not a power of two", lambda c: dsv4.hadamard_transform(torch.ones(2, 96)), IE, "power-of-two"),
    ("hadamard: int input", lambda c: dsv4.hadamard_transform(torch.ones(2, 128, dtype=torch.int32)), TE, "bf16"),
    ("topk: int64 indices", lambda c: dsv4.global_topk_indices_and_lens(
        topk_indices=torch.zeros(2, 3, dtype=torch.int64), req_indices=torch.zeros(2, dtype=torch.int64),
        block_table=c.b.state_table, page_size=4), TE, "topk_indices"),
    ("slot mapping: qsl length", lambda c: dsv4.compressed_slot_mapping(
        num_tokens=4, query_start_loc=torch.tensor([0, 4]), seq_lens=torch.tensor([4, 4, 4]),
        block_table=c.b.state_table, page_size=4, ratio=4), IE, "query_start_loc"),
    ("slot mapping: decreasing qsl", lambda c: dsv4.compressed_slot_mapping(
        num_tokens=4, query_start_loc=torch.tensor([0, 4, 2, 5]), seq_lens=torch.tensor([4, 4, 4]),
        block_table=c.b.state_table, page_size=4, ratio=4), IE, "never decrease"),
    ("combine topk: topk > columns", lambda c: dsv4.combine_topk_swa_indices(
        topk_indices=torch.zeros(2, 3, dtype=torch.int32), query_start_loc=torch.tensor([0, 2]),
        seq_lens=torch.tensor([2]), gather_lens=torch.tensor([2]), window_size=4, ratio=4, topk=5,
        workspace_width=16, compressed_base=4), IE, "topk"),
    ("decode swa: window 0", lambda c: dsv4.decode_swa_indices_and_lens(
        query_start_loc=torch.tensor([0, 1, 1, 1]), seq_lens=torch.tensor([1, 1, 1]), req_indices=torch.zeros(1,
                                                                                                dtype=torch.int64),
        block_table=c.b.state_table, window_size=0, page_size=4), IE, "window_size"),
    ("dense local: out too small", lambda c: dsv4.dense_prefill_local_compressed_indices(
        positions=torch.arange(3), ratio=4, width=8, out=torch.zeros(3, 4, dtype=torch.int32)), IE, "at least"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_call_raises_before_writing(case):
    _, call, err, words = case
    ctx = Ctx()
    with pytest.raises(err) as info:
        call(ctx)
    assert isinstance(info.value, (ValueError, TypeError))
    assert words in str(info.value), str(info.value)
    assert ctx.untouched()


def test_the_valid_calls_of_the_table_do_write():
    ctx = Ctx()
    ctx.compress()
    ctx.indexer()
    ctx.swa()
    ctx.save()
    assert not storage_bytes(ctx.kv_cache).eq(0xA5).all() and not storage_bytes(ctx.idx_cache).eq(0xA5).all()
    assert not storage_bytes(ctx.swa_cache).eq(0xA5).all() and not torch.equal(ctx.q, ctx.q0)


def test_ops_are_registered_for_kernels():
    from kvformats.codec import registry

    for op in dsv4.MODEL_OPS:
        impl = registry.resolve_model_op(dsv4.FAMILY, op, "auto", torch.device("cpu"))
        assert impl.__module__.startswith("kvformats.deepseek_v4.")
    with pytest.raises(kvf.BackendUnavailableError):
        dsv4.hadamard_transform(torch.ones(1, 128), backend="triton")


def test_former_name_of_model_ops_warns():
    with pytest.warns(DeprecationWarning, match="MODEL_OPS"):
        assert dsv4.OPS is dsv4.MODEL_OPS
    with pytest.raises(AttributeError):
        dsv4.NO_SUCH_NAME  # noqa: B018
