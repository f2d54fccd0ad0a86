"""kvformats.deepseek_v41.compressor_tail_scatter / compressor_pool: the reference against an
independent restatement (numpy float32, written here from the documented rules, sharing no code
with kvformats), on fixed cases and hypothesis-drawn ones; the tail as compressor_state_v41's
cache; typed errors with nothing written; repeated slots as spec/checks.md says; and the Triton
kernels (under the interpreter on CPU, through the ``routed`` fixture) against both.

Exactness: the restatement takes the exponential as an argument. With torch's (what the
reference calls on CPU) it equals the reference bit for bit; with numpy's (what the Triton
interpreter calls) it equals the kernel bit for bit. The kernel and the reference, which differ
only in that exponential here, are equal wherever the two exponentials agree and within the
documented bound elsewhere. NaN compares equal to NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvformats as kvf
from kvformats import deepseek_v41 as dsv41
from kvformats.deepseek_v41 import compressor as cp

W = 512
CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")  # where the kernel tests run (CPU: the interpreter)
IE, TE, LE = kvf.InputError, kvf.InputTypeError, kvf.LayoutError


# ----- the restatement (numpy float32) ----------------------------------------------------------
def np_exp(a: np.ndarray) -> np.ndarray:
    return np.exp(a.astype(np.float32))


def torch_exp(a: np.ndarray) -> np.ndarray:
    return torch.exp(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))).numpy()


def bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 -> the float32 value of its bfloat16 rounding (to nearest, ties to even)."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    r = (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16) & 0xFFFFFFFF
    return np.where(np.isnan(x), np.float32(np.nan), r.astype(np.uint32).view(np.float32))


def f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float32)


def tail_rows(tail: torch.Tensor) -> np.ndarray:
    """The tail as float32 ``[pages, P, 2, 512]``, from either form."""
    return f32(tail).reshape(tail.shape[0], tail.shape[1], 2, W)


def restate_scatter(content, scores, tail, slots) -> np.ndarray:
    t4 = tail_rows(tail).copy()
    p = t4.shape[1]
    for t, s in enumerate(slots.tolist()):
        if 0 <= s < t4.shape[0] * p:
            t4[s // p, s % p, 0] = f32(content[t])
            t4[s // p, s % p, 1] = f32(scores[t])
    return t4


def pair_terms(t, content, scores, t4, previous, tail_slots):
    """(c0, s0, c1, s1): row t's predecessor and row t (float32 [512] each), of an active row."""
    n, p = len(previous), t4.shape[1]
    prev, slot = int(previous[t]), int(tail_slots[t])
    if 0 <= prev < n:
        c0, s0 = content[prev], scores[prev]
    elif prev < 0 and p <= slot < t4.shape[0] * p:
        c0, s0 = t4[slot // p, slot % p, 0], t4[slot // p, slot % p, 1]
    else:
        c0 = s0 = np.zeros(W, np.float32)
    return c0, s0, content[t], scores[t]


def pair_softmax(t, content, scores, t4, previous, tail_slots, exp) -> np.ndarray:
    """Row t's pooled channels (float32 [512]) of an active row."""
    c0, s0, c1, s1 = pair_terms(t, content, scores, t4, previous, tail_slots)
    m = np.fmax(s0, s1)
    e0, e1 = exp(s0 - m), exp(s1 - m)
    d = e0 + e1
    return c0 * (e0 / d) + c1 * (e1 / d)


def restate_pool(content, scores, tail, previous, tail_slots, active, weight, eps, exp) -> np.ndarray:
    """float32 [N, 512]: what compressor_pool returns (its bf16 output as float32 values)."""
    c, s, t4 = f32(content), f32(scores), tail_rows(tail)
    prev, slots, act = previous.tolist(), tail_slots.tolist(), active.tolist()
    with np.errstate(all="ignore"):
        pooled = np.stack([pair_softmax(t, c, s, t4, prev, slots, exp) if act[t] else np.zeros(W, np.float32)
                           for t in range(len(act))]) if act else np.zeros((0, W), np.float32)
        if weight is None:
            return pooled
        w = f32(weight)
        rows = []
        for x in bf16_values(pooled):
            sq = x * x
            while sq.shape[0] > 1:
                sq = sq[0::2] + sq[1::2]
            r = np.float32(1) / np.sqrt(sq[0] * np.float32(1 / 512) + np.float32(eps))
            rows.append(bf16_values((x * r) * w))
        return np.stack(rows) if rows else np.zeros((0, W), np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def exps_agree(case: dict) -> tuple[np.ndarray, np.ndarray]:
    """(bool [N, 512]: where numpy's and torch's exp give the same exponentials of both scores,
    float64 [N, 512]: |c0 * w0| + |c1 * w1|, the scale of the documented bound)."""
    c, s, t4 = f32(case["content"]), f32(case["scores"]), tail_rows(case["tail"])
    prev, slots, act = case["previous"].tolist(), case["tail_slots"].tolist(), case["active"].tolist()
    ok = np.ones((len(act), W), bool)
    scale = np.zeros((len(act), W))
    with np.errstate(all="ignore"):
        for t in range(len(act)):
            if act[t]:
                c0, s0, c1, s1 = pair_terms(t, c, s, t4, prev, slots)
                m = np.fmax(s0, s1)
                for arg in (s0 - m, s1 - m):
                    ok[t] &= same_bits(np_exp(arg), torch_exp(arg))
                e0, e1 = np.exp((s0 - m).astype(np.float64)), np.exp((s1 - m).astype(np.float64))
                scale[t] = np.abs(c0 * (e0 / (e0 + e1))) + np.abs(c1 * (e1 / (e0 + e1)))
    return ok, scale


# ----- cases ------------------------------------------------------------------------------------
def make_case(seed: int, n: int = 12, pages: int = 5, page_size: int = 2, *, norm: bool = False,
              specials: bool = False, dtype=torch.float32, weight_dtype=torch.float32, form: int = 4,
              strided: bool = False) -> dict:
    """Arguments of one compressor_pool call (every kind of predecessor among the rows)."""
    g = torch.Generator().manual_seed(seed)
    content = torch.randn(n, W, generator=g) * 4
    scores = torch.randn(n, W, generator=g) * 3
    tail = torch.randn(pages, page_size, 2, W, generator=g) * 2
    tail[..., 1, :] *= 3
    if specials:
        for x in (content, scores):
            flat = x.view(-1)
            at = torch.randperm(flat.numel(), generator=g)[:24]
            flat[at[:6]] = float("nan")
            flat[at[6:12]] = float("inf")
            flat[at[12:18]] = -float("inf")
            flat[at[18:]] = -0.0
        scores[:, :64] = scores[:1, :64]  # equal scores: weights exactly 1/2
        tail.view(-1)[torch.randperm(tail.numel(), generator=g)[:8]] = float("nan")
    capacity = pages * page_size
    previous = torch.randint(-3, n + 2, (n,), generator=g)
    previous[::3] = -1
    tail_slots = torch.randint(-2, capacity + 2, (n,), generator=g)
    if n > 2:
        tail_slots[0], tail_slots[1] = page_size, 0  # a live tail row; the null page
    active = torch.rand(n, generator=g) < 0.8
    if strided:  # [N, 512] views with a column stride: columns of a transposed buffer
        content = content.t().contiguous().t()
        scores = torch.cat([scores, scores], dim=1)[:, ::2].clone().t().contiguous().t()
    content, scores = content.to(dtype), scores.to(dtype)
    if form == 3:
        tail = tail.reshape(pages, page_size, 2 * W)
    weight = (torch.rand(W, generator=g) * 2 - 0.5).to(weight_dtype) if norm else None
    return dict(content=content, scores=scores, tail=tail, previous=previous.to(torch.int32 if seed % 2 else
                                                                                     torch.int64),
                tail_slots=tail_slots, active=active, norm_weight=weight, norm_eps=1e-6 if norm else None)


def on_dev(case: dict) -> dict:
    return {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def run_pool(case: dict, **kw) -> torch.Tensor:
    a = dict(case)
    return dsv41.compressor.compressor_pool(a.pop("content"), a.pop("scores"), a.pop("tail"), **a, **kw)


def restated(case: dict, exp) -> np.ndarray:
    return restate_pool(case["content"], case["scores"], case["tail"], case["previous"], case["tail_slots"],
                        case["active"], case["norm_weight"], case["norm_eps"] or 0.0, exp)


CASES = {
    "plain": dict(seed=1),
    "norm": dict(seed=2, norm=True),
    "norm-bf16-weight": dict(seed=3, norm=True, weight_dtype=torch.bfloat16),
    "specials": dict(seed=4, specials=True),
    "specials-norm": dict(seed=5, specials=True, norm=True),
    "bf16-inputs": dict(seed=6, dtype=torch.bfloat16, norm=True),
    "fp16-strided-3d": dict(seed=7, dtype=torch.float16, strided=True, form=3),
    "pages-of-8": dict(seed=8, page_size=8, pages=3),
    "one-row-pages": dict(seed=9, page_size=1, pages=6, norm=True),
    "no-pages": dict(seed=10, pages=0),
}


# ----- reference against the restatement ------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_pool_reference_equals_restatement(name):
    case = make_case(**CASES[name])
    got = f32(run_pool(case, backend="reference"))
    want = restated(case, torch_exp)
    assert got.shape == want.shape
    assert same_bits(got, want).all(), f"{int((~same_bits(got, want)).sum())} values differ"
    assert (got[~case["active"].numpy()] == 0).all()


def test_pool_output_dtypes_and_out():
    case = make_case(11, norm=False)
    got = run_pool(case)
    assert got.dtype == torch.float32 and got.shape == (12, W) and got.is_contiguous()
    out = torch.full((W, 12), 7.0).t()  # a column-major destination
    assert run_pool(case, out=out) is out
    assert torch.equal(out, got)
    norm = make_case(11, norm=True)
    assert run_pool(norm).dtype == torch.bfloat16
    empty = make_case(12, n=0)
    assert run_pool(empty).shape == (0, W)


@st.composite
def pool_cases(draw):
    n = draw(st.integers(0, 7))
    page_size = draw(st.sampled_from([1, 2, 8]))
    pages = draw(st.integers(0, 4))
    capacity = pages * page_size
    case = make_case(draw(st.integers(0, 2**16)), n=n, pages=pages, page_size=page_size,
                     norm=draw(st.booleans()), specials=draw(st.booleans()),
                     dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
                     weight_dtype=draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])),
                     form=draw(st.sampled_from([3, 4])), strided=draw(st.booleans()))
    case["previous"] = torch.tensor(draw(st.lists(st.integers(-3, n + 1), min_size=n, max_size=n)),
                                    dtype=torch.int64).reshape(n)
    case["tail_slots"] = torch.tensor(draw(st.lists(st.integers(-2, capacity + 1), min_size=n, max_size=n)),
                                      dtype=draw(st.sampled_from([torch.int32, torch.int64]))).reshape(n)
    case["active"] = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(n)
    return case


