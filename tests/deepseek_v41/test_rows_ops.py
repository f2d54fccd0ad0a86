"""kvformats.deepseek_v41.swa_rope_scatter and index_q_quantize (docs/reference/deepseek_v41.md).

* the reference against a restatement of the rules written here in numpy float32 with ml_dtypes'
  casts as the rounding oracles (bf16, float8_e4m3fn and float4_e2m1fn round to nearest even),
  sharing no code with kvformats' encoders: the rotation, tokenspeed's scale formulas (``amax *
  fl32(1/448)``, ``amax * fl32(1/6)``) and the records' byte positions as the formats specify them;
  hypothesis draws the token count, page geometry, slots (negative, page 0, beyond the cache),
  positions, cos/sin tables (real and random), input magnitudes and strides;
* the Triton kernels under the interpreter (``routed``: backend="triton" on CPU tensors, device
  check path) against the reference, byte for byte, NaN and Inf inputs and invalid positions
  included;
* typed errors, with nothing written.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvformats as kvf
from kvformats.codec.rows import read_rows
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.deepseek_v41 import _dispatch as D
from kvformats.deepseek_v41 import rows as R
from kvformats.errors import BackendUnavailableError, InputError, InputTypeError, LayoutError
from kvformats.runtime import deferred

F32 = np.float32
BF16, E4M3, E2M1 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn
SENTINEL = 0xA5
CPU = torch.device("cpu")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the kernels' device (routed: the interpreter)
FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
KERNEL_FUZZ = settings(FUZZ, max_examples=30)


# ----- the oracle: the rules restated ------------------------------------------------------------
def bf16(a) -> np.ndarray:
    """float32 values of the bf16 rounding (round to nearest even) of ``a``."""
    return np.asarray(a, F32).astype(BF16).astype(F32)


def ceil_log2(q: np.ndarray) -> np.ndarray:
    """Exact ceil(log2(q)) of positive normal float32 q: q = m 2^x with m in [0.5, 1)."""
    m, x = np.frexp(q)
    return np.where(m == 0.5, x - 1, x).astype(np.int64)


def rotate(x: np.ndarray, positions: np.ndarray, table: np.ndarray) -> np.ndarray:
    """bf16(rope_p(x)): pairs (448 + 2i, 449 + 2i) of each row at its position, cos = table[p, i],
    sin = table[p, 32 + i]; every product, difference and sum one float32 rounding."""
    out = x.copy()
    c, s = table[positions, :32], table[positions, 32:]
    e, o = x[:, 448::2], x[:, 449::2]
    out[:, 448::2] = (e * c) - (o * s)
    out[:, 449::2] = (e * s) + (o * c)
    return bf16(out)


def e4m3_blocks(x: np.ndarray, block: int):
    """tokenspeed's SWA quantization of ``x [T, n * block]`` (bf16 values): per block
    e = ceil(log2(fl32(max(amax, 1e-4) * fl32(1/448)))), codes e4m3(x * 2^-e); returns (code
    bytes [T, n * block], scale bytes e + 127 [T, n], dequantized float32 [T, n * block])."""
    t = x.shape[0]
    b = x.reshape(t, x.shape[1] // block, block)
    q = np.maximum(np.abs(b).max(axis=2), F32(1e-4)) * F32(1 / 448)
    e = ceil_log2(q)
    codes = np.clip(np.ldexp(b, -e[..., None]), -448, 448).astype(E4M3)
    deq = np.ldexp(codes.astype(F32), e[..., None])
    return codes.view(np.uint8).reshape(t, x.shape[1]), (e + 127).astype(np.uint8), deq.reshape(t, x.shape[1])


def oracle_swa(fmt, values, positions, table, cache, slots, page_size):
    """The cache after the call (numpy uint8 [pages, width], changed in place) and the bf16 bits
    of the dequantized rows. fp8_ds_mla_v41: a page holds its page_size 512 B data records
    (every dim e4m3, 32-blocks), then its 16 B scale records. fp8_ds_mla: 576 B token records
    (448 e4m3 NoPE dims in 64-blocks, then the 64 rotated dims as little-endian bf16), then 8 B
    scale records (seven scales, a zero pad byte)."""
    rot = rotate(values, positions, table)
    if fmt == "fp8_ds_mla_v41":
        data, scales, deq = e4m3_blocks(rot, 32)
    else:
        codes, sc, nope = e4m3_blocks(rot[:, :448], 64)
        data = np.concatenate([codes, rot[:, 448:].astype(BF16).view(np.uint8)], axis=1)
        scales = np.concatenate([sc, np.zeros((len(sc), 1), np.uint8)], axis=1)
        deq = np.concatenate([nope, rot[:, 448:]], axis=1)
    dw, sw = data.shape[1], scales.shape[1]
    for t, s in enumerate(slots):
        if 0 <= s < cache.shape[0] * page_size:
            p, r = divmod(int(s), page_size)
            cache[p, r * dw:(r + 1) * dw] = data[t]
            cache[p, page_size * dw + r * sw:page_size * dw + (r + 1) * sw] = scales[t]
    return deq.astype(BF16).view(np.uint16)


def oracle_index(fmt: str, q: np.ndarray) -> np.ndarray:
    """bf16 bits of the quantize-dequantize round trip of rows q [N, 128] (bf16 values).
    mxfp4_indexer ('index'): per 32 e = clamp(ceil(log2(fl32(max(amax, 6 * 2^-126) * fl32(1/6)))),
    -127, 127), e2m1(x * 2^-e) round-half-even (sign kept, saturating at 6), value * 2^e.
    fp8_indexer ('index_v4'): s = fl32(max(amax, 1e-6) * fl32(1/448)) per row, e4m3(fl32(x / s)),
    value fl32(e4m3 * s)."""
    if fmt == "mxfp4_indexer":
        b = q.reshape(len(q), 4, 32)
        amax = np.maximum(np.abs(b).max(axis=2), F32(6 * 2.0**-126))
        e = np.clip(ceil_log2(amax * F32(1 / 6)), -127, 127)
        codes = np.clip(np.ldexp(b, -e[..., None]), -6, 6).astype(E2M1)
        out = np.ldexp(codes.astype(F32), e[..., None]).reshape(q.shape)
    else:
        s = (np.maximum(np.abs(q).max(axis=1), F32(1e-6)) * F32(1 / 448))[:, None]
        codes = np.clip(q / s, -448, 448).astype(E4M3)
        out = codes.astype(F32) * s
    return out.astype(BF16).view(np.uint16)


# ----- inputs ------------------------------------------------------------------------------------
KINDS = ("normal", "wide", "zeros", "tiny", "ties", "mixed")


def make_values(kind: str, shape: tuple, seed: int) -> torch.Tensor:
    """bf16 values of one kind (finite; magnitudes that rotate without overflow)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randn(shape, generator=g)
    if kind == "wide":
        x = n * 10.0 ** torch.randint(-30, 30, shape[:-1] + (1,), generator=g).float()
    elif kind == "zeros":
        x = torch.where(torch.rand(shape, generator=g) < 0.5, -0.0, 0.0)
        x[..., ::7] = n[..., ::7]
    elif kind == "tiny":
        x = n * 1e-38  # bf16 subnormals, blocks under every floor
    elif kind == "ties":  # e4m3 midpoints times powers of two: rounding ties after scaling
        mant = 1 + (torch.randint(0, 8, shape, generator=g) * 2 + 1) / 16
        x = mant * torch.exp2(torch.randint(-6, 8, shape, generator=g).float()) * n.sign()
    elif kind == "mixed":
        x = n * torch.exp2(torch.randint(-20, 20, shape, generator=g).float())
    else:
        x = n
    return x.to(torch.bfloat16)


