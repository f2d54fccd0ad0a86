"""torch.library custom ops of kvformats.deepseek_v41: opcheck for every op (CPU, small inputs and
zero rows), the op's results and written bytes equal the Python function's, typed errors pass
through before any write, torch.compile(fullgraph=True) of a step calling the four wrappers has no
graph break and the eager bytes, lazy import."""

import inspect
import subprocess
import sys

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v41 as dsv41
from kvformats.deepseek_v4 import cos_sin_cache
from kvformats.deepseek_v41 import torch_ops as d41ops
from kvformats.deepseek_v41.rows import swa_layout
from kvformats.testing.strategies import storage_bytes
from tests.harness.dsv4_scenarios import sentinel_cache

T = torch.tensor
W = 512


def _idx(values):  # an int64 index tensor, empty ones included (torch.tensor([]) is float)
    return torch.tensor(values, dtype=torch.int64)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _swa(fmt="fp8_ds_mla_v41", page_size=4, out=False, n=5, in_place=False):
    """Rows at slots of page 0, a later page, -1 and beyond the cache (skipped); positions in the table."""
    g = _gen(3)
    values = (torch.randn(n, 2 * W, generator=g) * 4).to(torch.bfloat16)[:, ::2]  # strided rows
    kw = dict(values=values, positions=_idx([0, 3, 7, 1, 9] * n)[:n], cos_sin_cache=cos_sin_cache(64, 10),
              cache=sentinel_cache(swa_layout(fmt, page_size), 3), slots=_idx([0, 5, -1, 11, 100] * n)[:n], fmt=fmt,
              page_size=page_size)
    if in_place:  # out may be the values themselves (then contiguous)
        kw["values"] = kw["out"] = values.contiguous()
    elif out:
        kw["out"] = torch.full((n, W), 7.0, dtype=torch.bfloat16)
    return kw


def _index(fmt="mxfp4_indexer", out=False, t=3, h=4, in_place=False):
    q = (torch.randn(t, h, 2 * 128, generator=_gen(4)) * 3).to(torch.bfloat16)[..., 1::2]
    kw = dict(q=q, fmt=fmt)
    if in_place:
        kw["q"] = kw["out"] = q.contiguous()
    elif out:
        kw["out"] = torch.full((t, h, 128), 7.0, dtype=torch.bfloat16)
    return kw


def _tail(pages=3, p=2, flat=False):
    """A tail of random rows in an arena with padding between pages (the page stride is free)."""
    arena = torch.randn(pages, p * 2 * W + 64, generator=_gen(5))
    tail = arena[:, :p * 2 * W]
    return tail.unflatten(1, (p, 2 * W) if flat else (p, 2, W))


def _scatter(n=4, flat=False):
    g = _gen(6)
    return dict(content=torch.randn(n, W, generator=g), scores=torch.randn(n, W, generator=g).to(torch.bfloat16),
                tail=_tail(flat=flat), slots=_idx([5, -1, 0, 9, 2, 3, 4][:n]))


def _pool(n=5, norm=False, out=False):
    g = _gen(7)
    kw = dict(content=torch.randn(n, W, generator=g), scores=torch.randn(n, W, generator=g) * 2, tail=_tail(),
              previous=_idx([-1, 0, -1, 2, -1][:n]), tail_slots=_idx([3, -1, 1, 0, 5][:n]),
              active=torch.tensor([True, True, True, False, True][:n], dtype=torch.bool))
    if norm:
        kw.update(norm_weight=torch.rand(W, generator=g).to(torch.bfloat16), norm_eps=1e-6)
    if out:
        kw["out"] = torch.full((n, W), 7.0, dtype=torch.bfloat16 if norm else torch.float32)
    return kw


CASES = {  # id: (function name, builder of fresh keyword arguments)
    "swa_v41": ("swa_rope_scatter", _swa),
    "swa_v41_out": ("swa_rope_scatter", lambda: _swa(out=True)),
    "swa_v41_in_place": ("swa_rope_scatter", lambda: _swa(in_place=True)),
    "swa_v4_out": ("swa_rope_scatter", lambda: _swa("fp8_ds_mla", 2, out=True)),
    "index_mxfp4": ("index_q_quantize", _index),
    "index_fp8_out": ("index_q_quantize", lambda: _index("fp8_indexer", out=True)),
    "index_in_place": ("index_q_quantize", lambda: _index(in_place=True)),
    "tail_scatter": ("compressor_tail_scatter", _scatter),
    "tail_scatter_flat": ("compressor_tail_scatter", lambda: _scatter(flat=True)),
    "pool": ("compressor_pool", _pool),
    "pool_norm_out": ("compressor_pool", lambda: _pool(norm=True, out=True)),
    "pool_norm": ("compressor_pool", lambda: _pool(norm=True)),
}
EMPTY = {  # zero rows: no write, an empty out
    "swa": ("swa_rope_scatter", lambda: _swa(n=0, out=True)),
    "index": ("index_q_quantize", lambda: _index(t=0)),
    "tail_scatter": ("compressor_tail_scatter", lambda: _scatter(n=0)),
    "pool": ("compressor_pool", lambda: _pool(n=0, norm=True)),
}


