"""Issue #25, codec side: layout parameters are exact ints with bounded pages, get_format names
the valid parameters, shape errors say the expected rank, rope_tail's positions are checked,
every format and profile takes empty batches."""

import functools
import json

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.codec import torch_ops as kops
from kvformats.codec.convert import convert_rows, convert_slots, pack_ue8m0, unpack_ue8m0
from kvformats.deepseek_v4 import rope
from kvformats.numerics.profiles import supported_profiles
from tests.harness.capabilities import require
from kvformats.testing.strategies import storage_bytes

INT_PARAMS = [(name, field) for name in kvf.list_formats()
              for field, value in kvf.get_format(name).params.items() if isinstance(value, int)]


# ----- item 6: exact-int parameters, bounded pages -------------------------------------------------
@pytest.mark.parametrize("name, field", INT_PARAMS)
@pytest.mark.parametrize("kind", [float, bool])
def test_int_parameters_refuse_floats_and_bools(name, field, kind):
    value = kvf.get_format(name).params[field]
    bad = float(value) if kind is float else True
    with pytest.raises(kvf.LayoutError, match=field) as info:
        kvf.get_format(name, **{field: bad})
    assert type(bad).__name__ in str(info.value)


def test_float_ratio_is_refused_and_cannot_poison_the_op_layout_cache():
    with pytest.raises(kvf.LayoutError, match=r"ratio must be one of 4, 128 \(an int\), got 4.0 \(float\)"):
        kvf.CompressorState(ratio=4.0)
    with pytest.raises(kvf.LayoutError, match="bool"):
        kvf.CompressorState(ratio=True)
    lay = kvf.CompressorState(ratio=4, page_size=2)
    assert json.loads(kops.layout_key(lay)[1])["ratio"] == 4
    w = lay.width
    cache = lay.allocate(2)
    kv, score = torch.randn(3, w), torch.randn(3, w)
    kops.encode(lay, (kv, score), cache, torch.tensor([0, 2, 3]), positions=torch.arange(3), ape=torch.zeros(4, w))
    got_kv, _ = kops.decode(lay, cache, torch.tensor([0, 2, 3]))
    assert torch.equal(got_kv, kv)


@pytest.mark.parametrize("name", kvf.list_formats())
def test_huge_page_size_is_a_layout_error_at_construction(name):
    with pytest.raises(kvf.LayoutError, match="page_size") as info:
        kvf.get_format(name, page_size=2**62)
    assert "2**63 - 1" in str(info.value)
    lay = kvf.get_format(name, page_size=2**20)  # large but representable: fine
    assert lay.page_bytes < 2**63


def test_allocate_bounds_the_arena_and_takes_exact_ints():
    lay = kvf.Fp8Indexer(page_size=2**40)
    with pytest.raises(kvf.LayoutError, match="allocate fewer pages"):
        lay.allocate(2**30)
    with pytest.raises(kvf.LayoutError, match="num_pages"):
        lay.allocate(2.0)
    with pytest.raises(kvf.LayoutError, match="page_stride"):
        kvf.Fp8Indexer().allocate(2, page_stride=True)
    assert kvf.Fp8Indexer(page_size=2).allocate(0).shape == (0, 264)


# ----- item 16: messages -------------------------------------------------------------------------------
def test_get_format_lists_the_valid_parameters():
    with pytest.raises(kvf.LayoutError) as info:
        kvf.get_format("fp8_ds_mla", pagesize=2)
    msg = str(info.value)
    assert "unexpected keyword" not in msg
    assert "'pagesize'" in msg and "did you mean 'page_size'" in msg
    assert "head_dim, rope_dim, page_size, profile" in msg
    with pytest.raises(kvf.LayoutError, match="compressor_state has no parameter 'bogus'; its parameters are "
                                              "head_dim, ratio, page_size"):
        kvf.get_format("compressor_state", bogus=1)