def make_table(rows: int, real: bool, seed: int) -> torch.Tensor:
    if real:
        return cos_sin_cache(64, rows)
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)) * 2  # any float32 table


def new_cache(fmt: str, page_size: int, pages: int, extra: int = 0) -> tuple:
    lay = R.swa_layout(fmt, page_size)
    return lay, torch.full((pages, lay.page_bytes + extra), SENTINEL, dtype=torch.uint8)


@st.composite
def swa_cases(draw, max_t: int = 6):
    fmt = draw(st.sampled_from(R.SWA_FORMATS))
    page_size = draw(st.sampled_from([1, 2, 3, 64]))
    pages = draw(st.integers(0, 3))
    cap = pages * page_size
    t = draw(st.integers(0, max_t))
    live = draw(st.lists(st.integers(0, max(cap - 1, 0)), min_size=0, max_size=t, unique=True)) if cap else []
    dead = [draw(st.sampled_from([-1, -5, cap, cap + 7])) for _ in range(t - len(live))]
    slots = draw(st.permutations(live + dead))
    rows = draw(st.integers(1, 40))
    positions = draw(st.lists(st.integers(0, rows - 1), min_size=t, max_size=t))
    return dict(fmt=fmt, page_size=page_size, pages=pages, slots=slots, positions=positions, rows=rows,
                kind=draw(st.sampled_from(KINDS)), seed=draw(st.integers(0, 2**16)), real=draw(st.booleans()),
                strided=draw(st.booleans()), with_out=draw(st.booleans()), int32=draw(st.booleans()),
                extra=draw(st.sampled_from([0, 16])))


