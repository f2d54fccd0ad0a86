"""torch.library custom ops of kvformats.deepseek_v4: opcheck for every op (CPU, small inputs),
the op's results and written bytes equal the Python function's, torch.compile(fullgraph=True)
of a compress insert + index helpers has no graph break and the eager bytes, lazy import."""

import subprocess
import sys

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.deepseek_v4 import torch_ops as dops
from tests.harness.dsv4_scenarios import make_batch, sentinel_cache
from kvformats.testing.strategies import storage_bytes

T = torch.tensor


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)))


def _compress(ratio):
    if ratio == 4:
        b = make_batch(4, 128, 4)
    else:
        b = make_batch(128, 128, 2, seq_lens=(130, 20), new_tokens=(6, 4), base=(0, 0), missing=())
    layout = kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=4 if ratio == 4 else 2)
    cache = sentinel_cache(layout, b.target_table.numel())
    return b, cache


def _index_case(fmt):
    b = make_batch(4, 128, 4)
    cache = sentinel_cache(kvf.get_format(fmt, head_dim=128, page_size=4), b.target_table.numel())
    return dict(state_cache=b.state, index_cache=cache, index_format=fmt, index_page_size=4,
                **b.kwargs("index_slots"))


def _q(t=3, h=4):
    g = torch.Generator().manual_seed(6)
    return dict(index_q=torch.randn(t, h, 128, generator=g).to(torch.bfloat16), positions=T([0, 17, 63] * t)[:t],
                cos_sin_cache=dsv4.cos_sin_cache(64, 64), weights=torch.rand(t, h, 1, generator=g),
                softmax_scale=128 ** -0.5, head_scale=0.5)


def _swa():
    g = torch.Generator().manual_seed(5)
    return dict(q=torch.randn(4, 2, 512, generator=g).to(torch.bfloat16),
                kv=torch.randn(4, 512, generator=g).to(torch.bfloat16),
                kv_cache=sentinel_cache(kvf.Fp8DsMla(), 2), slots=T([0, 70, -1, 500]), positions=T([5, 64, 3, 9]),
                cos_sin_cache=dsv4.cos_sin_cache(64, 80), rms_eps=1e-6)


def _save(table):
    b = make_batch(4, 128, 4)
    g = torch.Generator().manual_seed(1)
    kw = dict(kv=torch.randn(5, 256, generator=g), score=torch.randn(5, 256, generator=g),
              ape=torch.randn(4, 256, generator=g), state_cache=b.state, ratio=4, positions=b.positions[:5])
    if table:
        return dict(kw, req_indices=b.req[:5], block_table=b.state_table, block_table_base_offsets=b.base)
    return dict(kw, slots=b.state_slots[:5])


TABLE = T([[3, 1, -1, 5], [0, 2, 4, 6]])
QSL, SEQ = T([0, 5, 8]), T([9, 3])
VALID = T([True, True, False, True])


def _bt(b, **kw):
    return dict(state_cache=b.state, positions=b.positions, req_indices=b.req, block_table=b.state_table,
                rms_weight=b.weight, rms_eps=b.eps, block_table_base_offsets=b.base, **kw)


