"""kvformats.compat.tokenspeed_kernel.dsv4's cache side (``_dsv4_cache``) against tokenspeed-kernel
0.1.4's released ``dsv4/__init__.py`` and ``dsv4/triton.py``: the wheel is fetched at test time
(tests/harness/released.py: ``pip download --no-deps``, cached, sha256 checked; skipped only when
the package index cannot be reached) and never kept in the repository.

* signatures: parameter names, kinds, defaults and annotations, and the return annotations, of the
  twelve functions, read with ``ast`` from the released files; the names are in the released
  ``__all__``; the ``DEEPSEEK_V4_*`` constants are triton.py's values (its assignments evaluated).
* the same call, the same result: every released triton.py function runs in one TRITON_INTERPRET=1
  child process with the GPU's float conversions (tests/harness/released_dsv4.py); the drop-ins run
  here on the same CPU tensors. Caches (sentinel-filled, some with padded page strides: the padding
  must stay as it was), queries, states and outputs are compared byte for byte and bit for bit,
  every argument after the call, with the returned values and their strides. Where tokenspeed
  rounds otherwise or is undefined, the test says what differs and checks exactly that: float32
  queries of the registered SWA kernel within 8 float32 ulps (the RMS norm's sum in another order;
  the cache bytes equal), the one MXFP4 row whose compress window is all missing pages (tokenspeed
  NaN codes, the drop-in the encoded zero vector; the FP8 insert agrees there), weights with a
  head stride other than 1 in the indexer query (tokenspeed reads other elements).
  ``dsv4_gather_indexer_mxfp4_cache``
  refuses non-CUDA tensors: its cache and slots are passed as ``Cudaish``, a CPU tensor subclass
  that reports ``is_cuda`` (the interpreter reads the CPU data), so its own kernel runs too.
  The two public functions of ``dsv4/__init__.py`` (``dsv4_swa_cache_insert``,
  ``dsv4_csa_indexer_fp8_cache_insert``) check their arguments and select a registered kernel, on
  Hopper the Triton one: the drop-ins are compared with that kernel's results on the same call, and
  the released wrappers themselves run in this process (``_released_api``: the registry stands for
  the Triton solution alone, its signatures and traits read from triton.py's ``register_kernel``
  decorators; the selected kernel records its arguments instead of running), to show they forward
  the arguments unchanged and which calls they refuse.
* bad input: the drop-in's typed error, with every tensor argument (caches included) as it was,
  where the released code refuses too (``ValueError`` / ``TypeError``, or ``NoKernelFoundError``
  from the registry) and where only the drop-in does (the module docstring's departures).

One child process for every released call (about 40, small tensors: 2-3 pages, at most 47
tokens); the module runs in about 15-25 s on a 2-core machine.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import types
from pathlib import Path

import pytest
import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.compat.tokenspeed_kernel import _dsv4_cache as ts
from kvformats.errors import InputError, InputTypeError, LayoutError
from kvformats.formats import Fp8DsMla
from kvformats.layout import storage_bytes
from tests.harness import released as rel
from tests.harness.dsv4_scenarios import make_batch
from tests.harness.released_dsv4 import DSV4_API, DSV4_TRITON, TOKENSPEED_KERNEL_DSV4, run_tokenspeed_dsv4

SENTINEL = rel.SENTINEL
HERE = Path(__file__).resolve().parent
FUNCTIONS = [n for n in ts.__all__ if not n.startswith("DEEPSEEK_V4_")]
API_FUNCTIONS = ("dsv4_indexer_cache_format", "dsv4_swa_cache_insert", "dsv4_csa_indexer_fp8_cache_insert")
ROW = {"swa": 584, "fp8": 132, "mxfp4": 68}  # bytes per cache row


class Cudaish(torch.Tensor):
    """CPU data reporting ``is_cuda``: the released MXFP4 gather refuses other tensors; the Triton
    interpreter runs on the data either way. Unpickled in the child process by this module's name."""

    @property
    def is_cuda(self):
        return True


# ----- inputs --------------------------------------------------------------------------------------
def _cache(pages: int, rows: int, kind: str, pad: int = 0) -> torch.Tensor:
    """A sentinel-filled ``[pages, rows * row_bytes]`` cache; ``pad`` bytes after each page."""
    page = rows * ROW[kind]
    return torch.full((pages, page + pad), SENTINEL, dtype=torch.uint8)[:, :page]


