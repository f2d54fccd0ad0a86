"""The Triton encode kernels honour every numerics profile their package declares (spec/profiles.md):
kernel bytes == reference bytes for each (format, profile), and the profile-only helpers
(e2m1 round-half-even / signed zero, exact floor_log2) equal kvformats.numerics.codes element for element."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.codec import slot_ops as ops
from kvformats.numerics import codes as nx

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import kvformats_kernels as kk  # noqa: E402
from kvformats_kernels import numerics_jit as nj  # noqa: E402
from kvformats_kernels.geometry import row_geometry  # noqa: E402
from test_kernels import DEV, arena_cache, bits, encode_slots, padded, rows  # noqa: E402

CUDA = torch.cuda.is_available()
FORMATS = {"fp8_ds_mla": (64, 448.0), "fp8_ds_mla_v32": (128, 448.0), "fp8_indexer": (128, 448.0),
           "mxfp4_indexer": (32, 6.0), "fp8_ds_mla_v41": (32, 448.0), "fp8_ds_mla_v41_interleaved": (32, 448.0),
           "fp4_ds_mla_v41": (16, 6.0), "fp4_ds_mla_v41_interleaved": (16, 6.0)}
CASES = [(f, p) for f in FORMATS for p in kvf.supported_profiles()[f]]
V41 = ("fp8_ds_mla_v41", "fp8_ds_mla_v41_interleaved", "fp4_ds_mla_v41", "fp4_ds_mla_v41_interleaved")
V41_CASES = [(f, p) for f in V41 for p in kvf.supported_profiles()[f]]


@triton.jit
def _probe(x_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if OP == 0:
        r = nj.e2m1_code(x, True, True)
    elif OP == 1:
        r = nj.e2m1_code(x, True, False)
    elif OP == 2:
        r = nj.e2m1_code(x, False, True)
    else:
        r = nj.floor_log2(x)
    tl.store(out_ptr + offs, r, mask=m)


def _probe_run(op: int, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.int32, device=x.device)
    _probe[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), OP=op, BLOCK=4096)
    return out


def _floats(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(9)
    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    rand = torch.randint(-(1 << 31), (1 << 31) - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    grid = torch.tensor([*nx.E2M1_THRESHOLDS, *nx.E2M1_VALUES, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 8.0])
    near = torch.cat([grid, torch.nextafter(grid, torch.zeros(())), torch.nextafter(grid, grid * 2)])
    x = torch.cat([every_bf16, rand.view(torch.float32), near, -near])
    return x


@pytest.mark.parametrize("op,rounding,signed_zero", [(0, "rne", True), (1, "rne", False), (2, "threshold", True)])
def test_e2m1_code_variants_match_numerics(op, rounding, signed_zero):
    x = _floats(1 << 15)
    got = _probe_run(op, x.to(DEV)).cpu()
    want = nx.e2m1_encode(x, rounding, signed_zero).to(torch.int32)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"first mismatch at {x[bad[0, 0]].item()!r}: {got[bad[0, 0]]} != {want[bad[0, 0]]}"


def test_floor_log2_matches_numerics():
    x = _floats(1 << 15).abs()
    x = torch.cat([x, torch.tensor([0.0, 1e-45, 2.0**-149, 2.0**-127, 2.0**-126, float("inf")])])
    x = x[~torch.isnan(x)]
    assert torch.equal(_probe_run(3, x.to(DEV)).cpu(), nx.floor_log2(x))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's overflowing numpy products
@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_encode_matches_reference_for_every_profile(fmt, profile, dtype):
    block, elem_max = FORMATS[fmt]
    layout = kvf.get_format(fmt, page_size=4, profile=profile)
    n, pages = 24, 8
    x = padded(rows(n, layout.head_dim, block, elem_max, dtype, seed=len(profile)).to(DEV))
    x[0, :block] = 0.0  # an all-zero block: the floors decide (OCP's floor 0 -> exponent_min)
    slots = encode_slots(n, pages * layout.page_size, seed=3)
    (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, 5), arena_cache(layout, pages, 5)
    ops.encode_reference(layout, x, ref, slots)
    kk.IMPLEMENTATIONS[fmt].encode(layout, x, tri, slots)
    assert torch.equal(bits(arena_tri), bits(arena_ref)), "bytes differ (or a write strayed outside its rows)"


def test_every_profile_of_a_kernel_format_resolves_to_the_kernel():
    cuda = torch.device("cuda")
    for fmt, profile in CASES:
        lay = kvf.get_format(fmt, profile=profile)
        assert registry.resolve_for(lay, "encode", "triton", cuda) is kk.IMPLEMENTATIONS[fmt].encode


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_gpu_public_encode_per_profile(fmt, profile):
    block, elem_max = FORMATS[fmt]
    layout = kvf.get_format(fmt, page_size=64, profile=profile)
    n = 4096
    x = rows(n, layout.head_dim, block, elem_max, torch.bfloat16, seed=11).cuda()
    slots = torch.randperm(64 * 80)[:n].cuda()
    a, b = layout.allocate(80, device="cuda"), layout.allocate(80, device="cuda")
    layout.encode(x, a, slots, backend="triton")
    layout.encode(x, b, slots, backend="reference")
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# ----------------------------------------------------------------------------- V4.1: the blocks the profiles differ on


def _v41_blocks(block: int, elem_max: float, g: torch.Generator) -> list[torch.Tensor]:
    """float32 blocks on which the V4.1 profiles differ or their kernels could: non-finite
    blocks (FlashMLA's poison_nonfinite against the clamp rule), zero and signed-zero blocks,
    blocks below every floor (amax < 6 * 2^-9 and < 448 * 1e-4), between the floors and on
    their edges, e2m1 and e4m3 rounding ties at subnormal e4m3 scales and at power-of-two
    scales, vLLM's product amax * fl32(1/6) where it differs from the division, and blocks of
    mixed magnitudes."""
    def rnd(scale):
        return torch.randn(block, generator=g) * scale

    def with_at(b, i, v):
        b = b.clone()
        b[i] = v
        return b

    nan, inf = float("nan"), float("inf")
    out = [
        with_at(rnd(1.0), 3, nan), with_at(rnd(1e3), 0, inf), with_at(rnd(1e-3), block - 1, -inf),
        with_at(with_at(rnd(1.0), 1, inf), 2, nan), torch.full((block,), -inf), torch.full((block,), nan),
        torch.zeros(block), torch.where(torch.rand(block, generator=g) < 0.5, -0.0, 0.0),
        rnd(1e-3).clamp(-0.0117, 0.0117), rnd(0.01).clamp(-0.0447, 0.0447), rnd(1e-6), rnd(1e-30), rnd(1e-40),
        with_at(rnd(1e-3), 0, 6 * 2.0**-9), with_at(rnd(1e-3), 0, 6 * 2.0**-10), with_at(rnd(1e-5), 0, 448e-4),
        with_at(rnd(1e-5), 0, 1e-4), with_at(rnd(1e-5), 0, 0.0449), with_at(rnd(1e-2), 0, 0.0234),
        with_at(rnd(1.0), 0, 6 * 448.0), with_at(rnd(1.0), 0, 3e4), with_at(rnd(1e-3), 0, 3e38),
    ]
    sign = torch.where(torch.rand(block, generator=g) < 0.5, -1.0, 1.0)
    if elem_max == 6.0:  # e2m1 midpoints times subnormal and normal e4m3 scales, the block maximum 6 s
        mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
        for m in (1, 3, 5, 7, 12, 0x3C):  # e4m3 scales m * 2^-9 (subnormal below 8), then bytes 0x0C, 0x3C
            s = m * 2.0**-9 if m < 8 else float(nx.e4m3_decode(torch.tensor([m], dtype=torch.uint8)))
            t = mids[torch.randint(0, 7, (block,), generator=g)] * sign * s
            out.append(with_at(t, int(torch.randint(0, block, (1,), generator=g)), 6 * s))
    else:  # e4m3 midpoints at power-of-two scales, the block maximum 448 * 2^k
        grid = nx.e4m3_decode(torch.arange(0, 0x7F, dtype=torch.uint8))
        mids = (grid[1:] + grid[:-1]) / 2
        for k in (-20, -14, -8, 0, 6):
            t = mids[torch.randint(0, mids.numel(), (block,), generator=g)] * sign * 2.0**k
            out.append(with_at(t, 0, 448.0 * 2.0**k))
    # maxima where fl32(amax * fl32(1/6)) != fl32(amax / 6): vLLM's product differs from the division
    a = (torch.arange(0x3C00, 0x4600, dtype=torch.int32) << 16).view(torch.float32)  # bf16 values 2^-7 .. 2^13
    inv = torch.tensor(1.0 / 6.0, dtype=torch.float32)
    differ = a[(a * inv) != (a / torch.tensor(6.0))]
    for v in differ[torch.randperm(differ.numel(), generator=g)[:4]]:
        out.append(with_at(rnd(float(v) / 8), 0, float(v)))
    out.append(torch.cat([rnd(1e-20)[: block // 2], rnd(1e20)[block // 2:]]))  # mixed magnitudes
    return out


def _v41_edge_rows(layout, block: int, elem_max: float, seed: int) -> torch.Tensor:
    """[n, head_dim] float32 rows of every _v41_blocks block (cycled), then random rows."""
    g = torch.Generator().manual_seed(seed)
    blocks = _v41_blocks(block, elem_max, g)
    per_row = layout.head_dim // block
    n = -(-len(blocks) // per_row) + 2
    x = torch.randn(n, layout.head_dim, generator=g) * torch.exp(torch.randn(n, 1, generator=g) * 4)
    for i, b in enumerate(blocks):
        x[i // per_row, (i % per_row) * block:(i % per_row + 1) * block] = b
    return x


def _assert_v41_bytes(layout, arena_ref, arena_tri, ref, tri, slots, exact: bool) -> None:
    """Byte-equal caches; without ``exact`` (float32 input of the fp8 formats, or of the fp4
    profiles whose NaN nibble keeps the NaN's sign) an e4m3 value byte may be 0x7F where the other
    is 0xFF, an e2m1 nibble 0x8 where the other is 0x0: a NaN element's code, whose sign the spec
    leaves open (spec/nan-policy.md §1.3: torch's float32 -> bf16 cast gives 0xFFFF on its vector
    paths)."""
    if exact:
        assert torch.equal(bits(arena_tri), bits(arena_ref)), "bytes differ (or a write strayed outside its rows)"
        return
    cap = ref.shape[0] * layout.page_size
    valid = slots[(slots >= 0) & (slots < cap)]
    a, b = ops.gather_reference(layout, ref, valid), ops.gather_reference(layout, tri, valid)
    v = layout.row_span("values")
    if row_geometry(layout).fp4:  # FlashMLA's NaN nibble carries that NaN's sign: only the sign bit may differ
        assert bool((((a[:, v] ^ b[:, v]) & 0x77) == 0).all()), "nibbles differ (beyond a NaN nibble's sign)"
    else:
        nan_code = ((a[:, v] & 0x7F) == 0x7F) & ((b[:, v] & 0x7F) == 0x7F)
        assert bool(((a[:, v] == b[:, v]) | nan_code).all()), "value bytes differ (beyond a NaN code's sign)"
    rest = torch.ones(a.shape[1], dtype=torch.bool)
    rest[v] = False
    assert torch.equal(a[:, rest], b[:, rest]), "scale bytes differ"


@pytest.mark.parametrize("fmt,profile", V41_CASES, ids=[f"{f}-{p}" for f, p in V41_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 512])
def test_v41_encode_of_edge_blocks_matches_reference(fmt, profile, dtype, head_dim):
    """Every V4.1 format and profile on _v41_blocks: the per-row kernel (rows at an odd offset)
    and, for fp4 bf16 rows of 512 dims, the one-pair-per-lane kernel (contiguous rows, an
    aligned cache) too."""
    from kvformats_kernels import v41

    block, elem_max = FORMATS[fmt]
    layout = kvf.get_format(fmt, head_dim=head_dim, page_size=4, profile=profile)
    x = _v41_edge_rows(layout, block, elem_max, seed=head_dim + len(profile)).to(dtype).to(DEV)
    n = x.shape[0]
    pages = n // layout.page_size + 2
    slots = torch.randperm(pages * layout.page_size, generator=torch.Generator().manual_seed(n))[:n].to(DEV)
    # e2m1 has no NaN code: fp4 bytes are exact, but for the NaN nibble's sign (e2m1_nan_sign)
    exact = dtype == torch.bfloat16 or (block == 16 and not layout.numerics.e2m1_nan_sign)
    lanes = v41._encode_config(layout, dtype == torch.bfloat16, True)[1]
    for x_in, pad in ((padded(x), 5), (x, 0)) if lanes else ((padded(x), 5),):
        (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, pad), arena_cache(layout, pages, pad)
        ops.encode_reference(layout, x_in, ref, slots)
        kk.IMPLEMENTATIONS[fmt].encode(layout, x_in, tri, slots)
        _assert_v41_bytes(layout, arena_ref, arena_tri, ref, tri, slots, exact)
    if lanes:  # the lane path: an aligned cache (arena_cache's sits at byte 7)
        ref, tri = layout.allocate(pages).fill_(0xA5).to(DEV), layout.allocate(pages).fill_(0xA5).to(DEV)
        ops.encode_reference(layout, x, ref, slots)
        v41.encode(layout, x, tri, slots)
        assert torch.equal(bits(tri), bits(ref))


def test_v41_profiles_differ_where_they_should():
    """What the inputs above reach of the rules the profiles differ by. fp8: FlashMLA's floor on
    the scale (blocks below 448 * 1e-4) and its poisoned non-finite blocks. fp4: FlashMLA's writer
    gives the clamp rule's bytes (a NaN block's scale NaN, an Inf saturating at 448) but for a
    NaN element's nibble, which carries that NaN's sign (e2m1_nan_sign), and vLLM's
    product amax * fl32(1/6) differs from the division on some maxima but never in the e4m3
    scale byte of a bf16 maximum (test_fp4_words_hw.py checks the kernel's on every one)."""
    for fmt, block, elem_max in (("fp4_ds_mla_v41_interleaved", 16, 6.0), ("fp8_ds_mla_v41_interleaved", 32, 448.0)):
        out = {}
        for p in kvf.supported_profiles()[fmt]:
            layout = kvf.get_format(fmt, head_dim=64, page_size=4, profile=p)
            out[p] = layout.encode_rows(_v41_edge_rows(layout, block, elem_max, seed=1))
        assert torch.equal(out["vllm"], out["tokenspeed"]), fmt
        if block == 32:
            assert not torch.equal(out["flashmla"], out["tokenspeed"]), fmt
            continue
        # fp4: the same bytes but for a NaN element's nibble, which FlashMLA's writer signs
        x = _v41_edge_rows(kvf.get_format(fmt, head_dim=64, page_size=4), block, elem_max, seed=1)
        xb = x.to(torch.bfloat16)
        signed_nan = (torch.isnan(xb) & torch.signbit(xb)).to(torch.uint8)
        nib = signed_nan.reshape(xb.shape[0], -1, 2)
        want_diff = (nib[..., 0] << 3) | (nib[..., 1] << 7)
        assert torch.equal(out["flashmla"][:, :32] ^ out["tokenspeed"][:, :32], want_diff), fmt
        assert torch.equal(out["flashmla"][:, 32:], out["tokenspeed"][:, 32:]), fmt


def test_v41_profile_constants():
    """Each V4.1 profile's knobs reach the encode's constexprs (and so its plan key)."""
    from kvformats_kernels import v41

    def consts(fmt, profile):
        return v41._rule_constants(kvf.get_format(fmt, profile=profile))

    for fmt in ("fp4_ds_mla_v41", "fp4_ds_mla_v41_interleaved"):
        for p in kvf.supported_profiles()[fmt]:
            c = consts(fmt, p)
            assert (c["FLOOR"], c["ELEM_MAX"], c["FLOOR_ON_SCALE"], c["SCALE_MAX"], c["POISON"]) == (
                2.0**-9, 6.0, True, 448.0, False)
            assert c["RECIPROCAL"] == (p == "vllm")
            assert c["RCP"] == float(torch.tensor(1 / 6, dtype=torch.float32))
    for fmt in ("fp8_ds_mla_v41", "fp8_ds_mla_v41_interleaved"):
        for p in kvf.supported_profiles()[fmt]:
            c = consts(fmt, p)
            assert c["POISON"] == c["FLOOR_ON_SCALE"] == (p == "flashmla") and not c["RECIPROCAL"]
            assert c["FLOOR"] == float(torch.tensor(1e-4, dtype=torch.float32)) and c["ELEM_MAX"] == 448.0