def op_args(name, kwargs):
    """The op's positional arguments for ``dsv41.<name>(**kwargs)`` (defaults, workspaces filled in)."""
    return tuple(d41ops.op_arguments(name, **kwargs).values())


def _op(name):
    return getattr(torch.ops.kvformats, "dsv41_" + name).default


def test_every_dispatched_op_has_a_custom_op():
    assert set(d41ops.SCHEMAS) == set(dsv41.MODEL_OPS)
    assert {n for n, _ in CASES.values()} == {n for n, _ in EMPTY.values()} == set(dsv41.MODEL_OPS)
    mutated = {"swa_rope_scatter": {"cache", "out"}, "index_q_quantize": {"out"},
               "compressor_tail_scatter": {"tail"}, "compressor_pool": {"out"}}
    for name in dsv41.MODEL_OPS:
        schema = _op(name)._schema
        assert schema.name == f"kvformats::dsv41_{name}" and "dsv41_" + name in d41ops.TORCH_OP_NAMES
        params = inspect.signature(getattr(dsv41, name)).parameters
        assert [a.name for a in schema.arguments] == list(params)  # definition order, same names
        assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == mutated[name]
        assert not schema.returns  # every op writes in place


@pytest.mark.parametrize("case", sorted(CASES))
def test_opcheck(case):
    name, build = CASES[case]
    torch.library.opcheck(_op(name), op_args(name, build()))


@pytest.mark.parametrize("case", sorted(EMPTY))
def test_opcheck_at_zero_rows(case):
    name, build = EMPTY[case]
    torch.library.opcheck(_op(name), op_args(name, build()))


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _written_alike(kw_op, kw_ref):
    for k, v in kw_ref.items():  # every cache / tail / out written exactly as by the function
        if isinstance(v, torch.Tensor):
            assert torch.equal(storage_bytes(kw_op[k]), storage_bytes(v)), k


@pytest.mark.parametrize("case", sorted({**CASES, **{"empty_" + k: v for k, v in EMPTY.items()}}))
def test_op_bytes_equal_the_python_function(case):
    name, build = CASES.get(case) or EMPTY[case[len("empty_"):]]
    kw_ref, kw_op, kw_raw = build(), build(), build()
    want = getattr(dsv41, name)(**kw_ref)
    got = getattr(d41ops, name)(**kw_op)  # the wrapper: same signature, through torch.ops
    args = d41ops.op_arguments(name, **kw_raw)  # the op itself, positional arguments in schema order
    raw = d41ops.results(name, args, _op(name)(*args.values()))
    _written_alike(kw_op, kw_ref)
    _written_alike(kw_raw, kw_ref)
    assert (want is None) == (name == "compressor_tail_scatter" or (name == "swa_rope_scatter" and "out" not in kw_ref))
    if want is None:
        assert got is None and raw is None
        return
    _same(got, want)
    _same(raw, want)
    if "out" in kw_op:  # the caller's out comes back, itself
        assert got is kw_op["out"] and raw is kw_raw["out"]