CASES = {  # id: (function name, builder of fresh keyword arguments)
    "hadamard": ("hadamard_transform", lambda: dict(x=_randn(3, 2, 64))),
    "hadamard_scale": ("hadamard_transform", lambda: dict(x=_randn(3, 128).half(), scale=0.25)),
    "pool_csa": ("pool_compressor_state", lambda: _bt(make_batch(4, 128, 4), ratio=4)),
    "save_slots": ("save_compressor_state", lambda: _save(False)),
    "save_table": ("save_compressor_state", lambda: _save(True)),
    "compress_csa": ("compress_kv_insert", lambda: (lambda b, c: dict(
        state_cache=b.state, kv_cache=c, ratio=4, kv_page_size=4, **b.kwargs()))(*_compress(4))),
    "compress_hca": ("compress_kv_insert", lambda: (lambda b, c: dict(
        state_cache=b.state, kv_cache=c, ratio=128, kv_page_size=2, **b.kwargs()))(*_compress(128))),
    "indexer_mxfp4": ("indexer_compress_insert", lambda: _index_case("mxfp4_indexer")),
    "indexer_fp8": ("indexer_compress_insert", lambda: _index_case("fp8_indexer")),
    "swa_insert": ("swa_insert", _swa),
    "q_mxfp4": ("prepare_indexer_q_mxfp4", _q),
    "q_fp8": ("prepare_indexer_q_fp8", lambda: dict(_q(), weights=_q()["weights"][..., 0])),
    "inv_rope_tma": ("inv_rope_fp8_quant", lambda: dict(
        o=_randn(5, 4, 512).to(torch.bfloat16), positions=T([0, 3, 7, 1, 9]),
        cos_sin_cache=dsv4.cos_sin_cache(64, 10), n_groups=2, heads_per_group=2)),
    "inv_rope_f32": ("inv_rope_fp8_quant", lambda: dict(
        o=_randn(3, 2, 256), positions=T([0, 3, 7]), cos_sin_cache=dsv4.cos_sin_cache(64, 10), n_groups=1,
        heads_per_group=2, quant_group_size=64, tma_aligned_scales=False)),
    "table_slots": ("table_slot_mapping", lambda: dict(
        positions=T([0, 5, 9, 13]), req_indices=T([0, 1, 1, 0]), block_table=TABLE, page_size=4, entry_stride=2,
        block_table_base_offsets=T([0, 1]), is_valid_token=VALID)),
    "compressed_slots": ("compressed_slot_mapping", lambda: dict(
        num_tokens=8, query_start_loc=QSL, seq_lens=SEQ, block_table=TABLE, page_size=2, ratio=2)),
    "compressed_slots_out": ("compressed_slot_mapping", lambda: dict(
        num_tokens=8, query_start_loc=QSL, seq_lens=SEQ, block_table=TABLE, page_size=2, ratio=2,
        block_table_base_offsets=T([0, 1]), out=torch.zeros(10, dtype=torch.int64))),
    "global_topk": ("global_topk_indices_and_lens", lambda: dict(
        topk_indices=T([[0, 3, -1], [5, 1, 7], [2, -1, -1], [9, 0, 4]], dtype=torch.int32),
        req_indices=T([0, 1, 1, 0]), block_table=TABLE, page_size=2, is_valid_token=VALID)),
    "global_topk_scan": ("global_topk_indices_and_lens", lambda: dict(
        topk_indices=T([[0, 3, -1], [5, 1, 7], [2, -1, -1], [9, 0, 4]], dtype=torch.int32),
        req_indices=T([0, 1, 1, 0]), block_table=TABLE, page_size=2, is_valid_token=VALID,
        block_table_base_offsets=T([0, 1]), lens="scan", out_valid_lens=torch.zeros(4, dtype=torch.int32))),
    "global_topk_out": ("global_topk_indices_and_lens", lambda: dict(
        topk_indices=T([[0, 3, -1], [5, 1, 7], [2, -1, -1], [9, 0, 4]], dtype=torch.int32),
        req_indices=T([0, 1, 1, 0]), block_table=TABLE, page_size=2, out_indices=torch.zeros(4, 3, dtype=torch.int32),
        out_lens=torch.zeros(4, dtype=torch.int32))),
    "compressed_slots_req": ("compressed_slot_mapping", lambda: dict(
        num_tokens=8, query_start_loc=QSL, seq_lens=SEQ, block_table=TABLE, page_size=2, ratio=2,
        req_indices=T([0, 0, 1, 1, 1, 2, -1, 0]), is_valid_token=T([True] * 7 + [False]),
        out=torch.zeros(10, dtype=torch.int64))),
    "combine_topk": ("combine_topk_swa_indices", lambda: dict(
        topk_indices=torch.arange(32, dtype=torch.int32).reshape(8, 4) % 5 - 1, query_start_loc=QSL, seq_lens=SEQ,
        gather_lens=T([7, 3]), window_size=3, ratio=2, topk=4, workspace_width=300, compressed_base=150)),
    "combine_dense": ("combine_dense_swa_indices", lambda: dict(
        positions=T([4, 8, 1, 2]), req_indices=T([0, 0, 1, 2]), seq_lens=SEQ, compressed_lens=T([4, 1]),
        gather_lens=T([9, 2]), window_size=3, ratio=2, workspace_width=200, compressed_base=100)),
    "decode_swa": ("decode_swa_indices_and_lens", lambda: dict(
        query_start_loc=T([0, 1, 2]), seq_lens=SEQ, req_indices=T([0, 1]), block_table=TABLE, window_size=4,
        page_size=2)),
    "decode_swa_out": ("decode_swa_indices_and_lens", lambda: dict(
        query_start_loc=T([0, 1, 2]), seq_lens=SEQ, req_indices=T([0, 1]), block_table=TABLE, window_size=4,
        page_size=2, block_table_base_offsets=T([1, 0]), is_valid_token=T([True, False]),
        out_indices=torch.zeros(3, 4, dtype=torch.int32), out_lens=torch.zeros(3, dtype=torch.int32))),
    "dense_prefill": ("dense_prefill_local_compressed_indices", lambda: dict(positions=T([0, 5, 9, 13]), ratio=4,
                                                                             width=3)),
    "dense_prefill_out": ("dense_prefill_local_compressed_indices", lambda: dict(
        positions=T([0, 5, 9, 13]), ratio=4, width=3, out=torch.zeros(5, 4, dtype=torch.int32))),
}


