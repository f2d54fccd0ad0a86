"""torch.library custom ops: opcheck for every op of every registered format (CPU, reference
backend), torch.compile(fullgraph=True) encode -> decode with the eager bytes, and lazy import."""

import subprocess
import sys

import pytest
import torch

import kvformats as kvf
from kvformats.codec import torch_ops as kops

FORMATS = kvf.list_formats()


def case(name, n=3):
    lay = kvf.get_format(name, page_size=4)
    g = torch.Generator().manual_seed(0)
    if name == "compressor_state":
        w = lay.width
        inputs = [torch.randn(n, w, generator=g), torch.randn(n, w, generator=g), torch.arange(n),
                  torch.randn(lay.ratio, w, generator=g)]
    elif name == "compressor_state_v41":
        inputs = [torch.randn(n, lay.width, generator=g), torch.randn(n, lay.width, generator=g)]
    else:
        inputs = [torch.randn(n, lay.head_dim, generator=g).to(torch.bfloat16)]
    return lay, inputs, lay.allocate(3), torch.tensor([1, -1, 6, 11, 0, 9, -1])[:n]


# 0 and 1 rows: outputs that are views of one buffer stay views there (contiguous() keeps them),
# so the ops must still hand out tensors that alias neither the inputs nor each other
@pytest.mark.parametrize("n", [0, 1, 3, 7])
@pytest.mark.parametrize("name", FORMATS)
def test_opcheck_every_op(name, n):
    lay, inputs, cache, slots = case(name, n)
    key = kops.layout_key(lay)
    ops = torch.ops.kvformats
    torch.library.opcheck(ops.encode.default, (*key, inputs, cache, slots, "reference"))
    torch.library.opcheck(ops.decode.default, (*key, cache, slots, "reference"))
    torch.library.opcheck(ops.gather.default, (*key, cache, slots, "reference"))
    torch.library.opcheck(ops.decode_topk.default, (*key, cache, slots.reshape(n, 1).repeat(1, 2), "reference"))
    torch.library.opcheck(ops.decode_topk.default, (*key, cache, slots.reshape(1, n), "reference"))
    if n != 3:  # the paged ops do not depend on n
        return
    bt, sl, cu = torch.tensor([[0, 1], [2, -1]]), torch.tensor([5, 3]), torch.tensor([0, 5, 8])
    if lay.decode_dtype is not None:
        out = torch.zeros(2, 5, lay.head_dim, dtype=lay.decode_dtype)
        torch.library.opcheck(ops.dequantize_gather.default, (*key, cache, out, bt, sl, None, None, 0, "reference"))
    ws = [torch.zeros(8, s.record_bytes, dtype=torch.uint8) for s in lay.segments]
    torch.library.opcheck(ops.gather_paged.default, (*key, cache, bt, cu, ws, "reference"))


@pytest.mark.parametrize("name", FORMATS)
def test_wrappers_match_the_layout_methods(name):
    lay, inputs, cache, slots = case(name)
    ref = cache.clone()
    if name == "compressor_state":
        kops.encode(lay, (inputs[0], inputs[1]), cache, slots, positions=inputs[2], ape=inputs[3])
        lay.encode((inputs[0], inputs[1]), ref, slots, positions=inputs[2], ape=inputs[3])
    elif name == "compressor_state_v41":
        kops.encode(lay, (inputs[0], inputs[1]), cache, slots)
        lay.encode((inputs[0], inputs[1]), ref, slots)
    else:
        kops.encode(lay, inputs[0], cache, slots)
        lay.encode(inputs[0], ref, slots)
    assert torch.equal(cache, ref)
    assert torch.equal(kops.gather(lay, cache, slots), lay.gather(ref, slots))
    got, want = kops.decode(lay, cache, slots), lay.decode(ref, slots)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(a, b)


# The kvformats.codec.torch_ops wrappers take layout objects; dynamo folds layout_key(layout) into a
# constant from torch 2.13 on (torch 2.11 raises AsPythonConstantNotImplementedError there, seen on
# the H200 host). With older torch, compile the torch.ops.kvformats ops with a precomputed key.
WRAPPERS_COMPILE = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


@pytest.mark.skipif(not WRAPPERS_COMPILE, reason="the wrappers compile from torch 2.13 on (see WRAPPERS_COMPILE)")
@pytest.mark.parametrize("name, profile", [("fp8_ds_mla", "tokenspeed"), ("mxfp4_indexer", "vllm"),
                                           ("fp8_ds_mla_v32", "vllm")])
def test_compiled_encode_decode_has_no_graph_break_and_eager_bytes(name, profile):
    lay = kvf.get_format(name, page_size=4, profile=profile)

    def f(x, cache, slots):
        kops.encode(lay, x, cache, slots, backend="reference")
        return kops.decode(lay, cache, slots, backend="reference"), kops.gather(lay, cache, slots, backend="reference")

    x = torch.randn(5, lay.head_dim).to(torch.bfloat16)
    slots = torch.tensor([0, 3, -1, 7, 9])
    assert torch._dynamo.explain(f)(x, lay.allocate(3), slots).graph_break_count == 0
    c1, c2 = lay.allocate(3), lay.allocate(3)
    a = torch.compile(f, fullgraph=True, backend="aot_eager")(x, c1, slots)
    b = f(x, c2, slots)
    assert torch.equal(c1, c2) and torch.equal(a[1], b[1])
    assert torch.equal(a[0].contiguous().view(torch.uint8), b[0].contiguous().view(torch.uint8))
    torch._dynamo.reset()