def test_shape_errors_name_the_rank_expected_and_what_came():
    lay = kvf.Fp8DsMla(page_size=4)
    cache = lay.allocate(1)
    with pytest.raises(kvf.InputError, match=r"slots must be a 1-D tensor \[N\] \(N any size\), got a 2-D "):
        lay.decode(cache, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(kvf.InputError, match=r"x must be a 2-D tensor \[N, 512\] \(N any size\), got a 3-D .*"
                                             r"\(2, 2, 512\)"):
        lay.encode(torch.zeros(2, 2, 512), cache, torch.zeros(2, dtype=torch.long))
    with pytest.raises(kvf.InputError, match=r"x must be a 2-D tensor \[N, 512\] \(N any size\), got torch.float32 "
                                             r"tensor of shape \(2, 500\)"):
        lay.encode(torch.zeros(2, 500), cache, torch.zeros(2, dtype=torch.long))
    with pytest.raises(kvf.InputError, match=r"slots must be a 1-D tensor \[2\], got torch.int64 tensor of shape "
                                             r"\(3,\)"):
        lay.encode(torch.zeros(2, 512), cache, torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("positions", [[3, 9], [-1, 2]], ids=["beyond", "negative"])
def test_rope_tail_positions_outside_the_table_are_input_errors(positions, monkeypatch):
    cs = dsv4.cos_sin_cache(64, 8)
    computed = []
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: computed.append(1) or self)
    with pytest.raises(kvf.InputError, match=r"positions must lie in \[0, 8\)"):
        dsv4.rope_tail(torch.zeros(2, 128), torch.tensor(positions), cs)
    assert not computed  # nothing computed before the check
    monkeypatch.undo()
    assert dsv4.rope_tail(torch.zeros(2, 128), torch.tensor([0, 7]), cs).shape == (2, 128)


@pytest.mark.parametrize("call, err, words", [
    (lambda cs: rope.rope_tail(torch.zeros(2, 128), torch.tensor([0.0, 1.0]), cs), kvf.InputTypeError, "integer"),
    (lambda cs: rope.rope_tail(torch.zeros(2, 128), torch.tensor([0, 1, 2]), cs), kvf.InputError, "N = x.shape[0]"),
    (lambda cs: rope.rope_tail(torch.zeros(2, 32), torch.tensor([0, 1]), cs), kvf.InputError, "at most"),
    (lambda cs: rope.rope_tail([0.0], torch.tensor([0]), cs), kvf.InputTypeError, "floating-point"),
    (lambda cs: rope.cos_sin_cache(63, 8), kvf.InputError, "even"),
    (lambda cs: rope.cos_sin_cache(64, 8.0), kvf.InputTypeError, "max_positions"),
], ids=["float-positions", "count", "narrow-x", "not-tensor", "odd-rope", "float-length"])
def test_rope_argument_errors_are_typed(call, err, words):
    with pytest.raises(err, match=words.replace("[", r"\[").replace("]", r"\]")):
        call(dsv4.cos_sin_cache(64, 8))


# ----- item 5: empty batches, every format x profile ---------------------------------------------
# one-block geometries too (each format's Layout.examples.one_block): a reduction over an empty
# batch there leaves a [0, 1] tensor with a zero stride, which a byte view refuses (fp8_indexer
# deepgemm-ref, fp8_ds_mla_v32 head 192)
EMPTY_CASES = [pytest.param(name, profile, geometry, id=f"{name}-{profile}-{geometry}")
               for name in kvf.list_formats()
               for profile in (supported_profiles().get(name) or (None,))
               for geometry in ("default", "one-block")]


def _layout(name, profile, geometry):
    if geometry == "one-block":
        require(name, "one_block")
    params = dict(type(kvf.get_format(name)).examples.one_block if geometry == "one-block" else {}, page_size=4)
    return kvf.get_format(name, **params, **({} if profile is None else {"profile": profile}))


def _rows(lay, n):
    """encode's (x, keyword arguments) for n rows."""
    if isinstance(lay, kvf.CompressorStateV41):
        return (torch.randn(n, lay.width), torch.randn(n, lay.width)), {}
    if lay.decode_dtype is None:
        w = lay.width
        return (torch.randn(n, w), torch.randn(n, w)), dict(positions=torch.arange(n), ape=torch.randn(lay.ratio, w))
    return torch.randn(n, lay.head_dim), {}


@pytest.mark.parametrize("name, profile, geometry", EMPTY_CASES)
def test_empty_batches_encode_decode_gather_and_convert(name, profile, geometry):
    lay = _layout(name, profile, geometry)
    cache = lay.allocate(2)
    storage_bytes(cache).fill_(0xA5)
    before = storage_bytes(cache).clone()
    none = torch.zeros(0, dtype=torch.int64)
    x, kw = _rows(lay, 0)
    lay.encode(x, cache, none, **kw)
    assert torch.equal(storage_bytes(cache), before)
    width = lay.width if lay.decode_dtype is None else lay.head_dim
    decoded = lay.decode(cache, none)
    for t in decoded if isinstance(decoded, tuple) else (decoded,):
        assert t.shape == (0, width)
    assert lay.gather(cache, none).shape == (0, lay.row_bytes)
    for topk_shape in ((0, 3), (2, 0)):
        got = lay.decode_topk(cache, torch.zeros(topk_shape, dtype=torch.int64))
        for t in got if isinstance(got, tuple) else (got,):
            assert t.shape == (*topk_shape, width)
    assert convert_rows(lay, torch.zeros(0, lay.row_bytes, dtype=torch.uint8), lay).shape == (0, lay.row_bytes)
    dst = lay.allocate(1)
    convert_slots(lay, cache, none, lay, dst, none)
    assert int(storage_bytes(dst).count_nonzero()) == 0
    assert torch.equal(storage_bytes(cache), before)
    if geometry == "default":
        key, ops = kops.layout_key(lay), torch.ops.kvformats
        inputs = [*x, *(kw[k] for k in ("positions", "ape") if k in kw)] if isinstance(x, tuple) else [x]
        torch.library.opcheck(ops.encode.default, (*key, inputs, cache, none, "reference"))
        torch.library.opcheck(ops.gather.default, (*key, cache, none, "reference"))


# ----- item 7: inputs that require grad --------------------------------------------------------------
@pytest.mark.parametrize("path", ["layout", "custom_op"])
def test_compressor_state_encode_takes_inputs_that_require_grad(path):
    lay = kvf.CompressorState(head_dim=64, page_size=4)
    w, slots, positions = lay.width, torch.tensor([0, 5, -1]), torch.tensor([3, 6, 9])
    g = torch.Generator().manual_seed(7)
    kv, score, ape = torch.randn(3, w, generator=g), torch.randn(3, w, generator=g), torch.randn(4, w, generator=g)
    want = lay.allocate(2)
    lay.encode((kv, score), want, slots, positions=positions, ape=ape)
    got = lay.allocate(2)
    leaves = [t.clone().requires_grad_() for t in (kv, score, ape)]
    encode = lay.encode if path == "layout" else functools.partial(kops.encode, lay)
    encode((leaves[0], leaves[1]), got, slots, positions=positions, ape=leaves[2])
    assert torch.equal(got, want) and not got.requires_grad
    assert all(t.grad is None for t in leaves)


@pytest.mark.parametrize("path", ["function", "custom_op"])
def test_save_compressor_state_takes_inputs_that_require_grad(path):
    from kvformats.deepseek_v4 import torch_ops as dops

    state = kvf.CompressorState(head_dim=64, ratio=128, page_size=2)
    g = torch.Generator().manual_seed(8)
    kv, score, ape = (torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g),
                      torch.randn(128, 64, generator=g).to(torch.bfloat16))
    kw = dict(ratio=128, positions=torch.tensor([0, 130, 7]), slots=torch.tensor([1, -1, 2]))
    want = state.allocate(2)
    dsv4.save_compressor_state(kv, score, ape, want, **kw)
    got = state.allocate(2)
    save = dsv4.save_compressor_state if path == "function" else dops.save_compressor_state
    save(kv.requires_grad_(), score.requires_grad_(), ape.requires_grad_(), got, **kw)
    assert torch.equal(got, want) and int(got.count_nonzero()) > 0 and not got.requires_grad