def _sized(n):
    """Builders of token-sized cases with ``n`` tokens (rows, T, T * H)."""
    g = torch.Generator().manual_seed(n)
    pos = (torch.arange(n) * 7) % 10
    req = torch.arange(n) % 3 - (torch.arange(n) == 4).long()  # request 2 and -1: invalid tokens
    b = make_batch(4, 128, 4)
    return {
        "hadamard": ("hadamard_transform", lambda: dict(x=torch.randn(n, 64, generator=g))),
        "q_mxfp4": ("prepare_indexer_q_mxfp4", lambda: dict(_q(n, 1), positions=pos)),
        "q_mxfp4_heads": ("prepare_indexer_q_mxfp4", lambda: dict(_q(1, n), positions=pos[:1] if n else T([3]))),
        "q_fp8": ("prepare_indexer_q_fp8", lambda: dict(_q(n, 1), positions=pos, weights=_q(n, 1)["weights"][..., 0])),
        "inv_rope": ("inv_rope_fp8_quant", lambda: dict(
            o=torch.randn(n, 4, 512, generator=g).to(torch.bfloat16), positions=pos,
            cos_sin_cache=dsv4.cos_sin_cache(64, 10), n_groups=2, heads_per_group=2)),
        "pool": ("pool_compressor_state", lambda: dict(_bt(b, ratio=4), positions=b.positions[:n],
                                                       req_indices=b.req[:n])),
        "save": ("save_compressor_state", lambda: {k: v[:n] if k in ("kv", "score", "positions", "slots") else v
                                                   for k, v in _save(False).items()}),
        "table_slots": ("table_slot_mapping", lambda: dict(
            positions=pos, req_indices=req.clamp(max=1), block_table=TABLE, page_size=4, entry_stride=2)),
        "global_topk": ("global_topk_indices_and_lens", lambda: dict(
            topk_indices=torch.randint(-1, 8, (n, 3), generator=g, dtype=torch.int32), req_indices=req,
            block_table=TABLE, page_size=2)),
        "combine_topk": ("combine_topk_swa_indices", lambda: dict(
            topk_indices=torch.randint(-1, 5, (n, 4), generator=g, dtype=torch.int32), query_start_loc=QSL,
            seq_lens=SEQ, gather_lens=T([7, 3]), window_size=3, ratio=2, topk=4, workspace_width=300,
            compressed_base=150)),
        "combine_dense": ("combine_dense_swa_indices", lambda: dict(
            positions=pos, req_indices=req, seq_lens=SEQ, compressed_lens=T([4, 1]), gather_lens=T([9, 2]),
            window_size=3, ratio=2, workspace_width=200, compressed_base=100)),
        "decode_swa": ("decode_swa_indices_and_lens", lambda: dict(
            query_start_loc=T([0, 1, 2]), seq_lens=SEQ, req_indices=req, block_table=TABLE, window_size=4,
            page_size=2)),
        "dense_prefill": ("dense_prefill_local_compressed_indices", lambda: dict(positions=pos, ratio=4, width=3)),
        "compressed_slots": ("compressed_slot_mapping", lambda: dict(
            num_tokens=n, query_start_loc=QSL, seq_lens=SEQ, block_table=TABLE, page_size=2, ratio=2)),
    }