def build(case, device=CPU):
    """(layout, cache, values, positions, table, slots, out) of a drawn case, on ``device``."""
    t = len(case["slots"])
    lay, cache = new_cache(case["fmt"], case["page_size"], case["pages"], case["extra"])
    x = make_values(case["kind"], (t, 512), case["seed"])
    if case["strided"]:  # rows of a wider buffer
        wide = torch.zeros(t, 520, dtype=torch.bfloat16)
        wide[:, 3:515] = x
        x = wide.to(device)[:, 3:515]
    itype = torch.int32 if case["int32"] else torch.int64
    out = torch.full((t, 512), float("nan"), dtype=torch.bfloat16) if case["with_out"] else None
    pos, slots = torch.tensor(case["positions"], dtype=itype), torch.tensor(case["slots"], dtype=itype)
    rest = (cache, x, pos, make_table(case["rows"], case["real"], case["seed"]), slots, out)
    return (lay, *(None if a is None else a.to(device) for a in rest))


def run_swa(case, backend: str, device=CPU):
    lay, cache, x, pos, table, slots, out = build(case, device)
    got = R.swa_rope_scatter(x, pos, table, cache, slots, fmt=case["fmt"], page_size=case["page_size"], out=out,
                             backend=backend)
    assert got is out
    return lay, cache, out, (x, pos, table, slots)


# ----- registration ------------------------------------------------------------------------------
def test_the_ops_are_registered_with_a_reference_and_a_kernel():
    from kvformats_kernels.dsv41 import LAUNCHERS
    from kvformats_kernels.dsv41 import rows as K

    for op in ("swa_rope_scatter", "index_q_quantize"):
        assert op in D.MODEL_OPS and LAUNCHERS[op] is K.LAUNCHERS[op]
    assert set(R.__all__) == {"INDEX_FORMATS", "SWA_FORMATS", "index_q_quantize", "swa_rope_scatter"}


# ----- the reference against the oracle ----------------------------------------------------------
@FUZZ
@given(swa_cases())
def test_swa_rope_scatter_reference_is_the_rule(case):
    lay, cache, out, (x, pos, table, slots) = run_swa(case, "reference")
    want = torch.full_like(cache, SENTINEL).numpy()
    deq = oracle_swa(case["fmt"], x.float().numpy(), pos.numpy(), table.numpy(), want, slots.numpy(),
                     case["page_size"])
    diff = np.argwhere(cache.numpy() != want)
    assert diff.size == 0, f"{len(diff)} bytes differ, first at {diff[:3].tolist()}"
    if out is not None:
        assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), deq)


@pytest.mark.parametrize("fmt", R.SWA_FORMATS)
def test_swa_rope_scatter_writes_every_slot_of_the_cache_and_nothing_else(fmt):
    """Page 0 included; -1 and slots beyond the cache skipped silently (nothing recorded)."""
    lay, cache = new_cache(fmt, 4, 3)
    x = make_values("normal", (6, 512), 1)
    slots = torch.tensor([0, 3, -1, 12, 11, 40])
    R.swa_rope_scatter(x, torch.arange(6), cos_sin_cache(64, 8), cache, slots, fmt=fmt, page_size=4)
    touched = (cache != SENTINEL).to(torch.uint8)
    written = {int(s) for s in slots if 0 <= s < 12}
    for s in range(12):
        assert bool(read_rows(lay, touched, torch.tensor([s])).any()) == (s in written), s
    assert kvf.pending_error(CPU) is None
    # no byte outside the written rows (fp8_ds_mla's page pad included) lost the sentinel
    assert int(touched.sum()) == int(read_rows(lay, touched, torch.tensor(sorted(written))).sum())


@FUZZ
@given(fmt=st.sampled_from(R.INDEX_FORMATS), t=st.integers(0, 5), h=st.integers(1, 4),
       kind=st.sampled_from(KINDS), seed=st.integers(0, 2**16), layout=st.sampled_from(["dense", "strided", "out"]))