@settings(max_examples=40)
@given(pool_cases())
def test_pool_reference_fuzz(case):
    got = f32(run_pool(case, backend="reference"))
    assert same_bits(got, restated(case, torch_exp)).all()


@st.composite
def scatter_cases(draw):
    n = draw(st.integers(0, 8))
    page_size = draw(st.sampled_from([1, 2, 4]))
    pages = draw(st.integers(0, 4))
    capacity = pages * page_size
    live = draw(st.lists(st.integers(0, max(capacity - 1, 0)), unique=True, max_size=min(n, capacity)))
    dead = draw(st.lists(st.sampled_from([-1, -7, capacity, capacity + 5]), min_size=n - len(live),
                         max_size=n - len(live)))
    order = draw(st.permutations(live + dead))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    content = (torch.randn(n, W, generator=g) * 3).to(dtype)
    scores = torch.randn(W, n, generator=g).to(dtype).t()  # column stride n
    pad = draw(st.sampled_from([0, 7]))
    arena = torch.randn(pages * (page_size * 2 * W + pad) + 1, generator=g)
    tail = arena[1:].as_strided((pages, page_size, 2, W), (page_size * 2 * W + pad, 2 * W, W, 1))
    if draw(st.booleans()):
        tail = tail.as_strided((pages, page_size, 2 * W), (tail.stride(0), 2 * W, 1))
    slots = torch.tensor(order, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    return content, scores, tail, slots, arena


@settings(max_examples=40)
@given(scatter_cases())
def test_tail_scatter_reference_fuzz(case):
    content, scores, tail, slots, arena = case
    before = arena.clone()
    want = restate_scatter(content, scores, tail, slots)
    dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=slots, backend="reference")
    assert same_bits(tail_rows(tail), want).all()
    outside = torch.ones_like(arena, dtype=torch.bool)
    if tail.numel():
        outside[1:].as_strided(tail.shape, tail.stride()).fill_(False)
    assert torch.equal(arena[outside], before[outside])  # no byte outside the tail rows