SIZED = sorted(_sized(0))


@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("case", SIZED)
def test_opcheck_at_zero_one_and_odd_sizes(case, n):
    """Outputs of one buffer (the MXFP4 query prep at T * H = 1, anything at 0 rows) must not alias
    each other; the fakes agree with the real ops at these sizes too."""
    name, build = _sized(n)[case]
    op = getattr(torch.ops.kvformats, "dsv4_" + name).default
    torch.library.opcheck(op, op_args(name, build()))


def op_args(name, kwargs):
    """The op's positional arguments for ``dsv4.<name>(**kwargs)`` (defaults, workspaces filled in)."""
    return tuple(dops.op_arguments(name, **kwargs).values())


def test_every_dispatched_op_has_a_custom_op():
    assert set(dops.SCHEMAS) == set(dsv4.MODEL_OPS)
    assert {n for n, _ in CASES.values()} == set(dsv4.MODEL_OPS)
    for name in dops.TORCH_OP_NAMES:
        assert getattr(torch.ops.kvformats, name).default._schema.name == f"kvformats::{name}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_opcheck(case):
    name, build = CASES[case]
    op = getattr(torch.ops.kvformats, "dsv4_" + name).default
    torch.library.opcheck(op, op_args(name, build()))


def _flat(x):
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flat(item)]
    return [] if x is None else [x]


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_bytes_equal_the_python_function(case):
    name, build = CASES[case]
    kw_ref, kw_op = build(), build()
    want = getattr(dsv4, name)(**kw_ref)
    got = getattr(dops, name)(**kw_op)  # the wrapper: same signature, through torch.ops
    args = dops.op_arguments(name, **build())  # the op itself, positional arguments in schema order
    raw = dops.results(name, args, getattr(torch.ops.kvformats, "dsv4_" + name)(*args.values()))
    assert type(got) is type(want) and len(_flat(got)) == len(_flat(want)) == len(_flat(raw))
    for a, b, c in zip(_flat(got), _flat(want), _flat(raw)):
        _same(a, b)
        _same(c, b)
        if name == "inv_rope_fp8_quant":  # the documented DeepGEMM views survive the op
            assert a.stride() == b.stride() and c.stride() == b.stride()
    for k, v in kw_ref.items():  # every cache / q / out written exactly as by the function
        if isinstance(v, torch.Tensor):
            assert torch.equal(storage_bytes(kw_op[k]), storage_bytes(v)), k
    if name == "swa_insert":
        assert got is kw_op["q"]
    if "out" in kw_op and want is not None:
        assert got.untyped_storage().data_ptr() == kw_op["out"].untyped_storage().data_ptr()


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_op_takes_check_in_each_mode_and_refuses_others(case):
    """spec/checks.md §1: every op takes ``check`` (True, False, "strict"; anything else an
    InputTypeError before any write), the Python function and its torch.ops wrapper alike.
    Issue 35 item 7: six ops took none; theirs is validated and changes nothing."""
    import inspect

    name, build = CASES[case]
    assert inspect.signature(getattr(dsv4, name)).parameters["check"].default is True
    want = getattr(dsv4, name)(**build())
    for fn in (getattr(dsv4, name), getattr(dops, name)):
        for mode in (True, False, "strict"):
            got = fn(**build(), check=mode)
            assert len(_flat(got)) == len(_flat(want))
            for a, b in zip(_flat(got), _flat(want)):
                _same(a, b)
        for bad in (1, None, "STRICT"):
            kwargs = build()
            before = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
            with pytest.raises(kvf.InputTypeError, match="check must be True, False or 'strict'"):
                fn(**kwargs, check=bad)
            assert all(torch.equal(kwargs[k], v) for k, v in before.items())