# ----- item 11: backend="triton" never falls back silently --------------------------------------------
@pytest.fixture
def cuda_dispatch(monkeypatch):
    """Dispatch as on a CUDA device (the kernels run under the Triton interpreter on CPU)."""
    from kvformats.codec import registry

    real = registry._resolve
    monkeypatch.setattr(registry, "_RESOLVED", {})
    monkeypatch.setattr(registry, "_resolve", lambda fmt, op, backend, device: real(fmt, op, backend,
                                                                                     torch.device("cuda")))


def _inv_rope_args(group, d):
    g = torch.Generator().manual_seed(11)
    return (torch.randn(3, 2, d, generator=g), torch.tensor([0, 4, 9]), dsv4.cos_sin_cache(64, 10)), \
        dict(n_groups=1, heads_per_group=2, quant_group_size=group, tma_aligned_scales=False)


@pytest.mark.parametrize("op, args, words", [
    ("inv_rope_fp8_quant", _inv_rope_args(96, 192), "quant_group_size 96 with rope_dim 64"),
    ("inv_rope_fp8_quant", _inv_rope_args(256, 512), "quant_group_size 256"),
    ("inv_rope_fp8_quant", _inv_rope_args(32, 128), "quant_group_size 32 with rope_dim 64"),
    ("hadamard_transform", ((torch.randn(2, 2048),), {}), "rows of 2048 elements"),
], ids=["group-96", "group-256", "tail-wider-than-group", "hadamard-2048"])
def test_triton_backend_refuses_shapes_its_kernel_does_not_run(cuda_dispatch, op, args, words):
    from kvformats.deepseek_v4 import _dispatch as D

    fn = getattr(dsv4, op)
    assert D.resolve(op, "auto", torch.device("cpu")) is not D.resolve(op, "reference", torch.device("cpu"))
    with pytest.raises(kvf.BackendUnavailableError, match="backend='reference'") as info:
        fn(*args[0], **args[1], backend="triton")
    assert words in str(info.value) and f"deepseek_v4.{op}" in str(info.value)
    want = fn(*args[0], **args[1], backend="reference")
    got = fn(*args[0], **args[1], backend="auto")  # auto: the reference, documented
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def test_triton_backend_runs_the_kernel_for_shapes_it_supports(cuda_dispatch, monkeypatch):
    from kvformats_kernels.dsv4 import query as kq

    launched = []
    real = kq.jit.inv_rope_kernel
    monkeypatch.setattr(kq.jit, "inv_rope_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: launched.append(grid) or real[grid]})())
    args, kw = _inv_rope_args(64, 128)
    got = dsv4.inv_rope_fp8_quant(*args, **kw, backend="triton")
    want = dsv4.inv_rope_fp8_quant(*args, **kw, backend="reference")
    assert launched and all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
                            for a, b in zip(got, want))