def test_tail_is_compressor_state_v41():
    """The field tokenspeed's tail scatter fills is compressor_state_v41's cache (head_dim 512,
    pages of 2): the layout's decode reads back what the op stored, and the layout's encode
    writes the same bytes the op does."""
    g = torch.Generator().manual_seed(0)
    content, scores = torch.randn(5, W, generator=g), torch.randn(5, W, generator=g)
    slots = torch.tensor([3, 0, -1, 7, 4])
    tail = torch.zeros(4, 2, 2, W)
    dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=slots)
    layout = kvf.CompressorStateV41(head_dim=W, page_size=2)
    assert cp.tail_layout(2) == layout
    kv, sc = layout.decode(tail.view(4, 2, 2 * W), slots)
    live = slots >= 0
    assert torch.equal(kv[live], content[live]) and torch.equal(sc[live], scores[live])
    assert bool((kv[~live] == 0).all())
    other = torch.zeros(4, 2, 2 * W)
    layout.encode((content, scores), other, slots)
    assert torch.equal(other.view(4, 2, 2, W), tail)


def test_tail_scatter_stores_the_bits(routed):
    """NaN payloads, -0.0, Inf and subnormals are stored as given, by either backend."""
    content = torch.tensor([0x7FA00001, 0x80000000, 0x7F800000, 0x00000003], dtype=torch.int64).to(torch.int32)
    content = content.repeat(2, W // 4).view(torch.float32)
    scores = content.flip(1).clone()
    for backend in ("reference", "triton"):
        tail = torch.zeros(2, 2, 2, W, device=DEV)
        dsv41.compressor.compressor_tail_scatter(content.to(DEV), scores.to(DEV), tail, slots=torch.tensor(
            [3, 0], device=DEV), backend=backend)
        rows = tail.cpu().view(4, 2, W)
        assert torch.equal(rows[3, 0].view(torch.int32), content[0].view(torch.int32)), backend
        assert torch.equal(rows[0, 1].view(torch.int32), scores[1].view(torch.int32)), backend


# ----- repeated slots, check modes ---------------------------------------------------------------
def test_repeated_slots_raise_on_the_host_and_store_one_row_on_the_device_path(device_mode):
    content, scores = torch.randn(3, W), torch.randn(3, W)
    tail = torch.zeros(2, 2, 2, W)
    slots = torch.tensor([1, 1, 2])
    with pytest.raises(IE, match="repeat"):
        dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=slots, check="strict")
    assert bool((tail == 0).all())
    dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=slots)  # device path: not looked for
    row = tail[0, 1, 0]
    assert torch.equal(row, content[0]) or torch.equal(row, content[1])
    assert kvf.pending_error("cpu") is None  # nothing recorded: repeats are not a device check