def test_index_q_quantize_reference_is_the_rule(fmt, t, h, kind, seed, layout):
    q = make_values(kind, (t, h, 128), seed)
    if layout == "strided":  # heads of a wider buffer, tokens further apart
        wide = torch.zeros(t, h + 1, 136, dtype=torch.bfloat16)
        wide[:, 1:, 4:132] = q
        q = wide[:, 1:, 4:132]
    out = torch.full((t, h, 128), float("nan"), dtype=torch.bfloat16) if layout == "out" else None
    got = R.index_q_quantize(q, fmt=fmt, out=out, backend="reference")
    assert got is out if out is not None else (got.shape == q.shape and got.is_contiguous())
    want = oracle_index(fmt, q.float().reshape(-1, 128).numpy())
    assert np.array_equal(got.reshape(-1, 128).view(torch.int16).numpy().view(np.uint16), want)


def test_index_q_quantize_may_write_q_in_place():
    for fmt in R.INDEX_FORMATS:
        q = make_values("mixed", (3, 2, 128), 4)
        want = R.index_q_quantize(q, fmt=fmt)
        assert R.index_q_quantize(q, fmt=fmt, out=q) is q
        assert torch.equal(q.view(torch.int16), want.view(torch.int16))


def test_swa_rope_scatter_may_write_out_over_values():
    lay, c1 = new_cache("fp8_ds_mla", 64, 2)
    c2 = c1.clone()
    x = make_values("wide", (4, 512), 9)
    pos, table, slots = torch.tensor([1, 7, 3, 0]), make_table(9, False, 3), torch.tensor([70, 2, -1, 5])
    want = torch.empty_like(x)
    R.swa_rope_scatter(x, pos, table, c1, slots, fmt="fp8_ds_mla", out=want)
    assert R.swa_rope_scatter(x, pos, table, c2, slots, fmt="fp8_ds_mla", out=x) is x
    assert torch.equal(c1, c2) and torch.equal(x.view(torch.int16), want.view(torch.int16))


# ----- the Triton kernels under the interpreter ----------------------------------------------------
def same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    """bf16 tensors equal bit for bit, NaN where the other is NaN (any NaN bits)."""
    a, b = a.reshape(-1), b.reshape(-1)
    assert torch.equal(a.isnan(), b.isnan())
    keep = ~a.isnan()
    assert torch.equal(a[keep].view(torch.int16), b[keep].view(torch.int16))


