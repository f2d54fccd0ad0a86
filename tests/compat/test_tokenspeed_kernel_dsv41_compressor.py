"""kvformats.compat.tokenspeed_kernel._dsv41_compressor against tokenspeed-kernel 0.1.4's released
``compressor_tail_scatter`` and ``compressor_pool`` (``tokenspeed_kernel.ops.attention.dsv41``): the
wheel fetched at test time (tests/harness/released.py; skipped only when the package index cannot
be reached), its ``dsv41/__init__.py`` read with ``ast`` for the signatures, its ``triton.py``
solutions run in one TRITON_INTERPRET=1 child process with the GPU's float conversions.

* signatures: names, kinds, defaults, annotations and return annotations of the two functions;
  both are in the released ``__all__``;
* ``compressor_tail_scatter``: the whole tail after the call equals the released one bit for bit
  (slots -1, beyond the field, page 0, int32 and int64; a column-strided ``scores``);
* ``compressor_pool``: with kvformats' Triton kernel under the interpreter (numpy's exp, as the
  released kernel has there), without ``norm_weight`` the released float32 bits; with it the
  released bf16 bits on every row whose sum of squares is the same in both orders (tokenspeed's
  ``tl.sum``, numpy's pairwise sum under the interpreter; kvformats: adjacent pairs), and at most
  one code apart on the others. On the CPU reference (torch's exp): the released bits wherever
  numpy's and torch's exp agree, within the documented bound elsewhere. Returned ``out`` is the
  one passed; dtype, shape and strides of an allocated one are the released ones;
* bad input: the typed error with every argument untouched, where the released code refuses
  (``ValueError``) and where only the drop-in does.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

import kvformats as kvf
from kvformats.compat.tokenspeed_kernel import _dsv41_compressor as dc
from tests.harness import released as rel

W = 512
NAMES = ("compressor_tail_scatter", "compressor_pool")
IE, TE, LE = kvf.InputError, kvf.InputTypeError, kvf.LayoutError
ROOT = Path(__file__).resolve().parents[2]
# documented bound where two exps differ: ULPS ulps of |c0 * w0| + |c1 * w1| (docs/reference/deepseek_v41.md)
ULPS = 8

# ----- inputs -------------------------------------------------------------------------------------
def pool_args(seed: int, n: int = 12, pages: int = 4, *, norm=None, specials: bool = False, out: bool = False,
              int32: bool = False) -> tuple:
    """compressor_pool's nine arguments, in the released order: every kind of predecessor (an
    input row, a live tail row, the null page, beyond the tail, previous >= T, inactive rows)."""
    g = torch.Generator().manual_seed(seed)
    content = torch.randn(n, W, generator=g) * 4
    scores = torch.randn(n, W, generator=g) * 3
    tail = torch.randn(pages, 2, 2, W, generator=g)
    tail[:, :, 1] *= 3
    if specials:
        for x in (content, scores):
            flat = x.view(-1)
            at = torch.randperm(flat.numel(), generator=g)[:20]
            for k, v in enumerate((float("nan"), float("inf"), -float("inf"), -0.0)):
                flat[at[5 * k:5 * k + 5]] = v
        scores[:, :32] = scores[:1, :32]
    previous = torch.randint(-2, n + 2, (n,), generator=g)
    previous[::3] = -1
    tail_slots = torch.randint(-1, pages * 2 + 2, (n,), generator=g)
    if n >= 3:
        tail_slots[0], tail_slots[3 % n] = 2, 1  # a live tail row; page 0 (the null page)
    active = torch.rand(n, generator=g) < 0.8
    if int32:
        previous, tail_slots = previous.int(), tail_slots.int()
    weight = None if norm is None else (torch.rand(W, generator=g) * 2 - 0.5).to(norm)
    dest = None
    if out:  # a dense destination with a column stride
        dest = torch.full((W, n), 3.0).to(torch.float32 if norm is None else torch.bfloat16).t()
    return content, scores, previous, tail, tail_slots, active, dest, weight, 1e-6


def scatter_args(seed: int, n: int = 10, pages: int = 3, int32: bool = False) -> tuple:
    g = torch.Generator().manual_seed(seed)
    content = torch.randn(n, W, generator=g)
    scores = torch.randn(W, n, generator=g).t()  # column stride n
    tail = torch.full((pages, 2, 2, W), -7.5)
    slots = torch.randperm(pages * 2, generator=g)[:n]
    slots = torch.cat([slots, torch.full((max(n - slots.numel(), 0),), -1)])
    for i, v in ((1, -1), (4, pages * 2), (7, pages * 2 + 9)):  # skipped: negative, beyond the field
        if i < n:
            slots[i] = v
    return content, scores, tail, slots.int() if int32 else slots


POOLS = {
    "plain": dict(seed=1),
    "plain-out": dict(seed=2, out=True, int32=True),
    "specials": dict(seed=3, specials=True),
    "norm": dict(seed=4, norm=torch.float32),
    "norm-bf16-weight-out": dict(seed=5, norm=torch.bfloat16, out=True),
    "norm-specials": dict(seed=6, norm=torch.float32, specials=True),
    "empty": dict(seed=7, n=0),
}
SCATTERS = {"int64": dict(seed=1), "int32": dict(seed=2, int32=True), "empty": dict(seed=3, n=0)}


def _bad_calls() -> list[tuple[str, str, tuple, type, bool | None]]:
    """(case, name, args, the drop-in's error, whether the released code refuses too; None: an
    aliased ``out``, which the harness cannot pass on: it copies every argument)."""
    p = pool_args(0, n=4)
    s = scatter_args(0, n=4)
    wide = torch.zeros(2, 2, 2, W)
    token_major = torch.zeros(2, 3, 2, W).transpose(0, 1)  # dense, rows not contiguous
    bad = [
        ("scatter fp16 content", "compressor_tail_scatter", (s[0].half(), *s[1:]), TE, True),
        ("scatter tail width", "compressor_tail_scatter", (*s[:2], torch.zeros(3, 2, 2, 256), s[3]), LE, True),
        ("scatter 3-D tail", "compressor_tail_scatter", (*s[:2], torch.zeros(3, 2, 2 * W), s[3]), TE, True),
        ("scatter slots length", "compressor_tail_scatter", (*s[:3], s[3][:3]), IE, True),
        ("scatter slots float", "compressor_tail_scatter", (*s[:3], s[3].float()), TE, True),
        ("scatter token-major tail", "compressor_tail_scatter", (*s[:2], token_major, s[3]), LE, False),
        ("scatter repeated slots", "compressor_tail_scatter", (*s[:3], torch.tensor([1, 5, 1, -1])), IE, False),
        ("pool bf16 scores", "compressor_pool", (p[0], p[1].bfloat16(), *p[2:]), TE, True),
        ("pool previous float", "compressor_pool", (p[0], p[1], p[2].float(), *p[3:]), TE, True),
        ("pool active int", "compressor_pool", (*p[:5], p[5].int(), *p[6:]), TE, True),
        ("pool weight width", "compressor_pool", (*p[:7], torch.ones(256), 1e-6), IE, True),
        ("pool eps zero", "compressor_pool", (*p[:7], torch.ones(W), 0.0), IE, True),
        ("pool eps subnormal", "compressor_pool", (*p[:7], torch.ones(W), 1e-40), IE, False),
        ("pool out dtype", "compressor_pool", (*p[:6], torch.zeros(4, W, dtype=torch.bfloat16), None, 1e-6), TE, True),
        ("pool out shape", "compressor_pool", (*p[:6], torch.zeros(5, W), None, 1e-6), IE, True),
        ("pool out in content", "compressor_pool", (*p[:6], "content", None, 1e-6), IE, None),
        ("pool token-major tail", "compressor_pool", (*p[:3], token_major, *p[4:]), LE, False),
        ("pool out in the tail", "compressor_pool", (*p[:3], wide, p[4], p[5], "tail", None, 1e-6), IE, None),
    ]
    return bad


def _resolve_aliases(args: tuple) -> tuple:
    """``out`` given as "content" / "tail": that argument's own storage."""
    args = list(args)
    if args[6] == "content":
        args[6] = args[0]
    elif args[6] == "tail":
        args[6] = args[3].view(-1, W)[-args[0].shape[0]:]
    return tuple(args)