def test_errors_pass_through_the_op_before_any_write():
    lay, inputs, cache, _ = case("fp8_ds_mla")
    with pytest.raises(kvf.InputError):
        kops.encode(lay, inputs[0], cache, torch.tensor([1, 2, 10_000]))
    assert int(cache.count_nonzero()) == 0


def test_check_false_reaches_the_layout_and_skips_only_the_slot_checks():
    lay, inputs, cache, _ = case("fp8_ds_mla")
    key, ops = kops.layout_key(lay), torch.ops.kvformats
    far, dup = torch.tensor([1, 2, 10_000]), torch.tensor([1, 2, 1])
    with pytest.raises(kvf.InputError):  # the default is check=True, as on the layout
        ops.gather(*key, cache, far, "reference")
    with pytest.raises(kvf.InputError):
        ops.encode(*key, inputs, cache, dup, "reference", True)
    ops.encode(*key, inputs, cache, far, "reference", False)  # the out-of-range row is skipped
    want = lay.allocate(3)
    lay.encode(inputs[0][:2], want, far[:2])
    assert torch.equal(cache, want)
    with pytest.raises(kvf.InputError):  # check=False leaves the shape and dtype checks on
        ops.encode(*key, [inputs[0].float()[:, :8]], cache, far, "reference", False)


def test_encode_op_takes_one_input_or_the_four_of_the_compressor_state():
    lay, inputs, cache, slots = case("fp8_ds_mla")
    key = kops.layout_key(lay)
    with pytest.raises(kvf.InputError, match="inputs"):
        torch.ops.kvformats.encode(*key, [inputs[0], inputs[0]], cache, slots, "reference")
    with pytest.raises(kvf.InputError, match="keyword"):  # four inputs for a layout that takes one
        torch.ops.kvformats.encode(*key, [inputs[0], inputs[0], slots, slots], cache, slots, "reference")
    state = kvf.CompressorState()
    with pytest.raises(kvf.InputError, match="positions"):  # one input for the compressor state
        torch.ops.kvformats.encode(*kops.layout_key(state), [inputs[0]], state.allocate(2), slots, "reference")
    assert int(cache.count_nonzero()) == 0


def test_a_mutating_op_bumps_the_version_counter():
    # Functionalization and autograd's saved-tensor checks rely on it; the ops are defined
    # through a Library fragment (kvformats.codec.torch_library), not custom_op, which did it explicitly.
    lay, inputs, cache, slots = case("fp8_ds_mla")
    before = cache._version
    kops.encode(lay, inputs[0], cache, slots)
    assert cache._version > before


def test_every_codec_op_is_a_torch_op():
    assert set(kops.TORCH_OP_NAMES) == {"encode", "decode", "gather", "decode_topk", "dequantize_gather",
                                        "gather_paged"}
    for name in kops.TORCH_OP_NAMES:
        assert isinstance(getattr(torch.ops.kvformats, name), torch._ops.OpOverloadPacket)


def test_import_kvformats_stays_light():
    code = "import sys, kvformats; assert 'kvformats.codec.torch_ops' not in sys.modules and 'kvformats.codec.convert' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, profile", [("fp8_ds_mla", "tokenspeed"), ("fp8_indexer", "deepgemm-ref"),
                                           ("mxfp4_indexer", "vllm"), ("fp8_ds_mla_v32", "vllm")])
def test_gpu_compiled_triton_encode_decode_no_graph_break_and_eager_bytes(name, profile):
    """The issue's GPU half: torch.compile(fullgraph=True) around the Triton-backed custom ops
    (inductor; the ops with a precomputed layout key, which any torch version compiles) gives the
    eager bytes, and opcheck passes for the triton backend on CUDA."""
    lay = kvf.get_format(name, page_size=64, profile=profile)
    key = kops.layout_key(lay)  # outside the compiled function: see WRAPPERS_COMPILE
    ops = torch.ops.kvformats

    def f(x, cache, slots):
        ops.encode(*key, [x], cache, slots, "triton")
        return ops.decode(*key, cache, slots, "triton"), ops.gather(*key, cache, slots, "triton")

    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, lay.head_dim, generator=g).to(torch.bfloat16).cuda()
    slots = torch.randperm(64 * 8, generator=g)[:300].cuda()
    slots[::7] = -1
    c1, c2 = lay.allocate(8, device="cuda"), lay.allocate(8, device="cuda")
    a = torch.compile(f, fullgraph=True)(x, c1, slots)
    b = f(x, c2, slots)
    assert torch.equal(c1.view(torch.uint8), c2.view(torch.uint8)) and torch.equal(a[1], b[1])
    (dec_a,), (dec_b,) = a[0], b[0]  # the raw decode op returns a list (one tensor for these formats)
    assert torch.equal(dec_a.contiguous().view(torch.uint8), dec_b.contiguous().view(torch.uint8))
    torch.library.opcheck(torch.ops.kvformats.encode.default, (*key, [x], c1, slots, "triton"))
    torch.library.opcheck(torch.ops.kvformats.decode.default, (*key, c1, slots, "triton"))
    torch._dynamo.reset()