# ----- item 16, the same class in kvformats.codec.convert: messages say what came, k is an exact int -------------
@pytest.mark.parametrize("call, err, words", [
    (lambda: convert_rows(kvf.Mxfp4Indexer(), torch.zeros(2, 3), kvf.Mxfp4Indexer()), kvf.InputError,
     ["uint8 tensor [N, 68]", "torch.float32 tensor of shape (2, 3)"]),
    (lambda: pack_ue8m0(torch.zeros(4, dtype=torch.uint8)), kvf.InputError, ["[N, k]", "shape (4,)"]),
    (lambda: unpack_ue8m0(torch.zeros(2, 1), 4), kvf.InputError, ["int32 tensor [N, w]", "torch.float32"]),
    (lambda: unpack_ue8m0(torch.zeros(2, 1, dtype=torch.int32), True), kvf.InputTypeError, ["k must be an int", "bool"]),
    (lambda: unpack_ue8m0(torch.zeros(2, 1, dtype=torch.int32), 5), kvf.InputError, ["[1, 4]", "5"]),
], ids=["rows", "pack", "unpack", "k-bool", "k-range"])
def test_convert_errors_say_what_came(call, err, words):
    with pytest.raises(err) as info:
        call()
    for w in words:
        assert w in str(info.value), (w, str(info.value))