def _swa(t=6, h=2, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(11)
    q = torch.randn(t, h, 512, generator=g).to(dtype)
    kv = (torch.randn(t, 512, generator=g) * 30).to(dtype)
    slots = torch.tensor([3, -1, 0, 11, 9, 40])[:t]  # 40: beyond the 12 rows (skipped by both)
    positions = torch.tensor([0, 5, 7, 31, 63, 9, 2, 4])[:t]
    return q, kv, _cache(3, 4, "swa", pad=64), slots, positions, dsv4.cos_sin_cache(64, 64), 1e-6, 4


def _compress_kw(b, cache, page_size, **extra):
    """The keyword arguments of a compress insert of batch ``b`` into ``cache``."""
    return dict(state_cache=b.state, token_to_req_indices=b.req, positions=b.positions,
                compressor_slot_mapping=b.state_slots, block_table=b.state_table,
                compressor_block_size=b.state.shape[1], rms_norm_weight=b.weight, rms_norm_eps=b.eps,
                cos_sin_cache=b.cos_sin, kv_cache_2d=cache, kv_slot_mapping=b.target_slots,
                kv_cache_block_size=page_size, **extra)


def _indexer(kind: str, base: bool = False):
    """A CSA indexer insert; without ``base`` (the batch's table base offsets) one request's window
    finds only missing pages."""
    b = make_batch(4, 128, 64)
    extra = {"block_table_base_offsets": b.base} if base else {}
    return _compress_kw(b, _cache(int(b.target_table.max()) + 1, 64, kind, pad=64 if kind == "fp8" else 0),
                        64, compress_ratio=4, **extra)


def _sparse(ratio: int, mask: bool):
    if ratio == 4:
        b, page = make_batch(4, 512, 64), 64
    else:
        b, page = make_batch(128, 512, 2, seq_lens=(256, 130, 40), new_tokens=(3, 4, 40), base=(0, 0, 0),
                             missing=((0, 20),)), 2
    n = b.positions.shape[0]
    kv_mask = (torch.arange(n) % 5 != 1) if mask else None
    return _compress_kw(b, _cache(int(b.target_table.max()) + 1, page, "swa", pad=32), page,
                        compress_ratio=ratio, overlap=ratio == 4, block_table_base_offsets=b.base,
                        kv_write_mask=kv_mask)


def _save(ratio: int):
    g = torch.Generator().manual_seed(ratio)
    width = 1024 if ratio == 4 else 512
    kv, score = torch.randn(7, width, generator=g), torch.randn(7, width, generator=g)
    ape = torch.randn(ratio, width, generator=g)  # ratio 4: tokenspeed's runtime (reordered) ape, as passed
    state = torch.full((3, 4, 2 * width), -7.0)
    # 6 slots for 7 rows (the first 6 are read); positions longer still
    return (kv, score, ape, state, torch.tensor([0, 5, -1, 11, 7, 2]), torch.tensor([3, 9, 10, 11, 12, 1, 4, 4]), 4,
            ratio)


def _mxfp4_write(kind: str, valid_dtype=torch.bool):
    x = rel.input_rows(kind, 7, 128)
    valid = torch.tensor([1, 1, 1, 0, 1, 1]).to(valid_dtype)  # six entries: the 7th row is not read
    return x, _cache(2, 64, "mxfp4"), torch.tensor([0, 70, -1, 5, 127, 9, 3]), valid, 64


def _ds_mla_cache():
    lay = Fp8DsMla(head_dim=512, rope_dim=64, page_size=64)
    cache = lay.allocate(3)
    rows = (torch.randn(3 * 64, 512, generator=torch.Generator().manual_seed(5)) * 10).bfloat16()
    lay.encode(rows, cache, torch.arange(3 * 64))
    return cache


def _gather(**over):
    kw = dict(out=torch.full((2, 20, 512), 7.0, dtype=torch.bfloat16), cache_2d=_ds_mla_cache(),
              seq_lens=torch.tensor([70, 10]), gather_lens=torch.tensor([8, 10]),
              block_table=torch.tensor([[2, 0], [1, -1], [0, 0]]), block_size=64, offset=3)
    return {**kw, **over}


def _query(t=4, weights_shape=None, weights_dtype=torch.float32):
    g = torch.Generator().manual_seed(t)
    w = torch.randn(t, 3, generator=g).to(weights_dtype)
    return dict(index_q=(torch.randn(t, 3, 128, generator=g) * 4).bfloat16(),
                positions=torch.tensor([0, 3, 9, 60][:t], dtype=torch.int64), cos_sin_cache=dsv4.cos_sin_cache(64, 64),
                weights=w if weights_shape is None else w.reshape(weights_shape),
                softmax_scale=128 ** -0.5, head_scale=0.125, prefer_serial_four_block=True)


def _mxfp4_cache():
    return torch.randint(0, 256, (2, 64 * 68), generator=torch.Generator().manual_seed(9), dtype=torch.uint8)


# ----- the plan: key -> (released call, drop-in calls) ---------------------------------------------
def _plan() -> dict:
    """Each case: the released triton.py call ``(name, args, kwargs)`` and the drop-in calls that
    must give its results (``dsv4_swa_cache_insert`` / ``dsv4_csa_indexer_fp8_cache_insert``: the
    public functions whose Hopper kernel it is)."""
    plan = {}
    swa = _swa()
    q_out = torch.full_like(swa[0], 7.0)
    for key, args in (("swa", swa), ("swa q_out", (*swa, q_out))):
        plan[key] = (("triton_dsv4_swa_cache_insert", args, {}),
                     [("dsv4_swa_cache_insert", args, {"validate_positions": True}),
                      ("triton_dsv4_swa_cache_insert", args, {})])
    q, kv, cache, slots, pos, cs, eps, ps = _swa(t=4)
    longer = (q, torch.cat([kv, kv[:2]]), cache, slots[:3], torch.tensor([0, 5, 7, 31, 63, 9]), cs, eps, ps)
    plan["swa longer kv and positions"] = (("triton_dsv4_swa_cache_insert", longer, {}),
                                           [("triton_dsv4_swa_cache_insert", longer, {})])
    f32 = _swa(dtype=torch.float32)
    plan["swa float32"] = (("triton_dsv4_swa_cache_insert", f32, {}), [("triton_dsv4_swa_cache_insert", f32, {})])
    for key, kw in (("fp8", _indexer("fp8", base=True)), ("fp8 shortest of three", _indexer("fp8")),
                    ("mxfp4", _indexer("mxfp4", base=True)), ("mxfp4 shortest of three", _indexer("mxfp4", base=True)),
                    ("mxfp4 window all missing", _indexer("mxfp4"))):
        if key.endswith("three"):  # fewer kv slots than tokens; a persistent request map
            kw["kv_slot_mapping"] = kw["kv_slot_mapping"][:-5]
            kw["token_to_req_indices"] = torch.cat([kw["token_to_req_indices"], torch.zeros(4, dtype=torch.int64)])
        name = ("triton_dsv4_csa_indexer_fp8_cache_insert" if key.startswith("fp8")
                else "dsv4_fused_csa_indexer_mxfp4_cache_insert")
        calls = [(name, (), kw)] + ([("dsv4_csa_indexer_fp8_cache_insert", (), kw)] if key.startswith("fp8") else [])
        plan[key] = ((name, (), kw), calls)
    for ratio in (4, 128):
        for mask in (False, True):
            kw = _sparse(ratio, mask)
            plan[f"sparse {ratio} mask {mask}"] = (("dsv4_fused_sparse_compress_cache_insert", (), kw),
                                                   [("dsv4_fused_sparse_compress_cache_insert", (), kw)])
    for ratio in (4, 128):
        plan[f"save {ratio}"] = (("dsv4_save_compressor_state", _save(ratio), {}),
                                 [("dsv4_save_compressor_state", _save(ratio), {})])
    for kind in rel.KINDS:
        for valid in (torch.bool, torch.int32):
            args = _mxfp4_write(kind, valid)
            plan[f"write mxfp4 {kind} {valid}"] = (("write_dsv4_indexer_mxfp4_cache_cuda", args, {}),
                                                   [("write_dsv4_indexer_mxfp4_cache_cuda", args, {})])
    slots = torch.tensor([0, 70, -1, 5, 127, 9])
    gkw = dict(cache_2d=_mxfp4_cache(), slot_mapping=slots, values_out=torch.full((8, 70), SENTINEL, dtype=torch.uint8),
               scales_out=torch.full((8, 6), SENTINEL, dtype=torch.uint8), block_size=64)
    cuda_kw = {**gkw, "cache_2d": gkw["cache_2d"].as_subclass(Cudaish), "slot_mapping": slots.as_subclass(Cudaish)}
    plan["gather mxfp4"] = (("dsv4_gather_indexer_mxfp4_cache", (), cuda_kw),
                            [("dsv4_gather_indexer_mxfp4_cache", (), gkw)])
    for key, kw in (("dequantize gather", _gather()), ("dequantize gather all",
                                                       _gather(gather_lens=None, seq_lens=torch.tensor([12, 10]))),
                    ("dequantize gather base offsets", _gather(block_table_base_offsets=torch.tensor([1, 0]),
                                                               seq_lens=torch.tensor([130, 64]), max_gather_len=9))):
        plan[key] = (("dsv4_dequantize_and_gather_k_cache", (), kw), [("dsv4_dequantize_and_gather_k_cache", (), kw)])
    for key, kw in (("query", _query()), ("query weights [T, H, 1]", _query(weights_shape=(4, 3, 1))),
                    ("query bf16 weights", _query(weights_dtype=torch.bfloat16)), ("query no tokens", _query(t=0))):
        plan[key] = (("dsv4_fused_indexer_q_rope_hadamard_mxfp4", (), kw),
                     [("dsv4_fused_indexer_q_rope_hadamard_mxfp4", (), kw)])
    kw = _query(weights_shape=(3, 4))
    kw["weights"] = kw["weights"].t()  # strided weights (tokenspeed reads them with a unit head stride)
    plan["query strided weights"] = (("dsv4_fused_indexer_q_rope_hadamard_mxfp4", (), kw),
                                     [("dsv4_fused_indexer_q_rope_hadamard_mxfp4", (), kw)])
    for name, fn, args, kwargs, _, released in _bad_calls():
        if released != "not run" and fn not in API_FUNCTIONS:
            plan[("bad", name)] = ((fn, args, kwargs), [])
    return plan


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(key -> (released call, its record, drop-in calls), the wheel's files)."""
    root = tmp_path_factory.mktemp("tokenspeed-kernel-dsv4")
    try:
        rel.extract(TOKENSPEED_KERNEL_DSV4, root)
    except rel.IndexUnreachable as err:  # the only reason to skip
        pytest.skip(f"tokenspeed-kernel 0.1.4 not fetched: {err}")
    plan = _plan()
    with pytest.MonkeyPatch.context() as mp:  # the child imports this module (Cudaish) under its name here
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))
        results = run_tokenspeed_dsv4([call for call, _ in plan.values()], root, tmp_path_factory.mktemp("dsv4-run"))
    return {key: (call, rec, drop_ins) for (key, (call, drop_ins)), rec in zip(plan.items(), results)}, root