@pytest.mark.parametrize("case", ["swa_v41_out", "index_mxfp4", "tail_scatter", "pool_norm"])
def test_every_op_takes_check_in_each_mode_and_refuses_others(case):
    """spec/checks.md §1: ``check`` is True, False or "strict" (anything else an InputTypeError
    before any write), through the wrapper as through the Python function."""
    name, build = CASES[case]
    want = build()
    getattr(dsv41, name)(**want)
    for fn in (getattr(dsv41, name), getattr(d41ops, name)):
        for mode in (True, False, "strict"):
            kwargs = build()
            fn(**kwargs, check=mode)
            _written_alike(kwargs, want)
        for bad in (1, None, "STRICT"):
            kwargs = build()
            before = {k: storage_bytes(v).clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
            with pytest.raises(kvf.InputTypeError, match="check must be True, False or 'strict'"):
                fn(**kwargs, check=bad)
            assert all(torch.equal(storage_bytes(kwargs[k]), v) for k, v in before.items())


def _untouched(kwargs, before):
    return all(torch.equal(storage_bytes(kwargs[k]), v) for k, v in before.items())


ERRORS = [  # (function, changes to a case's arguments, error, message): raised by the op's real implementation
    ("swa_rope_scatter", dict(slots=T([0, 5, 5, 11, 1])), kvf.InputError, "twice|repeat"),
    ("swa_rope_scatter", dict(positions=T([0, 3, 10, 1, 9])), kvf.InputError, "position"),
    ("swa_rope_scatter", dict(fmt="fp8_indexer"), kvf.InputError, "fmt"),
    ("swa_rope_scatter", dict(out=torch.zeros(5, W)), kvf.InputTypeError, "out"),
    ("index_q_quantize", dict(fmt="fp4"), kvf.InputError, "fmt"),
    ("index_q_quantize", dict(q=torch.zeros(3, 4, 128)), kvf.InputTypeError, "q"),
    ("compressor_tail_scatter", dict(slots=T([1, 1, -1, 2])), kvf.InputError, "twice|repeat"),
    ("compressor_tail_scatter", dict(tail=torch.zeros(2, 2, 2, 256)), kvf.LayoutError, "tail"),
    ("compressor_pool", dict(norm_weight=torch.ones(W), norm_eps=0.0), kvf.InputError, "norm_eps"),
    ("compressor_pool", dict(norm_weight=torch.ones(W)), kvf.InputTypeError, "norm_eps"),
    ("compressor_pool", dict(out=torch.zeros(5, W, dtype=torch.bfloat16)), kvf.InputTypeError, "out"),
]
BASE = {"swa_rope_scatter": lambda: _swa(out=True), "index_q_quantize": _index,
        "compressor_tail_scatter": _scatter, "compressor_pool": _pool}


@pytest.mark.parametrize("name,over,err,match", ERRORS, ids=[f"{e[0]}-{'-'.join(e[1])}" for e in ERRORS])
def test_errors_pass_through_before_any_write(name, over, err, match):
    for call in ("function", "wrapper", "op"):
        kwargs = {**BASE[name](), **over}
        before = {k: storage_bytes(v).clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        with pytest.raises(err, match=match):
            if call == "function":
                getattr(dsv41, name)(**kwargs)
            elif call == "wrapper":
                getattr(d41ops, name)(**kwargs)
            else:
                _op(name)(*op_args(name, kwargs))
        assert _untouched(kwargs, before), call


def test_tail_overlapping_inputs_are_refused_through_the_op():
    """The function refuses content sharing bytes with the tail it writes; so does the op (whose
    schema does not declare that aliasing: the check runs in the real implementation)."""
    kwargs = _scatter(n=2)
    kwargs["content"] = kwargs["tail"][:2, 0, 0]
    before = storage_bytes(kwargs["tail"]).clone()
    for fn in (d41ops.compressor_tail_scatter, lambda **kw: _op("compressor_tail_scatter")(
            *op_args("compressor_tail_scatter", kw))):
        with pytest.raises(kvf.InputError, match="overlaps"):
            fn(**kwargs)
        assert torch.equal(storage_bytes(kwargs["tail"]), before)


def test_wrapper_argument_errors():
    kw = _swa()
    with pytest.raises(kvf.InputTypeError, match="page_size must be an int"):
        d41ops.swa_rope_scatter(**dict(kw, page_size=4.0))
    with pytest.raises(TypeError):
        d41ops.swa_rope_scatter(**kw, bogus=1)
    with pytest.raises(TypeError):  # keyword-only, as in the Python function
        d41ops.compressor_tail_scatter(*_scatter().values())
    with pytest.raises(kvf.InputTypeError, match="missing argument 'slots'"):
        d41ops.compressor_tail_scatter(**{k: v for k, v in _scatter().items() if k != "slots"})
    assert bool(storage_bytes(kw["cache"]).eq(0xA5).all())
    for name in dsv41.MODEL_OPS:  # same signature (defaults, keyword-only) and doc
        assert inspect.signature(getattr(d41ops, name)) == inspect.signature(getattr(dsv41, name))
        assert getattr(d41ops, name).__doc__ == getattr(dsv41, name).__doc__


def _step(swa, index, scatter, pool):
    """One layer's V4.1 cache writes: pool the pairs the scatter overwrites first, as engines do."""
    pooled = d41ops.compressor_pool(**pool)
    d41ops.compressor_tail_scatter(**scatter)
    rows = d41ops.swa_rope_scatter(**swa)
    q = d41ops.index_q_quantize(**index)
    return pooled, rows, q


def _step_args():
    pool = _pool(norm=True)
    scatter = dict(_scatter(), tail=pool["tail"])  # the tail pool reads
    return dict(swa=_swa(out=True), index=_index("fp8_indexer"), scatter=scatter, pool=pool)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_step_has_no_graph_break_and_the_eager_bytes(backend):
    if backend == "aot_eager":
        explained = torch._dynamo.explain(_step)(**_step_args())
        assert explained.graph_break_count == 0 and explained.graph_count == 1
    got_args, want_args = _step_args(), _step_args()
    got = torch.compile(_step, fullgraph=True, backend=backend)(**got_args)
    want = _step(**want_args)
    for a, b in zip(got, want):
        _same(a, b)
    for part, kw in want_args.items():
        _written_alike(got_args[part], kw)
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_swa_without_out_compiles_and_returns_none(backend):
    """swa_rope_scatter's ``out`` stays an optional mutated argument; passed None it compiles."""
    def step(kw):
        return d41ops.swa_rope_scatter(**kw)

    got_args, want_args = _swa(), _swa()
    assert torch.compile(step, fullgraph=True, backend=backend)(got_args) is None
    dsv41.swa_rope_scatter(**want_args)
    _written_alike(got_args, want_args)
    assert int((storage_bytes(got_args["cache"]) != 0xA5).sum()) > 0
    torch._dynamo.reset()


def test_import_is_lazy():
    code = ("import sys, kvformats, kvformats.deepseek_v41, kvformats.deepseek_v4.torch_ops; "
            "assert 'kvformats.deepseek_v41.torch_ops' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _compiled_equals_eager(case: str, backend: str, move=lambda kw: kw, module=d41ops) -> None:
    name, build = CASES[case]
    kw_c, kw_e = move(build()), move(build())
    if case.endswith("in_place"):  # keep out the input itself through the move
        for kw in (kw_c, kw_e):
            kw["out"] = kw["values" if name == "swa_rope_scatter" else "q"]
    fn = getattr(module, name)
    got = torch.compile(lambda kw: fn(**kw), fullgraph=True, backend=backend)(kw_c)
    want = fn(**kw_e)
    assert (got is None) == (want is None)
    if want is not None:
        _same(got, want)
    _written_alike(kw_c, kw_e)
    torch._dynamo.reset()


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_wrapper_compiles_fullgraph_with_eager_bytes(case):
    """Each case alone, out given, allocated or None, and out the input itself (in_place)."""
    _compiled_equals_eager(case, "aot_eager")


def _to_cuda(kw: dict) -> dict:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_every_wrapper_compiles_fullgraph_on_the_triton_backend(case):
    """On CUDA tensors the ops run their Triton kernels (backend auto); compiled under inductor
    with fullgraph=True they give exactly the eager results and written bytes."""
    _compiled_equals_eager(case, "inductor", _to_cuda)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_public_function_compiles_fullgraph_through_its_op(case):
    """The public functions themselves (declared ops, kvformats.codec.op.Op) go through their
    dsv41_* op while dynamo traces: no second spelling for compiled code."""
    _compiled_equals_eager(case, "aot_eager", module=dsv41)


# The schemas the ops were first defined with (hand-written until issue 46): derived identically now.
FIRST_SCHEMAS = {
    "compressor_tail_scatter": "(Tensor content, Tensor scores, Tensor(a!) tail, Tensor slots, str backend, "
                               "bool check) -> ()",
    "compressor_pool": "(Tensor content, Tensor scores, Tensor tail, Tensor previous, Tensor tail_slots, "
                       "Tensor active, Tensor? norm_weight, float? norm_eps, Tensor(a!) out, str backend, "
                       "bool check) -> ()",
    "swa_rope_scatter": "(Tensor values, Tensor positions, Tensor cos_sin_cache, Tensor(a!) cache, Tensor slots, "
                        "str fmt, int page_size, Tensor(b!)? out, int first_slot, str negative_positions, "
                        "str backend, bool check) -> ()",
    "index_q_quantize": "(Tensor q, str fmt, Tensor(a!) out, str backend, bool check) -> ()",
}


def test_the_declarations_derive_the_first_schemas():
    from kvformats.deepseek_v41._dispatch import MODEL_FAMILY

    assert list(MODEL_FAMILY.declared) == list(FIRST_SCHEMAS) == list(dsv41.MODEL_OPS)
    for name, text in FIRST_SCHEMAS.items():
        assert MODEL_FAMILY.declared[name].schema.text == text
        assert str(_op(name)._schema) == f"kvformats::dsv41_{name}{text}"