def test_repeated_slots_on_cpu_and_out_of_capacity_slots():
    content, scores = torch.randn(4, W), torch.randn(4, W)
    tail = torch.zeros(2, 2, 2, W)
    with pytest.raises(IE, match="repeat"):
        dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=torch.tensor([3, -1, 3, 0]))
    assert bool((tail == 0).all())
    # a dead slot named twice is no repeat; slots beyond the capacity are skipped, not errors
    dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=torch.tensor([4, 4, -1, -1]))
    assert bool((tail == 0).all())
    dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=torch.tensor([4, 1, -1, 2]),
                                             check=False)
    assert torch.equal(tail[0, 1, 1], scores[1]) and torch.equal(tail[1, 0, 0], content[3])
    for check in (True, False, "strict"):
        run_pool(make_case(0, n=3), check=check)


# ----- typed errors, nothing written --------------------------------------------------------------
def _scatter_kw(**over):
    kw = dict(content=torch.randn(3, W), scores=torch.randn(3, W), tail=torch.zeros(2, 2, 2, W),
              slots=torch.tensor([0, 1, 2]))
    kw.update(over)
    return kw


def _pool_kw(**over):
    kw = dict(content=torch.randn(3, W), scores=torch.randn(3, W), tail=torch.zeros(2, 2, 2, W),
              previous=torch.tensor([-1, 0, -1]), tail_slots=torch.tensor([2, -1, 3]),
              active=torch.tensor([True, True, False]), norm_weight=None, norm_eps=None,
              out=torch.full((3, W), 5.0))
    kw.update(over)
    return kw