def same_cache(lay, a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal bytes, except NaN encodings (e4m3 0x7F / 0xFF, bf16 NaN halves), whose bits are not
    specified (spec/nan-policy.md §1.3): then every row decodes alike and the scales are equal."""
    if torch.equal(a, b):
        return
    slots = torch.arange(a.shape[0] * lay.page_size, device=a.device)
    ra, rb = read_rows(lay, a, slots), read_rows(lay, b, slots)
    same_bits(lay.decode_rows(ra), lay.decode_rows(rb))
    assert torch.equal(ra[:, lay.row_span("scale")], rb[:, lay.row_span("scale")])
    assert int((a != b).sum()) <= 2 * int(lay.decode_rows(ra).isnan().sum())  # at most a NaN's bytes


@KERNEL_FUZZ
@given(swa_cases(max_t=5))
def test_swa_rope_scatter_kernel_is_the_reference(routed, case):
    lay, c_ref, o_ref, _ = run_swa(case, "reference", DEV)
    _, c_tri, o_tri, _ = run_swa(case, "triton", DEV)
    assert torch.equal(c_ref, c_tri)
    if o_ref is not None:
        assert torch.equal(o_ref.view(torch.int16), o_tri.view(torch.int16))


def _nonfinite(x: torch.Tensor) -> torch.Tensor:
    """NaN and Inf in NoPE and RoPE dims, and values whose rotation overflows float32."""
    x = x.clone()
    x[0, 5], x[1, 470], x[2, 449] = float("nan"), float("inf"), -float("inf")
    x[3, 480:484] = 3e38
    x[4, 500] = -float("nan")
    return x


@pytest.mark.parametrize("fmt", R.SWA_FORMATS)
def test_swa_rope_scatter_kernel_nonfinite_and_invalid_positions(routed, fmt):
    """NaN / Inf rows; a position outside the table: no cache row, the unrotated round trip in
    ``out``, the violation recorded (the first of the call, at the op's site)."""
    table = make_table(40, True, 0).to(DEV)
    x = _nonfinite(make_values("normal", (6, 512), 3)).to(DEV)
    pos = torch.tensor([1, 39, 7, 12, 40, 3], device=DEV)  # token 4: beyond the table
    slots = torch.tensor([3, 64, 65, 0, 66, 100], dtype=torch.int32, device=DEV)
    results = []
    for backend in ("reference", "triton"):
        lay, cache = new_cache(fmt, 64, 2)
        cache = cache.to(DEV)
        out = torch.zeros(6, 512, dtype=torch.bfloat16, device=DEV)
        R.swa_rope_scatter(x, pos, table, cache, slots, fmt=fmt, out=out, backend=backend)
        err = kvf.pending_error(DEV)
        site = deferred.SITES[R.POSITIONS_SITE][0]
        assert err is not None and str(err).startswith(f"{site}: positions[4] = 40 is outside [0, 40)"), err
        assert not bool((read_rows(lay, cache, torch.tensor([66], device=DEV)) != SENTINEL).any())  # token 4
        results.append((cache, out))
    same_cache(lay, results[0][0], results[1][0])
    same_bits(results[0][1], results[1][1])
    same_bits(results[1][1][4], lay.decode_rows(lay.encode_rows(x[4:5]))[0])  # unrotated


@KERNEL_FUZZ
@given(fmt=st.sampled_from(R.INDEX_FORMATS), t=st.integers(0, 4), h=st.integers(1, 5),
       kind=st.sampled_from(KINDS), seed=st.integers(0, 2**16), strided=st.booleans())
def test_index_q_quantize_kernel_is_the_reference(routed, fmt, t, h, kind, seed, strided):
    q = make_values(kind, (t, h, 128), seed).to(DEV)
    if strided:
        q = torch.cat([q, q], dim=1)[:, ::2]
    want = R.index_q_quantize(q, fmt=fmt, backend="reference")
    got = R.index_q_quantize(q, fmt=fmt, backend="triton")
    assert torch.equal(want.view(torch.int16), got.view(torch.int16))


def test_index_q_quantize_kernel_nonfinite(routed):
    q = make_values("wide", (3, 4, 128), 5)
    q[0, 0, 3], q[1, 2, 40], q[2, 3, 127], q[2, 1, :] = float("nan"), float("inf"), -float("inf"), 3e38
    q = q.to(DEV)
    for fmt in R.INDEX_FORMATS:
        same_bits(R.index_q_quantize(q, fmt=fmt, backend="reference"), R.index_q_quantize(q, fmt=fmt,
                                                                                           backend="triton"))


# ----- checks ------------------------------------------------------------------------------------
def _swa_args(fmt="fp8_ds_mla_v41", t=3):
    lay, cache = new_cache(fmt, 64, 2)
    return dict(values=make_values("normal", (t, 512), 0), positions=torch.arange(t),
                cos_sin_cache=cos_sin_cache(64, 8), cache=cache, slots=torch.tensor([1, 70, -1])[:t],
                kw=dict(fmt=fmt, page_size=64, out=torch.full((t, 512), 7.0, dtype=torch.bfloat16)))


def _with(**changes):
    a = _swa_args()
    kw = a.pop("kw")
    for k, v in changes.items():
        (kw if k in kw or k in ("backend", "check") else a)[k] = v
    return a, kw


SWA_BAD = [
    ("fmt", dict(fmt="fp8_ds_mla_v32"), InputError),
    ("fmt type", dict(fmt=3), InputError),
    ("page_size", dict(page_size=0), InputError),
    ("page_size type", dict(page_size=64.0), InputTypeError),
    ("cache dtype", dict(cache=torch.zeros(2, 33792, dtype=torch.int8)), InputTypeError),
    ("cache narrow", dict(cache=torch.zeros(2, 33791, dtype=torch.uint8)), LayoutError),
    ("cache pages", dict(page_size=3), None),  # fine: the same bytes hold other pages
    ("values fp32", dict(values=torch.zeros(3, 512)), InputTypeError),
    ("values width", dict(values=torch.zeros(3, 448, dtype=torch.bfloat16)), InputError),
    ("values 3-D", dict(values=torch.zeros(3, 1, 512, dtype=torch.bfloat16)), InputError),
    ("positions float", dict(positions=torch.zeros(3)), InputTypeError),
    ("positions length", dict(positions=torch.arange(4)), InputError),
    ("slots int16", dict(slots=torch.zeros(3, dtype=torch.int16)), InputTypeError),
    ("slots length", dict(slots=torch.tensor([1, 2])), InputError),
    ("table width", dict(cos_sin_cache=torch.zeros(8, 32)), InputError),
    ("table dtype", dict(cos_sin_cache=torch.zeros(8, 64, dtype=torch.float64)), InputTypeError),
    ("out shape", dict(out=torch.zeros(2, 512, dtype=torch.bfloat16)), InputError),
    ("out dtype", dict(out=torch.zeros(3, 512)), InputTypeError),
    ("out strided", dict(out=torch.zeros(512, 3, dtype=torch.bfloat16).t()), InputError),
    ("position beyond", dict(positions=torch.tensor([0, 8, 1])), InputError),
    ("position negative", dict(positions=torch.tensor([0, -1, 1])), InputError),
    ("repeated slot", dict(slots=torch.tensor([70, 70, -1])), InputError),
    ("repeated skipped slot", dict(slots=torch.tensor([-1, -1, 500])), None),  # nothing repeated is written
    ("check", dict(check="yes"), InputTypeError),
    ("backend", dict(backend="cuda"), InputError),
    ("backend triton", dict(backend="triton"), BackendUnavailableError),  # CPU tensors, no routing
]


@pytest.mark.parametrize("name, change, error", SWA_BAD, ids=[c[0] for c in SWA_BAD])
def test_swa_rope_scatter_refuses_before_writing(name, change, error):
    a, kw = _with(**change)
    cache, out = a["cache"].clone(), kw["out"].clone()
    if error is None:
        R.swa_rope_scatter(*a.values(), **kw)
        return
    with pytest.raises(error):
        R.swa_rope_scatter(*a.values(), **kw)
    assert torch.equal(a["cache"], cache) and torch.equal(kw["out"].view(torch.int16), out.view(torch.int16))


def test_swa_rope_scatter_device_path_stores_one_of_repeated_rows(device_mode):
    a, kw = _with(slots=torch.tensor([70, 70, -1]))
    R.swa_rope_scatter(*a.values(), **kw)
    lay = R.swa_layout("fp8_ds_mla_v41", 64)
    row = read_rows(lay, a["cache"], torch.tensor([70]))
    one = [read_rows(lay, _solo(a, kw, i), torch.tensor([70])) for i in (0, 1)]
    assert torch.equal(row, one[0]) or torch.equal(row, one[1])
    assert kvf.pending_error(CPU) is None  # not looked for on this path


def _solo(a, kw, i):
    b = dict(a, cache=torch.full_like(a["cache"], SENTINEL), slots=torch.tensor([-1, -1, -1]))
    b["slots"][i] = 70
    R.swa_rope_scatter(*b.values(), **dict(kw, out=None))
    return b["cache"]


def test_swa_rope_scatter_check_false_records_positions_on_cpu():
    a, kw = _with(positions=torch.tensor([0, 8, 1]), check=False)
    R.swa_rope_scatter(*a.values(), **kw)
    assert "positions[1] = 8 is outside [0, 8)" in str(kvf.pending_error(CPU))
    lay = R.swa_layout("fp8_ds_mla_v41", 64)
    assert not bool((read_rows(lay, a["cache"], torch.tensor([70])) != SENTINEL).any())


INDEX_BAD = [
    ("q fp32", dict(q=torch.zeros(2, 3, 128)), InputTypeError),
    ("q width", dict(q=torch.zeros(2, 3, 64, dtype=torch.bfloat16)), InputError),
    ("q 2-D", dict(q=torch.zeros(6, 128, dtype=torch.bfloat16)), InputError),
    ("q type", dict(q=[[0.0] * 128]), InputTypeError),
    ("fmt", dict(fmt="index"), InputError),
    ("out shape", dict(out=torch.zeros(2, 4, 128, dtype=torch.bfloat16)), InputError),
    ("out dtype", dict(out=torch.zeros(2, 3, 128)), InputTypeError),
    ("out strided", dict(out=torch.zeros(2, 128, 3, dtype=torch.bfloat16).transpose(1, 2)), InputError),
    ("check", dict(check=None), InputTypeError),
    ("backend", dict(backend="gpu"), InputError),
]


@pytest.mark.parametrize("name, change, error", INDEX_BAD, ids=[c[0] for c in INDEX_BAD])
def test_index_q_quantize_refuses_before_writing(name, change, error):
    kw = dict(q=make_values("normal", (2, 3, 128), 0), fmt="fp8_indexer",
              out=torch.full((2, 3, 128), 5.0, dtype=torch.bfloat16))
    kw.update(change)
    before = kw["out"].clone()
    with pytest.raises(error):
        R.index_q_quantize(kw.pop("q"), **kw)
    assert torch.equal(kw["out"], before)