def _copy(a):
    """A copy with its strides and its whole storage (the padding of a strided cache too)."""
    if not isinstance(a, torch.Tensor):
        return a
    if type(a) is not torch.Tensor:
        a = a.as_subclass(torch.Tensor)
    return torch.empty(0, dtype=a.dtype).set_(a.untyped_storage().clone(), a.storage_offset(), a.shape, a.stride())


def _run(fn: str, args: tuple, kwargs: dict):
    """The drop-in's call on copies: (result, arguments after it, keyword arguments after it)."""
    args, kwargs = tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()}
    return getattr(ts, fn)(*args, **kwargs), args, kwargs


def _bits(t: torch.Tensor) -> torch.Tensor:
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    if t.is_floating_point():
        return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _same(got, want, what: str) -> None:
    """Equal values, bit for bit (dtype and shape too), or equal non-tensors; tuples item by item."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{what}[{i}]")
        return
    if not isinstance(want, torch.Tensor):
        assert got == want, what
        return
    assert (got.dtype, got.shape) == (want.dtype, want.shape), what
    assert torch.equal(_bits(got), _bits(want)), f"{what}: {rel.first_differences(got, want, _bits)}"


def _padding_kept(before, after) -> None:
    """Where ``before`` has padded pages (storage beyond its elements), that padding unchanged."""
    if isinstance(before, torch.Tensor) and storage_bytes(before).numel() > before.numel() * before.element_size():
        expect = _copy(before)
        expect.copy_(after)
        assert torch.equal(storage_bytes(expect), storage_bytes(after)), "bytes outside the cache's pages changed"


# ----- signatures, names, constants ---------------------------------------------------------------
_KINDS = {"args": inspect.Parameter.POSITIONAL_OR_KEYWORD, "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}


def _annotation(node):
    return inspect.Parameter.empty if node is None else ast.unparse(node)


def _signatures(path: Path) -> tuple[list[str], dict[str, list]]:
    """``__all__`` and, per function of ours defined there, [(name, kind, default, annotation), ...,
    return annotation], read with ast."""
    tree = ast.parse(path.read_text())
    names, sigs = [], {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS:
            a = node.args
            assert not a.posonlyargs and a.vararg is None and a.kwarg is None
            empty = inspect.Parameter.empty
            defaults = [empty] * (len(a.args) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
            params = [(p.arg, _KINDS["args"], d, _annotation(p.annotation)) for p, d in zip(a.args, defaults)]
            params += [(p.arg, _KINDS["kwonlyargs"], empty if d is None else ast.literal_eval(d),
                        _annotation(p.annotation)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
            sigs[node.name] = [*params, _annotation(node.returns)]
    return names, sigs


def test_signatures_and_names_are_the_released_ones(released):
    _, root = released
    api_names, api = _signatures(root / DSV4_API)
    triton_names, kernels = _signatures(root / DSV4_TRITON)
    assert sorted(api) == sorted(API_FUNCTIONS) and set(api) <= set(api_names)
    assert sorted(kernels) == sorted(set(FUNCTIONS) - set(API_FUNCTIONS)) and set(kernels) <= set(triton_names)
    for name, want in {**api, **kernels}.items():
        sig = inspect.signature(getattr(ts, name))
        got = [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]
        assert [*got, sig.return_annotation] == want, name


def _triton_namespace(root: Path) -> tuple[dict, dict]:
    """triton.py's ``DEEPSEEK_V4_*`` constants, and its ``register_kernel`` decorators as op ->
    (kernel name, signatures, traits), their expressions evaluated with those constants and the
    harness's stand-ins for ``format_signature`` / ``dense_tensor_format``."""
    ns = {"torch": torch, "frozenset": frozenset, "format_signature": lambda **kw: tuple(sorted(kw.items())),
          "dense_tensor_format": lambda dtype: ("dense", str(dtype))}
    tree = ast.parse((root / DSV4_TRITON).read_text())
    constants, kernels = {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "").startswith("DEEPSEEK_V4_"):
            ns[node.targets[0].id] = constants[node.targets[0].id] = eval(ast.unparse(node.value), ns)
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "register_kernel"
                        and ast.literal_eval(deco.args[1]) in ("dsv4_swa_cache_insert",
                                                               "dsv4_csa_indexer_fp8_cache_insert")):
                    kw = {k.arg: eval(ast.unparse(k.value), ns) for k in deco.keywords
                          if k.arg in ("signatures", "traits")}
                    kernels[ast.literal_eval(deco.args[1])] = (node.name, kw["signatures"], kw["traits"])
    return constants, kernels