BASE_TAIL = torch.zeros(2, 2, 2, W)
SCATTER_BAD = [
    ("content list", dict(content=[[0.0] * W] * 3), TE),
    ("content int", dict(content=torch.zeros(3, W, dtype=torch.int32)), TE),
    ("content width", dict(content=torch.randn(3, 256)), IE),
    ("scores rows", dict(scores=torch.randn(2, W)), IE),
    ("slots float", dict(slots=torch.tensor([0.0, 1.0, 2.0])), TE),
    ("slots length", dict(slots=torch.tensor([0, 1])), IE),
    ("slots 2-D", dict(slots=torch.tensor([[0, 1, 2]])), IE),
    ("tail fp16", dict(tail=torch.zeros(2, 2, 2, W, dtype=torch.float16)), TE),
    ("tail 2-D", dict(tail=torch.zeros(4, 2 * W)), TE),
    ("tail width", dict(tail=torch.zeros(2, 2, 2, 256)), LE),
    ("tail 3-D width", dict(tail=torch.zeros(2, 2, W)), LE),
    ("tail split rows", dict(tail=torch.zeros(2, 2, W, 2).transpose(2, 3)), LE),
    ("tail token-major", dict(tail=torch.zeros(2, 2, 2, W).transpose(0, 1)), LE),
    ("tail overlapping pages", dict(tail=torch.zeros(3 * 2 * W).as_strided((2, 2, 2, W), (2 * W, 2 * W, W, 1))),
     LE),
    ("check", dict(check="yes"), TE),
    ("backend", dict(backend="cuda"), IE),
]
POOL_BAD = [
    ("content bf16 shape", dict(content=torch.randn(3, W + 1)), IE),
    ("scores dtype", dict(scores=torch.zeros(3, W, dtype=torch.float64)), TE),
    ("previous float", dict(previous=torch.tensor([-1.0, 0.0, -1.0])), TE),
    ("previous length", dict(previous=torch.tensor([-1, 0])), IE),
    ("tail_slots dtype", dict(tail_slots=torch.tensor([2, -1, 3], dtype=torch.int16)), TE),
    ("active int", dict(active=torch.tensor([1, 1, 0])), TE),
    ("active length", dict(active=torch.tensor([True, True])), IE),
    ("weight width", dict(norm_weight=torch.ones(256), norm_eps=1e-6), IE),
    ("weight int", dict(norm_weight=torch.ones(W, dtype=torch.int32), norm_eps=1e-6), TE),
    ("eps missing", dict(norm_weight=torch.ones(W), norm_eps=None), TE),
    ("eps zero", dict(norm_weight=torch.ones(W), norm_eps=0.0), IE),
    ("eps negative", dict(norm_weight=torch.ones(W), norm_eps=-1e-6), IE),
    ("eps nan", dict(norm_weight=torch.ones(W), norm_eps=float("nan")), IE),
    ("eps below float32", dict(norm_weight=torch.ones(W), norm_eps=1e-50), IE),
    ("eps subnormal", dict(norm_weight=torch.ones(W), norm_eps=1e-40), IE),
    ("eps huge", dict(norm_weight=torch.ones(W), norm_eps=1e40), IE),
    ("eps string", dict(norm_eps="1e-6"), TE),
    ("out bf16 without norm", dict(out=torch.zeros(3, W, dtype=torch.bfloat16)), TE),
    ("out fp32 with norm", dict(norm_weight=torch.ones(W), norm_eps=1e-6), TE),
    ("out shape", dict(out=torch.zeros(4, W)), IE),
    ("out expanded", dict(out=torch.zeros(1, W).expand(3, W)), IE),
    ("out is content", "alias-content", IE),
    ("out in the tail", "alias-tail", IE),
    ("tail dtype", dict(tail=torch.zeros(2, 2, 2, W, dtype=torch.bfloat16)), TE),
    ("tail shape", dict(tail=torch.zeros(2, 2, 3, W)), LE),
    ("check", dict(check=1), TE),
]