def test_csa_hca_wrappers_go_through_the_op():
    for ratio, fn, ref in ((4, dops.csa_compress_kv_insert, dsv4.csa_compress_kv_insert),
                           (128, dops.hca_compress_kv_insert, dsv4.hca_compress_kv_insert)):
        (b, c1), (_, c2) = _compress(ratio), _compress(ratio)
        kw = dict(b.kwargs(), kv_page_size=4 if ratio == 4 else 2)
        fn(b.state, c1, **kw)
        ref(b.state, c2, **kw)
        assert torch.equal(storage_bytes(c1), storage_bytes(c2))
        assert int((storage_bytes(c1) != 0xA5).sum()) > 0
        with pytest.raises(kvf.InputError, match="ratio"):
            fn(b.state, c1, ratio=8, **kw)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_compress_insert_and_index_helpers_no_graph_break_eager_bytes(backend):
    def step(b, kv_cache, positions, req):
        slots = dops.table_slot_mapping(positions=positions, req_indices=req, block_table=b.target_table,
                                        page_size=4, entry_stride=4)
        dops.csa_compress_kv_insert(b.state, kv_cache, positions=positions, req_indices=req,
                                    state_slots=b.state_slots, block_table=b.state_table, rms_weight=b.weight,
                                    rms_eps=b.eps, cos_sin_cache=b.cos_sin, kv_slots=slots, kv_page_size=4,
                                    block_table_base_offsets=b.base)
        local = dops.dense_prefill_local_compressed_indices(positions=positions, ratio=4, width=8)
        return slots, local, dsv4.rms_norm(kv_cache[:, :64].float(), None, 1e-6)

    (b, c1), (_, c2), (_, c3) = _compress(4), _compress(4), _compress(4)
    assert torch._dynamo.explain(step)(b, c3, b.positions, b.req).graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    got, want = compiled(b, c1, b.positions, b.req), step(b, c2, b.positions, b.req)
    assert torch.equal(storage_bytes(c1), storage_bytes(c2)) and int((storage_bytes(c1) != 0xA5).sum()) > 0
    for a, w in zip(got, want):
        _same(a, w)
    torch._dynamo.reset()


def test_errors_pass_through_before_any_write():
    b, cache = _compress(4)
    kw = dict(b.kwargs(), kv_page_size=4)
    bad = kw["kv_slots"].clone()
    bad[bad >= 0] = 10_000
    with pytest.raises(kvf.InputError, match="capacity"):
        dops.compress_kv_insert(b.state, cache, ratio=4, **dict(kw, kv_slots=bad))
    with pytest.raises(kvf.InputError, match="capacity"):
        torch.ops.kvformats.dsv4_compress_kv_insert(*op_args("compress_kv_insert", dict(
            kw, state_cache=b.state, kv_cache=cache, ratio=4, kv_slots=bad)))
    with pytest.raises(kvf.InputTypeError, match="ratio"):
        dops.compress_kv_insert(b.state, cache, ratio=4.0, **kw)
    with pytest.raises(TypeError):
        dops.compress_kv_insert(b.state, cache, ratio=4, bogus=1, **kw)
    assert bool(storage_bytes(cache).eq(0xA5).all())


def test_import_is_lazy():
    code = ("import sys, kvformats, kvformats.deepseek_v4, kvformats.codec.torch_ops; "
            "assert 'kvformats.deepseek_v4.torch_ops' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _to_cuda(kw: dict) -> dict:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def _compiled_equals_eager(case: str, backend: str, move=lambda kw: kw) -> None:
    name, build = CASES[case]
    kw_c, kw_e = move(build()), move(build())
    fn = getattr(dops, name)
    got = torch.compile(lambda kw: fn(**kw), fullgraph=True, backend=backend)(kw_c)
    want = fn(**kw_e)
    for a, b in zip(_flat(got), _flat(want)):
        _same(a, b)
    for k, v in kw_e.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(storage_bytes(kw_c[k]), storage_bytes(v)), k
    torch._dynamo.reset()


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_wrapper_compiles_fullgraph_with_eager_bytes(case):
    _compiled_equals_eager(case, "aot_eager")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_every_wrapper_compiles_fullgraph_on_the_triton_backend(case):
    """On CUDA tensors the ops run their Triton kernels (backend auto); compiled under inductor
    with fullgraph=True they give exactly the eager results and written bytes."""
    _compiled_equals_eager(case, "inductor", _to_cuda)