def test_constants_are_triton_py_s(released):
    _, root = released
    constants, _ = _triton_namespace(root)
    assert sorted(constants) == sorted(n for n in ts.__all__ if n.startswith("DEEPSEEK_V4_"))
    for name, value in constants.items():
        assert type(getattr(ts, name)) is type(value) and getattr(ts, name) == value, name


# ----- the same call, the same result -------------------------------------------------------------
def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance of two float32 tensors in units in the last place."""
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


def _check_case(runs, key, float32_ulps: int = 0) -> None:
    """Each drop-in call of the case against the released record: the result (and its strides) and
    every argument after the call, bit for bit; float32 tensors within ``float32_ulps``."""
    call, rec, drop_ins = runs[key]
    assert "error" not in rec, rec["error"]
    for fn, args, kwargs in drop_ins:
        result, got_args, got_kwargs = _run(fn, args, kwargs)
        _same(result, rec["result"], f"{key}: {fn} result")
        if isinstance(result, tuple):  # returned tensors: the released strides too
            flat = [*result[0], result[1]], [*rec["result"][0], rec["result"][1]]
            assert [t.stride() for t in flat[0]] == [t.stride() for t in flat[1]], key
        pairs = [(before, after, rec["args"][i] if call[1] else rec["kwargs"][list(call[2])[i]], f"argument {i}")
                 for i, (before, after) in enumerate(zip(args, got_args))]
        pairs += [(kwargs[k], after, rec["kwargs"][k], k) for k, after in got_kwargs.items() if k in call[2]]
        for before, after, want, what in pairs:
            if float32_ulps and isinstance(want, torch.Tensor) and want.dtype is torch.float32:
                assert _ulps(after, want) <= float32_ulps, f"{key}: {fn} {what}"
            else:
                _same(after, want, f"{key}: {fn} {what}")
            _padding_kept(before, after)


@pytest.mark.parametrize("key", ["swa", "swa q_out", "swa longer kv and positions", "swa float32"])
def test_swa_insert_writes_the_released_bytes(released, key):
    """q normalised and rotated (in place, or into ``q_out`` with q unchanged) and the kv rows of the
    slots inside the cache, as the released Triton kernel (the public function's Hopper kernel).
    float32 q (the registered kernel takes it; the public function takes bf16 / fp16): the query
    within 8 float32 ulps of tokenspeed's, which sums the squares of the RMS norm in another order
    (bf16 queries round both to the same bits); the cache bytes equal."""
    _check_case(released[0], key, float32_ulps=8 if key == "swa float32" else 0)


@pytest.mark.parametrize("key", ["fp8", "fp8 shortest of three", "mxfp4", "mxfp4 shortest of three",
                                 "sparse 4 mask False", "sparse 4 mask True", "sparse 128 mask False",
                                 "sparse 128 mask True"])
def test_compress_inserts_write_the_released_bytes(released, key):
    """The CSA indexer inserts (FP8, MXFP4) and the sparse CSA / HCA inserts on batches with base
    offsets, missing pages and a write mask: the released bytes, on the released tokens (the
    shortest of the state slots, positions and kv slots)."""
    runs = released[0]
    _check_case(runs, key)
    cache = runs[key][1]["kwargs"]["kv_cache_2d"]
    assert int((cache != SENTINEL).any(1).sum()) > 0  # rows were written


@pytest.mark.parametrize("key", ["save 4", "save 128"] + [f"write mxfp4 {k} {d}" for k in rel.KINDS
                                                          for d in (torch.bool, torch.int32)])
def test_state_and_mxfp4_writers_write_the_released_bytes(released, key):
    """The compressor state rows (ratio 4 with tokenspeed's runtime ape order) and the MXFP4 indexer
    rows of every input kind (``valid`` bool or int, the first min(rows, slots, valid) rows)."""
    _check_case(released[0], key)


@pytest.mark.parametrize("key", ["gather mxfp4", "dequantize gather", "dequantize gather all",
                                 "dequantize gather base offsets", "query", "query weights [T, H, 1]",
                                 "query bf16 weights", "query no tokens"])
def test_reads_and_query_are_the_released_values(released, key):
    """The MXFP4 gather (released: CPU data as ``Cudaish``), the dequantize-gather into a sentinel
    workspace, and the indexer query prep's packed values, scales and weights, with their strides."""
    _check_case(released[0], key)


def test_a_compress_window_with_every_position_missing(released):
    """Without its base offsets, one request's window finds only missing pages: tokenspeed's MXFP4
    insert pools an empty softmax (NaN: value bytes 0x77), the drop-in writes the encoded zero
    vector (docs/porting-from-tokenspeed.md); the scale bytes and every other byte are equal."""
    call, rec, drop_ins = released[0]["mxfp4 window all missing"]
    _, _, kwargs = _run(*drop_ins[0])
    got, want = kwargs["kv_cache_2d"], rec["kwargs"]["kv_cache_2d"]
    values = got[:, :64 * 64].reshape(-1, 64), want[:, :64 * 64].reshape(-1, 64)
    differ = (values[0] != values[1]).any(1)
    assert int(differ.sum()) == 1
    assert bool((values[0][differ] == 0).all()) and bool((values[1][differ] == 0x77).all())
    assert torch.equal(got[:, 64 * 64:], want[:, 64 * 64:])


def test_query_with_strided_weights(released):
    """Weights whose head stride is not 1: tokenspeed's kernel reads and writes them as if it were
    (other elements); the drop-in's ``weights_out`` holds the weights of the right heads (those of
    the contiguous call), and the packed query and its scales equal tokenspeed's."""
    call, rec, drop_ins = released[0]["query strided weights"]
    result, _, kwargs = _run(*drop_ins[0])
    contiguous = ts.dsv4_fused_indexer_q_rope_hadamard_mxfp4(**{**kwargs, "weights": kwargs["weights"].contiguous()})
    _same(result, contiguous, "strided weights")
    _same(result[0], rec["result"][0], "packed query")
    assert not torch.equal(result[1], rec["result"][1])


# ----- the released public functions, run here ------------------------------------------------------
class NoKernelFound(RuntimeError):
    """tokenspeed's ``NoKernelFoundError``, as the stand-in registry raises it."""


def _released_api(root: Path, major: int = 9) -> tuple[types.ModuleType, list]:
    """The released ``dsv4/__init__.py`` imported here, and the list its kernel calls are recorded
    in. Its registry is the Triton solution of triton.py (signatures and traits as declared there;
    an override or solution naming another finds nothing); the platform an NVIDIA GPU of compute
    capability ``major``."""
    _, kernels = _triton_namespace(root)
    calls: list = []

    class Selected:
        def __init__(self, name):
            self.name = name

        def __call__(self, **kwargs):
            calls.append((self.name, kwargs))

    def select_kernel(family, mode, signature, *, traits=None, override=None, solution=None, **_):
        name, signatures, declared = kernels[mode]
        if solution not in (None, "triton") or override not in (None, "triton", name):
            raise NoKernelFound(f"no kernel {override or solution!r} for {mode}")
        if override is None and (signature not in signatures or any(
                (traits or {}).get(k) not in allowed for k, allowed in declared.items())):
            raise NoKernelFound(f"no kernel for {mode} with {signature} {traits}")
        return Selected(name)

    platform = types.SimpleNamespace(is_nvidia=True, is_cdna4=False, arch_version=types.SimpleNamespace(major=major))
    ns_fmt = lambda **kw: tuple(sorted(kw.items()))  # noqa: E731  (the stand-ins _triton_namespace uses)
    stubs = {
        "tokenspeed_kernel.platform": dict(PlatformInfo=rel._Unused, current_platform=lambda: platform),
        "tokenspeed_kernel.profiling": dict(ShapeCapture=rel._Unused(),
                                            kernel_scope=lambda *a, **k: contextlib.nullcontext()),
        "tokenspeed_kernel.registry": dict(KernelRegistry=rel._Unused),
        "tokenspeed_kernel.selection": dict(NoKernelFoundError=NoKernelFound, select_kernel=select_kernel,
                                            spec_matches_traits=rel._Unused),
        "tokenspeed_kernel.signature": dict(MXFP8_BLOCK_SCALE=32, format_signature=ns_fmt, tensor_format=rel._Unused,
                                            dense_tensor_format=lambda dtype: ("dense", str(dtype))),
        **{f"tokenspeed_kernel.ops.attention.dsv4.{m}": {} for m in ("cuda", "triton", "deep_gemm", "gluon")},
    }
    with rel._stubbed(stubs):
        return rel._import_file(f"_released_tokenspeed_kernel_dsv4_api_{major}", root / DSV4_API), calls


@pytest.mark.parametrize("key", ["swa", "swa q_out", "fp8", "fp8 shortest of three"])
def test_public_functions_call_their_kernel_with_the_arguments_given(released, key):
    """The released ``dsv4_swa_cache_insert`` / ``dsv4_csa_indexer_fp8_cache_insert`` accept these
    calls and pass every argument on, unchanged, to the kernel they select: the call the drop-ins
    were compared with above."""
    runs, root = released
    call, _, drop_ins = runs[key]
    fn, args, kwargs = next(c for c in drop_ins if c[0] in API_FUNCTIONS)
    api, calls = _released_api(root)
    getattr(api, fn)(*args, **kwargs)
    assert len(calls) == 1 and calls[0][0] == call[0]
    params = list(inspect.signature(getattr(ts, fn)).parameters)
    given = {**dict(zip(params, args)), **kwargs}
    given.pop("validate_positions", None)
    forwarded = calls[0][1]
    assert set(given) <= set(forwarded)
    for name, value in given.items():
        assert forwarded[name] is value if isinstance(value, torch.Tensor) else forwarded[name] == value, name


def test_kernel_choices_and_validate_positions_run_the_one_implementation(released):
    """Any kernel or solution tokenspeed registers for the public functions (the CUDA SWA insert is
    registered where tokenspeed's library is built) and ``validate_positions=False`` give the
    bytes of the plain call (kvformats checks positions either way)."""
    runs, _ = released
    for key, fn, choices in (("swa", "dsv4_swa_cache_insert", ("triton", "cuda", "triton_dsv4_swa_cache_insert",
                                                                "cuda_dsv4_swa_cache_insert")),
                             ("fp8", "dsv4_csa_indexer_fp8_cache_insert", ("triton",
                                                                           "triton_dsv4_csa_indexer_fp8_cache_insert"))):
        _, want_args, want_kwargs = _run(*next(c for c in runs[key][2] if c[0] == fn))
        _, args, kwargs = next(c for c in runs[key][2] if c[0] == fn)
        tries = [{"override": c} for c in choices] + [{"solution": c} for c in choices if "_" not in c]
        if fn == "dsv4_swa_cache_insert":
            tries.append({"validate_positions": False})
        for extra in tries:
            _, got_args, got_kwargs = _run(fn, args, {**kwargs, **extra})
            for got, want in [*zip(got_args, want_args), *((got_kwargs[k], v) for k, v in want_kwargs.items()
                                                           if isinstance(v, torch.Tensor))]:
                _same(got, want, f"{fn} {extra}")


def test_indexer_cache_format(released, monkeypatch):
    """The explicit choice, and the platform default: MXFP4 on Blackwell (compute capability 10),
    scaled FP8 on Hopper; without a GPU (tokenspeed raises) the drop-in gives 'fp8_scaled'."""
    _, root = released
    for major, blackwell in ((9, False), (10, True)):
        api, _ = _released_api(root, major)
        monkeypatch.setattr(ts, "_blackwell", lambda b=blackwell: b)
        for use_fp4 in (None, True, False, 1, 0):
            assert ts.dsv4_indexer_cache_format(use_fp4) == api.dsv4_indexer_cache_format(use_fp4)
    monkeypatch.undo()
    if not torch.cuda.is_available():
        assert ts.dsv4_indexer_cache_format() == "fp8_scaled"


# ----- bad input -------------------------------------------------------------------------------------
def _with(args: tuple, **changes) -> tuple:
    """``args`` of a positional call with some replaced (by parameter index)."""
    out = list(args)
    for i, v in changes.items():
        out[int(i[1:])] = v
    return tuple(out)


def _bad_calls() -> list:
    """(name, function, args, kwargs, the drop-in's error, the released code's answer: the name of
    the exception it raises, None where it runs the call, "not run" where it would read or write out
    of bounds, or where its check is of strides the child's dense copies do not keep: its
    ``is_contiguous()`` / ``stride(1) != 1`` checks refuse those). The public functions of
    ``dsv4/__init__.py`` are answered by ``_released_api``, in this process."""
    swa = _swa()
    q, kv, cache, slots, pos, cs, eps, ps = swa
    vp = {"validate_positions": True}
    api = "dsv4_swa_cache_insert"
    fp8, mx = _indexer("fp8"), _indexer("mxfp4")
    bad_slot = fp8["kv_slot_mapping"].clone()
    bad_slot[3] = 10_000  # the FP8 kernel of 0.1.4 skips it; kvformats refuses it (CPU)
    sparse, save, write = _sparse(4, True), _save(4), _mxfp4_write("normal")
    gkw = dict(cache_2d=_mxfp4_cache().as_subclass(Cudaish),
               slot_mapping=torch.tensor([0, 70, -1]).as_subclass(Cudaish),
               values_out=torch.full((4, 64), SENTINEL, dtype=torch.uint8),
               scales_out=torch.full((4, 4), SENTINEL, dtype=torch.uint8), block_size=64)
    return [
        # the public SWA insert: tokenspeed's checks
        ("swa q float32", api, _swa(dtype=torch.float32), vp, InputTypeError, "TypeError"),
        ("swa q head 256", api, _with(swa, a0=q[..., :256].contiguous()), vp, InputError, "ValueError"),
        ("swa kv strided", api, _with(swa, a1=torch.cat([kv, kv], 1)[:, :512]), vp, InputError, "ValueError"),
        ("swa positions short", api, _with(swa, a4=pos[:5]), vp, InputError, "ValueError"),
        ("swa slots longer than q", api, _with(swa, a3=torch.tensor([3, -1, 0, 11, 9, 1, 2])), vp, InputError,
         "ValueError"),
        ("swa positions int16", api, _with(swa, a4=pos.short()), vp, InputTypeError, "TypeError"),
        ("swa slots strided", api, _with(swa, a3=torch.stack([slots, slots], 1)[:, 0]), vp, InputError, "ValueError"),
        ("swa eps 0", api, _with(swa, a6=0.0), vp, InputError, "ValueError"),
        ("swa page size 0", api, _with(swa, a7=0), vp, InputError, "ValueError"),
        ("swa table 32 wide", api, _with(swa, a5=dsv4.cos_sin_cache(32, 64)), vp, InputError, "ValueError"),
        ("swa table float64", api, _with(swa, a5=cs.double()), vp, InputTypeError, "TypeError"),
        ("swa cache narrow", api, _with(swa, a2=cache[:, :1000]), vp, LayoutError, "ValueError"),
        ("swa position beyond the table", api, _with(swa, a4=torch.tensor([0, 5, 7, 64, 1, 2])), vp, InputError,
         "ValueError"),
        ("swa q_out shape", api, (*swa, torch.zeros(6, 3, 512, dtype=torch.bfloat16)), vp, InputError, "ValueError"),
        ("swa override", api, (*swa, None, "flashinfer"), vp, InputError, "NoKernelFound"),
        ("swa solution", api, (*swa, None, None, "gluon"), vp, InputError, "NoKernelFound"),
        # tokenspeed runs it (float16: the RoPE tail stored as float16, not the format)
        ("swa q float16", api, _swa(dtype=torch.float16), vp, InputTypeError, None),
        # the registered SWA kernel
        ("triton swa q_out shape", "triton_dsv4_swa_cache_insert", (*swa, torch.zeros(6, 3, 512, dtype=torch.bfloat16)),
         {}, InputError, "ValueError"),
        ("triton swa head 256", "triton_dsv4_swa_cache_insert", _with(swa, a0=q[..., :256].contiguous()), {},
         InputError, "ValueError"),
        ("triton swa inserts beyond q", "triton_dsv4_swa_cache_insert",
         _with(swa, a0=q[:4].contiguous()), {}, InputError, None),
        ("triton swa kv short", "triton_dsv4_swa_cache_insert", _with(swa, a1=kv[:4], a3=slots[:4]), {}, InputError,
         None),
        # the CSA indexer inserts
        ("fp8 page 32", "triton_dsv4_csa_indexer_fp8_cache_insert", (), {**fp8, "kv_cache_block_size": 32},
         InputError, "ValueError"),
        ("fp8 ratio 8", "triton_dsv4_csa_indexer_fp8_cache_insert", (), {**fp8, "compress_ratio": 8}, InputError,
         "ValueError"),
        ("fp8 kv slot beyond the cache", "triton_dsv4_csa_indexer_fp8_cache_insert", (),
         {**fp8, "kv_slot_mapping": bad_slot}, InputError, None),
        ("fp8 api page 32", "dsv4_csa_indexer_fp8_cache_insert", (), {**fp8, "kv_cache_block_size": 32}, InputError,
         "NoKernelFound"),
        ("fp8 api weight 64", "dsv4_csa_indexer_fp8_cache_insert", (), {**fp8, "rms_norm_weight": fp8[
            "rms_norm_weight"][:64]}, InputError, "NoKernelFound"),
        ("fp8 api state float64", "dsv4_csa_indexer_fp8_cache_insert", (), {**fp8, "state_cache": fp8[
            "state_cache"].double()}, InputTypeError, "NoKernelFound"),
        ("fp8 api override", "dsv4_csa_indexer_fp8_cache_insert", (), {**fp8, "override": "cuda"}, InputError,
         "NoKernelFound"),
        ("mxfp4 ratio 8", "dsv4_fused_csa_indexer_mxfp4_cache_insert", (), {**mx, "compress_ratio": 8}, InputError,
         None),
        ("mxfp4 weight 64", "dsv4_fused_csa_indexer_mxfp4_cache_insert", (), {**mx, "rms_norm_weight": mx[
            "rms_norm_weight"][:64]}, InputError, "not run"),
        # the sparse compress insert
        ("sparse mask int", "dsv4_fused_sparse_compress_cache_insert", (),
         {**sparse, "kv_write_mask": sparse["kv_write_mask"].int()}, InputTypeError, "ValueError"),
        ("sparse mask strided", "dsv4_fused_sparse_compress_cache_insert", (),
         {**sparse, "kv_write_mask": sparse["kv_write_mask"].repeat_interleave(2)[::2]}, InputError, "not run"),
        ("sparse mask short", "dsv4_fused_sparse_compress_cache_insert", (),
         {**sparse, "kv_write_mask": sparse["kv_write_mask"][:3]}, InputError, "ValueError"),
        ("sparse ratio 8", "dsv4_fused_sparse_compress_cache_insert", (), {**sparse, "compress_ratio": 8},
         InputError, None),
        ("sparse ratio 4 without overlap", "dsv4_fused_sparse_compress_cache_insert", (), {**sparse, "overlap": False},
         InputError, None),
        # the state and MXFP4 writers (tokenspeed checks nothing there)
        ("save block size 2", "dsv4_save_compressor_state", _with(save, a4=torch.tensor([0, 1, 3, -1, 5, 2]), a6=2),
         {}, InputError, None),
        ("save repeated slots", "dsv4_save_compressor_state", _with(save, a4=torch.tensor([0, 5, 5, 11, 7, 2])), {},
         InputError, None),
        ("write mxfp4 width 256", "write_dsv4_indexer_mxfp4_cache_cuda",
         _with(write, a0=rel.input_rows("normal", 7, 256)), {}, InputError, None),
        ("write mxfp4 repeated slots", "write_dsv4_indexer_mxfp4_cache_cuda",
         _with(write, a2=torch.tensor([0, 70, 70, 5, 127, 9, 3])), {}, InputError, None),
        ("write mxfp4 valid 2-D", "write_dsv4_indexer_mxfp4_cache_cuda", _with(write, a3=write[3].view(6, 1)), {},
         InputError, None),
        ("write mxfp4 slot beyond the cache", "write_dsv4_indexer_mxfp4_cache_cuda",
         _with(write, a2=torch.tensor([0, 700, 7, 5, 127, 9, 3])), {}, InputError, "not run"),
        # the readers
        ("gather values int8", "dsv4_gather_indexer_mxfp4_cache", (),
         {**gkw, "values_out": gkw["values_out"].view(torch.int8)}, InputTypeError, "TypeError"),
        ("gather scales narrow", "dsv4_gather_indexer_mxfp4_cache", (), {**gkw, "scales_out": gkw["scales_out"][:, :3]},
         InputError, "ValueError"),
        ("gather rows short", "dsv4_gather_indexer_mxfp4_cache", (), {**gkw, "values_out": gkw["values_out"][:2]},
         InputError, "ValueError"),
        ("gather values strided", "dsv4_gather_indexer_mxfp4_cache", (),
         {**gkw, "values_out": torch.full((4, 128), SENTINEL, dtype=torch.uint8)[:, ::2]}, InputError, "not run"),
        ("gather slot beyond the cache", "dsv4_gather_indexer_mxfp4_cache", (),
         {**gkw, "slot_mapping": torch.tensor([0, 700, 1]).as_subclass(Cudaish)}, InputError, "not run"),
        ("dequantize out float32", "dsv4_dequantize_and_gather_k_cache", (), _gather(out=torch.zeros(2, 20, 512)),
         InputTypeError, "TypeError"),
        ("dequantize cache int8", "dsv4_dequantize_and_gather_k_cache", (),
         _gather(cache_2d=_ds_mla_cache().view(torch.int8)), InputTypeError, "TypeError"),
        ("dequantize workspace too narrow", "dsv4_dequantize_and_gather_k_cache", (), _gather(offset=15), InputError,
         "not run"),
        ("query head 256", "dsv4_fused_indexer_q_rope_hadamard_mxfp4", (),
         {**_query(), "index_q": _query()["index_q"].repeat(1, 1, 2)}, InputError, None),
        ("query table 32 wide", "dsv4_fused_indexer_q_rope_hadamard_mxfp4", (),
         {**_query(), "cos_sin_cache": dsv4.cos_sin_cache(32, 64)}, InputError, "not run"),
    ]


def _answer(runs, root, name, fn, args, kwargs, released):
    """The released code's answer to a bad call: the exception's type name, or None."""
    if released == "not run":
        return released
    if fn in API_FUNCTIONS:
        api, calls = _released_api(root)
        try:
            getattr(api, fn)(*args, **kwargs)
        except Exception as err:  # the released refusal, as data
            return type(err).__name__
        assert len(calls) == 1
        return None
    rec = runs[("bad", name)][1]
    return rec["error"][0] if "error" in rec else None


@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_bad_input_raises_typed_errors_with_nothing_written(released, case):
    name, fn, args, kwargs, error, want = case
    runs, root = released
    assert _answer(runs, root, name, fn, args, kwargs, want) == want, name
    copies, kw_copies = tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()}
    with pytest.raises(error) as info:
        getattr(ts, fn)(*copies, **kw_copies)
    assert isinstance(info.value, ValueError)
    if want == "TypeError":  # code catching tokenspeed's TypeError catches the drop-in's
        assert isinstance(info.value, TypeError)
    for before, after in [*zip(args, copies), *((kwargs[k], kw_copies[k]) for k in kwargs)]:
        if isinstance(before, torch.Tensor):
            assert torch.equal(storage_bytes(_copy(before)), storage_bytes(after)), name