# The schemas the codec ops were first defined with (hand-written until issue 46): the declarations
# (kvformats.codec.slot_ops / paged_ops, kvformats.codec.op.CODEC) derive exactly these.
_KEY, _TAIL = "str fmt, str params, ", "str backend, bool check=True"
FIRST_SCHEMAS = {
    "encode": f"({_KEY}Tensor[] inputs, Tensor(a!) cache, Tensor slots, {_TAIL}) -> ()",
    "decode": f"({_KEY}Tensor cache, Tensor slots, {_TAIL}) -> Tensor[]",
    "gather": f"({_KEY}Tensor cache, Tensor slots, {_TAIL}) -> Tensor",
    "decode_topk": f"({_KEY}Tensor cache, Tensor topk_slots, {_TAIL}) -> Tensor[]",
    "dequantize_gather": f"({_KEY}Tensor cache, Tensor(a!) out, Tensor block_table, Tensor seq_lens, "
                         f"Tensor? gather_lens, Tensor? base, int offset, {_TAIL}) -> ()",
    "gather_paged": f"({_KEY}Tensor cache, Tensor block_table, Tensor cu_seq_lens, Tensor(a!)[] out, {_TAIL}) -> ()",
}


def test_the_declared_codec_ops_keep_their_schemas_and_sites():
    from kvformats.codec.op import CODEC
    from kvformats.runtime import deferred

    assert set(kops.TORCH_OP_NAMES) == set(FIRST_SCHEMAS)
    for name, text in FIRST_SCHEMAS.items():
        assert CODEC.declared[name].schema.text == text
        assert str(getattr(torch.ops.kvformats, name).default._schema) == f"kvformats::{name}{text}"
    sites = {name: sorted(op.sites) for name, op in CODEC.declared.items()}
    assert sites == {"encode": ["slots"], "decode": ["slots"], "gather": ["slots"], "decode_topk": ["topk_slots"],
                     "dequantize_gather": ["gather_lens", "out"], "gather_paged": ["cu_seq_lens"]}
    assert all(i == deferred.site(op.name, arg) for op in CODEC.declared.values() for arg, i in op.sites.items())


@pytest.mark.parametrize("name", ["fp8_ds_mla", "mxfp4_indexer", "compressor_state"])
def test_the_layout_methods_compile_fullgraph_through_their_ops(name):
    """With kvformats.codec.torch_ops imported, dynamo traces Layout.encode / decode / gather /
    decode_topk / gather_paged as their ops (no graph break), with the eager bytes."""
    lay, inputs, cache, slots = case(name, 3)
    kw = {"positions": inputs[2], "ape": inputs[3]} if name == "compressor_state" else {}
    x = (inputs[0], inputs[1]) if name == "compressor_state" else inputs[0]

    def step(cache, slots):
        lay.encode(x, cache, slots, **kw)
        out = [lay.decode(cache, slots), lay.decode_topk(cache, slots.reshape(1, -1))]
        if lay.paged_reads:
            out.append(lay.gather(cache, slots))
            table = torch.tensor([[0, 1, 2]], dtype=torch.int32)
            cu = torch.tensor([0, 5], dtype=torch.int32)
            out.append(lay.gather_paged(cache, block_table=table, cu_seq_lens=cu, num_rows=5))
        return out

    got_cache, want_cache = cache.clone(), cache.clone()
    torch._dynamo.reset()
    assert torch._dynamo.explain(step)(cache.clone(), slots).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(got_cache, slots)
    want = step(want_cache, slots)
    assert torch.equal(got_cache, want_cache)
    flat = [t for o in (got, want) for t in torch.utils._pytree.tree_leaves(o)]
    half = len(flat) // 2
    assert all(torch.equal(a, b) for a, b in zip(flat[:half], flat[half:]))
    torch._dynamo.reset()


def test_the_wrappers_take_strict_mode_and_the_public_signatures():
    import inspect

    from kvformats.codec import paged_ops, slot_ops

    lay, inputs, cache, slots = case("fp8_ds_mla", 3)
    with pytest.raises(kvf.InputError):
        kops.encode(lay, inputs[0], cache, torch.tensor([1, 1, 2]), check="strict")
    for module in (slot_ops, paged_ops):
        for name in ("encode", "decode", "gather") if module is slot_ops else ("decode_topk", "dequantize_gather",
                                                                              "gather_paged"):
            assert inspect.signature(getattr(kops, name)) == inspect.signature(getattr(module, name))