def _plan() -> list[tuple[tuple, tuple]]:
    plan = []
    for key, kw in POOLS.items():
        args = pool_args(**kw)
        plan.append((("pool", key), ("compressor_pool", args)))
        if args[7] is not None:  # the same call without the norm: the pooled values before it
            plan.append((("pool-raw", key), ("compressor_pool", (*args[:6], None, None, 1e-6))))
    for key, kw in SCATTERS.items():
        plan.append((("scatter", key), ("compressor_tail_scatter", scatter_args(**kw))))
    for case, name, args, _, _ in _bad_calls():
        plan.append((("bad", case), (name, _resolve_aliases(args) if name == "compressor_pool" else args)))
    return plan


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(key -> (call, the released call's record: ``rel.call_tokenspeed_dsv41``), the wheel's files)."""
    return rel.run_dsv41_plan(tmp_path_factory, _plan(), "dsv41-compressor")


def _drop_in(call):
    name, args = call
    args = tuple(rel.strided_copy(a) for a in args)
    return getattr(dc, name)(*args), args


@pytest.fixture
def kernels(monkeypatch):
    """The drop-ins' ``backend="auto"`` resolving to kvformats' Triton kernels on CPU tensors (the
    interpreter), with the GPU's check path."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter run is for CPU-only machines")
    from kvformats.codec import registry
    from kvformats.deepseek_v41 import _dispatch as D
    from kvformats.runtime import deferred

    registry._load_kernels()
    real = registry.resolve

    def resolve(fmt, op, backend, device):
        if fmt == D.KEY and backend == "auto":
            return registry._OPS[(fmt, op)]["triton"]
        return real(fmt, op, backend, device)

    monkeypatch.setattr(registry, "resolve", resolve)
    monkeypatch.setattr(deferred, "HOST_CHECKED", set())


# ----- signatures ---------------------------------------------------------------------------------
_KINDS = {"posonlyargs": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
          "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}


def _source(annotation) -> object:
    return inspect.Parameter.empty if annotation is None else ast.unparse(annotation)


def _released_api(root: Path) -> tuple[list[str], dict[str, list[tuple]]]:
    """``__all__`` and, per function of NAMES, (name, kind, default, annotation) of each parameter
    and then its return annotation, read with ast from the released dsv41/__init__.py."""
    tree = ast.parse((root / rel.TOKENSPEED_DSV41_API).read_text())
    names: list[str] = []
    sigs: dict[str, list[tuple]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name in NAMES:
            a = node.args
            positional = a.posonlyargs + a.args
            defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
                ast.literal_eval(d) for d in a.defaults]
            params = [(p.arg, _KINDS[k], defaults[positional.index(p)], _source(p.annotation))
                      for k in ("posonlyargs", "args") for p in getattr(a, k)]
            params += [(p.arg, _KINDS["kwonlyargs"], inspect.Parameter.empty if d is None else ast.literal_eval(d),
                        _source(p.annotation)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
            assert a.vararg is None and a.kwarg is None
            sigs[node.name] = [*params, _source(node.returns)]
    return names, sigs


def test_signatures_are_the_released_ones(released):
    _, root = released
    names, sigs = _released_api(root)
    assert set(sigs) == set(NAMES)
    assert dc.__all__ == [n for n in names if n in NAMES]
    for name in NAMES:
        sig = inspect.signature(getattr(dc, name))
        got = [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]
        assert [*got, sig.return_annotation] == sigs[name], name


# ----- compressor_tail_scatter ----------------------------------------------------------------------
@pytest.mark.parametrize("key", sorted(SCATTERS))
def test_tail_scatter_writes_the_released_bytes(released, key):
    runs, _ = released
    call, rec = runs[("scatter", key)]
    assert "error" not in rec, rec["error"]
    result, args = _drop_in(call)
    assert result is None and rec["result"] is None
    assert torch.equal(args[2].view(torch.int32), rec["args"][2].view(torch.int32))
    if key != "empty":
        assert int((args[2] != -7.5).any(-1).any(-1).sum()) > 0


def test_tail_scatter_kernel_writes_the_released_bytes(released, kernels):
    runs, _ = released
    for key in SCATTERS:
        call, rec = runs[("scatter", key)]
        _, args = _drop_in(call)
        assert torch.equal(args[2].view(torch.int32), rec["args"][2].view(torch.int32)), key


def test_tail_scatter_in_an_arena():
    """A tail carved from an arena (pages padded) is written in place, nothing around it."""
    content, scores, tail, slots = scatter_args(5, n=6, pages=3)
    arena = torch.full((3 * (2 * 2 * W + 40),), 9.0)
    field = arena.as_strided((3, 2, 2, W), (2 * 2 * W + 40, 2 * W, W, 1))
    field.copy_(tail)
    dc.compressor_tail_scatter(content, scores, field, slots)
    dc.compressor_tail_scatter(content, scores, tail, slots)
    assert torch.equal(field, tail)
    assert int((arena == 9.0).sum()) == 3 * 40


# ----- compressor_pool ---------------------------------------------------------------------------------
def _bits(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy().view(np.uint32)


def _same(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    a, b = a.float().numpy(), b.float().numpy()
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def _predecessors(args) -> tuple[np.ndarray, np.ndarray]:
    """(c0, s0) float32 [T, 512] of each active row, by the released rule; zeros elsewhere."""
    content, scores, previous, tail, tail_slots, active = (a.numpy() for a in args[:6])
    n = content.shape[0]
    c0, s0 = np.zeros_like(content), np.zeros_like(scores)
    for t in range(n):
        p, s = int(previous[t]), int(tail_slots[t])
        if not active[t]:
            continue
        if 0 <= p < n:
            c0[t], s0[t] = content[p], scores[p]
        elif p < 0 and 2 <= s < tail.shape[0] * 2:
            c0[t], s0[t] = tail[s // 2, s % 2, 0], tail[s // 2, s % 2, 1]
    return c0, s0


def _exps_agree(args) -> tuple[np.ndarray, np.ndarray]:
    """(bool [T, 512]: numpy's and torch's exp agree on both exponentials, float64 [T, 512]:
    |c0 * w0| + |c1 * w1|)."""
    c0, s0 = _predecessors(args)
    c1, s1 = args[0].numpy(), args[1].numpy()
    with np.errstate(all="ignore"):
        m = np.fmax(s0, s1)
        ok = np.ones(c1.shape, bool)
        for d in (s0 - m, s1 - m):
            ok &= (np.exp(d).view(np.uint32) == torch.exp(torch.from_numpy(d)).numpy().view(np.uint32))
        e0, e1 = np.exp((s0 - m).astype(np.float64)), np.exp((s1 - m).astype(np.float64))
        scale = np.abs(c0 * (e0 / (e0 + e1))) + np.abs(c1 * (e1 / (e0 + e1)))
    return ok, scale


def _check_result(got, args, rec):
    want = rec["result"]
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    if args[6] is None:
        assert got.stride() == want.stride()
    else:
        assert got is args[6] and rec["out_returned"]


@pytest.mark.parametrize("key", sorted(POOLS))
def test_pool_kernel_gives_the_released_values(released, kernels, key):
    runs, _ = released
    call, rec = runs[("pool", key)]
    assert "error" not in rec, rec["error"]
    got, args = _drop_in(call)
    _check_result(got, args, rec)
    same = _same(got, rec["result"])
    if args[7] is None:
        assert same.all(), f"{int((~same).sum())} values differ"
        return
    raw = runs[("pool-raw", key)][1]["result"].numpy()  # the released pooled values
    x = raw.view(np.uint32).astype(np.uint64)
    x = np.where(np.isnan(raw), np.float32(np.nan),
                 ((((x + 0x7FFF + ((x >> 16) & 1)) >> 16) << 16) & 0xFFFFFFFF).astype(np.uint32).view(np.float32))
    with np.errstate(all="ignore"):
        sq = x * x
        theirs = np.sum(sq, axis=1, dtype=np.float32)  # the interpreter's tl.sum
        while sq.shape[1] > 1:
            sq = sq[:, 0::2] + sq[:, 1::2]
    ours = sq[:, 0]
    rows_same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
    assert same[rows_same].all()
    codes = np.abs(got.view(torch.int16).numpy().astype(np.int32) - rec["result"].view(torch.int16).numpy())
    assert (same | (codes <= 1)).all()
    print(f"[{key}] {int((~rows_same).sum())} of {len(ours)} rows sum their squares to other float32 values; "
          f"{int((~same).sum())} bf16 values one code apart")


@pytest.mark.parametrize("key", sorted(k for k in POOLS if POOLS[k].get("norm") is None))
def test_pool_reference_gives_the_released_values_where_the_exps_agree(released, key):
    """On CPU the drop-in runs the torch reference (torch's exp): the released float32 bits
    wherever numpy's exp and torch's agree, within the documented bound elsewhere."""
    runs, _ = released
    call, rec = runs[("pool", key)]
    got, args = _drop_in(call)
    _check_result(got, args, rec)
    want = rec["result"]
    same = _same(got, want)
    agree, scale = _exps_agree(args)
    assert same[agree].all()
    g, w = got.double().numpy(), want.double().numpy()
    with np.errstate(all="ignore"):
        ulp = np.spacing(np.maximum(scale, np.finfo(np.float32).tiny).astype(np.float32)).astype(np.float64)
        near = np.isfinite(g) & np.isfinite(w) & (np.abs(g - w) <= ULPS * ulp)
    assert (same | near).all()


def test_pool_norm_on_the_reference_is_near_the_released_values(released):
    runs, _ = released
    for key in (k for k in POOLS if POOLS[k].get("norm") is not None):
        call, rec = runs[("pool", key)]
        got, args = _drop_in(call)
        _check_result(got, args, rec)
        codes = np.abs(got.view(torch.int16).numpy().astype(np.int32) - rec["result"].view(torch.int16).numpy())
        assert (_same(got, rec["result"]) | (codes <= 1)).all(), key


# ----- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case,name,args,err,both", _bad_calls(), ids=[b[0] for b in _bad_calls()])
def test_bad_input(released, case, name, args, err, both):
    runs, _ = released
    call, rec = runs[("bad", case)]
    if both:
        assert rec.get("error") and rec["error"][0] == "ValueError", rec.get("error")
    elif both is False:
        assert "error" not in rec, rec["error"]
    _, args = call
    copies = tuple(rel.strided_copy(a) for a in args)
    if name == "compressor_pool" and isinstance(args[6], torch.Tensor):  # keep an aliased out aliased
        for i in (0, 3):
            if args[6].untyped_storage().data_ptr() == args[i].untyped_storage().data_ptr():
                copies = list(copies)
                copies[6] = copies[i].view(-1, W)[-args[0].shape[0]:] if i == 3 else copies[i]
                copies = tuple(copies)
    before = tuple(rel.strided_copy(a) for a in copies)
    with pytest.raises(err):
        getattr(dc, name)(*copies)
    for a, b in zip(copies, before):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) or (a.is_floating_point() and bool((a.isnan() == b.isnan()).all())
                                         and torch.equal(a.nan_to_num(), b.nan_to_num()))