@pytest.mark.parametrize("name,over,err", SCATTER_BAD, ids=[b[0] for b in SCATTER_BAD])
def test_tail_scatter_bad_input(name, over, err):
    kw = _scatter_kw(**over)
    tail = kw.pop("tail")
    before = tail.clone()
    with pytest.raises(err):
        dsv41.compressor.compressor_tail_scatter(kw.pop("content"), kw.pop("scores"), tail, **kw)
    assert torch.equal(tail, before)


def test_tail_scatter_refuses_inputs_inside_the_tail():
    tail = torch.randn(3, 2, 2, W)
    before = tail.clone()
    for content, scores in ((tail[2, :, 0], torch.ones(2, W)), (torch.ones(2, W), tail.view(-1, W)[1:3])):
        with pytest.raises(IE, match="overlaps"):
            dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=torch.tensor([0, 1]))
    assert torch.equal(tail, before)


@pytest.mark.parametrize("name,over,err", POOL_BAD, ids=[b[0] for b in POOL_BAD])
def test_pool_bad_input(name, over, err):
    if over == "alias-content":
        kw = _pool_kw()
        kw["out"] = kw["content"]
    elif over == "alias-tail":
        tail = torch.zeros(2, 2, 2, W)
        kw = _pool_kw(tail=tail, out=tail.view(8, W)[5:])
    else:
        kw = _pool_kw(**over)
    tail, out = kw["tail"], kw["out"]
    before_tail, before_out = tail.clone(), out.clone()
    content_before = kw["content"].clone() if isinstance(kw["content"], torch.Tensor) else None
    with pytest.raises(err):
        run_pool(kw)
    assert torch.equal(tail, before_tail) and torch.equal(out, before_out)
    if content_before is not None:
        assert torch.equal(kw["content"], content_before)


def test_errors_are_value_or_type_errors():
    """Every typed error is also a builtin ValueError (InputTypeError: and a TypeError)."""
    assert issubclass(IE, ValueError) and issubclass(LE, ValueError) and issubclass(TE, TypeError)


# ----- Triton under the interpreter --------------------------------------------------------------
KERNEL_CASES = ["plain", "norm", "norm-bf16-weight", "specials", "specials-norm", "bf16-inputs",
                "fp16-strided-3d", "pages-of-8", "no-pages"]
# docs/reference/deepseek_v41.md: where two exps differ, |a - b| <= ULPS * ulp(|c0 * w0| + |c1 * w1|)
# per channel (torch's CPU exp against numpy's, measured here: 4; torch's CPU exp against the GPU's)
ULPS = 8


def _ulp(x: np.ndarray) -> np.ndarray:
    x = np.abs(x.astype(np.float32))
    return np.spacing(np.maximum(x, np.finfo(np.float32).tiny).astype(np.float32)).astype(np.float64)


@pytest.mark.parametrize("name", KERNEL_CASES)
def test_pool_kernel_matches(name, routed):
    """On a GPU: the kernel equals the reference run on the same device, bit for bit. Under the
    interpreter: the kernel equals the restatement with numpy's exp bit for bit, and the reference
    bit for bit wherever numpy's and torch's exp agree (on every channel of a normed row),
    elsewhere within ULPS ulps of |c0 * w0| + |c1 * w1| (a normed row: one bf16 code)."""
    case = on_dev(make_case(**CASES[name]))
    got = f32(run_pool(case, backend="triton"))
    ref = f32(run_pool(case, backend="reference"))
    if CUDA:
        assert same_bits(got, ref).all()
        return
    assert same_bits(got, restated(case, np_exp)).all()
    agree, scale = exps_agree(case)
    if case["norm_weight"] is not None:
        agree = np.broadcast_to(agree.all(1, keepdims=True), agree.shape)
    same = same_bits(got, ref)
    assert same[agree].all()
    if case["norm_weight"] is None:
        with np.errstate(all="ignore"):
            near = np.abs(got.astype(np.float64) - ref) <= ULPS * _ulp(scale)
        assert (same | (np.isfinite(got) & np.isfinite(ref) & near)).all()
    else:
        diff = np.abs(got.view(np.int32) - ref.view(np.int32)) >> 16
        assert (same | (diff <= 1)).all()


def test_pool_kernel_with_shared_exp(routed):
    """Rows built so that every exponential is exp(0) = 1 or exp of one shared difference
    computed alike (equal scores): the kernel and the reference are bit-equal everywhere, norm
    included, on any device."""
    case = make_case(21, norm=True)
    case["scores"] = case["scores"][:1].expand(12, W).clone()
    case["tail"][..., 1, :] = case["scores"][0]
    case = on_dev(case)
    got, ref = run_pool(case, backend="triton"), run_pool(case, backend="reference")
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("block_m", [2, 4])
def test_pool_kernel_row_tiles(routed, launch_settings, block_m):
    """Several rows a program (a launch setting; the last tile partly outside): the same bits."""
    for kind, name in (("pool", "specials"), ("norm", "specials-norm")):
        launch_settings("dsv41_compressor", kind, {"block_m": block_m, "num_warps": 4, "hw_cvt": 1})
        case = on_dev(make_case(**{**CASES[name], "n": 11}))
        got = f32(run_pool(case, backend="triton"))
        want = f32(run_pool(case, backend="reference")) if CUDA else restated(case, np_exp)
        assert same_bits(got, want).all(), (kind, block_m)


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pool_cases())
def test_pool_kernel_fuzz(routed, case):
    case = on_dev(case)
    got = f32(run_pool(case, backend="triton"))
    want = f32(run_pool(case, backend="reference")) if CUDA else restated(case, np_exp)
    assert same_bits(got, want).all()


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scatter_cases())
def test_tail_scatter_kernel_fuzz(routed, case):
    content, scores, tail, slots, arena = case
    arena = arena.to(DEV)
    tail = arena[1:].as_strided(tail.shape, tail.stride())
    content, scores, slots = content.to(DEV), scores.to(DEV), slots.to(DEV)
    want_arena = arena.clone()
    want_tail = want_arena[1:].as_strided(tail.shape, tail.stride())
    dsv41.compressor.compressor_tail_scatter(content, scores, want_tail, slots=slots, backend="reference")
    dsv41.compressor.compressor_tail_scatter(content, scores, tail, slots=slots, backend="triton")
    assert torch.equal(arena.view(torch.int32), want_arena.view(torch.int32))


def test_kernels_are_registered():
    from kvformats_kernels.dsv41 import compressor as K

    assert set(K.LAUNCHERS) == {"compressor_pool", "compressor_tail_scatter"}
    assert {"compressor_pool", "compressor_tail_scatter"} <= set(dsv41.MODEL_OPS)
