"""Triton kernels == reference, byte for byte.

Without CUDA the launchers run under the Triton interpreter (conftest sets TRITON_INTERPRET)
on CPU tensors, at small sizes; with CUDA the same tests run compiled, and the tests marked
``gpu`` add larger sizes through the public API, CUDA-graph capture and exhaustive checks of
the rounding helpers.
"""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.codec import slot_ops as ops
from kvformats.numerics import codes as nx
from tests.harness.capabilities import require

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

import kvformats_kernels as kk  # noqa: E402  (after conftest chose interpreter or GPU)
from kvformats_kernels import _common as cm  # noqa: E402
from kvformats_kernels import numerics_jit as nj  # noqa: E402
from kvformats_kernels import tuning  # noqa: E402
from kvformats_kernels._common import rule_constants  # noqa: E402
from tests.harness.capabilities import with_declared_cases  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SENTINEL = 0xA5

# ----------------------------------------------------------------------------- inputs

CURATED = {  # id -> (layout, quant block, element max): odd geometries and profiles worth their time
    "fp8_ds_mla": (kvf.Fp8DsMla(page_size=4), 64, 448.0),
    "fp8_ds_mla-256": (kvf.Fp8DsMla(head_dim=256, rope_dim=64, page_size=3), 64, 448.0),
    "fp8_ds_mla_v32": (kvf.get_format("fp8_ds_mla_v32", page_size=4), 128, 448.0),
    "fp8_ds_mla_v32-vllm": (kvf.get_format("fp8_ds_mla_v32", head_dim=320, page_size=3, profile="vllm"), 128, 448.0),
    "fp8_indexer": (kvf.Fp8Indexer(page_size=4), 128, 448.0),
    "fp8_indexer-256": (kvf.Fp8Indexer(head_dim=256, page_size=5), 128, 448.0),
    "mxfp4_indexer": (kvf.Mxfp4Indexer(page_size=4), 32, 6.0),
    "mxfp4_indexer-96": (kvf.Mxfp4Indexer(head_dim=96, page_size=2), 32, 6.0),
    "fp8_ds_mla_v41": (kvf.Fp8DsMlaV41(page_size=4), 32, 448.0),
    "fp8_ds_mla_v41-96": (kvf.Fp8DsMlaV41(head_dim=96, page_size=3), 32, 448.0),
    "fp4_ds_mla_v41": (kvf.Fp4DsMlaV41(page_size=4), 16, 6.0),
    "fp4_ds_mla_v41-48": (kvf.Fp4DsMlaV41(head_dim=48, page_size=5), 16, 6.0),
    # the token-interleaved layouts, in their default profile flashmla (scale floors on amax / 448
    # and 2^-9, non-finite blocks poisoned); the others are in test_profile_kernels.py
    "fp8_ds_mla_v41_interleaved": (kvf.Fp8DsMlaV41Interleaved(page_size=4), 32, 448.0),
    "fp8_ds_mla_v41_interleaved-96": (kvf.Fp8DsMlaV41Interleaved(head_dim=96, page_size=3), 32, 448.0),
    "fp4_ds_mla_v41_interleaved": (kvf.Fp4DsMlaV41Interleaved(page_size=4), 16, 6.0),
    "fp4_ds_mla_v41_interleaved-48-vllm": (kvf.get_format("fp4_ds_mla_v41_interleaved", head_dim=48, page_size=5,
                                                          profile="vllm"), 16, 6.0),
    "compressor_state": (kvf.CompressorState(head_dim=64, ratio=4, page_size=4), 0, 0.0),
    "compressor_state-128": (kvf.CompressorState(head_dim=48, ratio=128, page_size=8), 0, 0.0),
}
# ... and every other format with kernels (a new one, or one a kernel package adds), by its
# declared layouts: no list here needs an edit for it
LAYOUTS = with_declared_cases(CURATED, entry=lambda case: case[0])


def _e4m3_midpoints() -> torch.Tensor:
    grid = nx.e4m3_decode(torch.arange(0, 0x7F, dtype=torch.uint8))
    return (grid[1:] + grid[:-1]) / 2


def _block_theme(theme: int, size: int, elem_max: float, g: torch.Generator) -> torch.Tensor:
    """One quantization block of an adversarial pattern (float32)."""
    k = int(torch.randint(-20, 21, (1,), generator=g))
    sign = torch.where(torch.rand(size, generator=g) < 0.5, -1.0, 1.0)
    if theme == 0:
        return torch.randn(size, generator=g) * 10.0 ** float(torch.empty(1).uniform_(-6, 6, generator=g))
    if theme == 1:
        return torch.zeros(size)
    if theme == 2:
        return torch.where(torch.rand(size, generator=g) < 0.7, -0.0, 0.0)
    if theme in (3, 4):  # block maximum elem_max * 2^k exactly; theme 4: the rest on rounding ties
        if theme == 3:
            b = torch.randn(size, generator=g) * elem_max / 4
        elif elem_max == 448.0:
            mids = _e4m3_midpoints()
            b = mids[torch.randint(0, mids.numel(), (size,), generator=g)]
        else:
            th = torch.tensor(nx.E2M1_THRESHOLDS)
            b = th[torch.randint(0, th.numel(), (size,), generator=g)]
        b = b * sign
        b[int(torch.randint(0, size, (1,), generator=g))] = -elem_max if k % 2 else elem_max
        return b * 2.0**k
    if theme == 5:  # one huge outlier among small values
        b = torch.randn(size, generator=g) * 1e-3
        b[0] = 3e38 if k % 2 else -1e30
        return b
    if theme == 6:  # tiny values, fp32 subnormals included
        return torch.randn(size, generator=g) * (1e-40 if k % 2 else 1e-30)
    if theme == 7:  # amax one float32 ulp above elem_max * 2^k
        b = torch.randn(size, generator=g) * elem_max / 8 * 2.0**k
        top = torch.tensor([elem_max * 2.0**k], dtype=torch.float32).view(torch.int32) + 1
        b[1] = top.view(torch.float32)[0]
        return b
    # theme 8: float32 values on bf16 rounding ties (half a bf16 ulp above a bf16 value)
    v = torch.randn(size, generator=g).to(torch.bfloat16).float()
    return (v.view(torch.int32) | 0x8000).view(torch.float32) * 2.0**k


def rows(n: int, width: int, block: int, elem_max: float, dtype, seed: int) -> torch.Tensor:
    """``[n, width]`` rows: half random at many magnitudes, half adversarial blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g) * torch.exp(torch.randn(n, 1, generator=g) * 4)
    if block:
        nblocks = width // block
        for i in range(n // 2, n):
            for b in range(nblocks):
                x[i, b * block:(b + 1) * block] = _block_theme((i * nblocks + b) % 9, block, elem_max, g)
    x = x.to(dtype)
    finite_max = torch.finfo(dtype).max
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x)).clamp(-finite_max, finite_max)


def padded(t: torch.Tensor) -> torch.Tensor:
    """The same rows as a view with a padded row stride (offset inside a wider tensor)."""
    wide = torch.zeros(t.shape[0], t.shape[1] + 24, dtype=t.dtype, device=t.device)
    wide[:, 5:5 + t.shape[1]] = t
    return wide[:, 5:5 + t.shape[1]]


def encode_input(name: str, n: int, dtype, seed: int, device=DEV, layout=None):
    """(x, kwargs) for ``encode`` of LAYOUTS[name] (or of ``layout``, same format)."""
    base, block, elem_max = LAYOUTS[name]
    layout = layout or base
    if layout.name == "compressor_state":
        w = layout.width
        g = torch.Generator().manual_seed(seed)
        kv = rows(n, w, 0, 0.0, dtype, seed)
        score = rows(n, w, 0, 0.0, dtype, seed + 1)
        kwargs = dict(positions=torch.randint(-9, 1000, (n,), generator=g).to(device),
                      ape=(torch.randn(layout.ratio, w, generator=g) * 0.01).to(dtype).to(device))
        return (padded(kv.to(device)), padded(score.to(device))), kwargs
    if layout.name == "compressor_state_v41":  # (kv, score) rows, no positions: V4.1 keeps no ape
        kv, score = (rows(n, layout.width, 0, 0.0, dtype, seed + i) for i in (0, 1))
        return (padded(kv.to(device)), padded(score.to(device))), {}
    return padded(rows(n, layout.head_dim, block, elem_max, dtype, seed).to(device)), {}


def arena_cache(layout, pages: int, pad: int, device=DEV, fill: int | None = SENTINEL):
    """(arena, cache): an arena filled with the sentinel byte (random bytes for None) and a
    cache viewing it at offset 7 with page stride ``page width + pad`` (in cache elements), as
    engines that share one arena allocate."""
    page = layout.allocate(1)
    page_elems = page[0].numel()
    stride = page_elems + pad
    word = page.element_size()
    total = (max(pages - 1, 0) * stride + page_elems + 64) * word
    if fill is None:
        raw = torch.randint(0, 256, (total,), generator=torch.Generator().manual_seed(pages), dtype=torch.uint8)
    else:
        raw = torch.full((total,), fill, dtype=torch.uint8)
    arena = raw.to(device).view(layout.container_dtype)
    cache = arena.as_strided(layout.cache_shape(pages), (stride, *page.stride()[1:]), 7)
    return arena, cache


def encode_slots(n: int, capacity: int, seed: int, device=DEV) -> torch.Tensor:
    """Distinct slots with -1 holes and a few beyond the capacity (skipped by every backend)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randperm(capacity, generator=g)[:n]
    if s.numel() < n:
        s = torch.cat([s, torch.full((n - s.numel(),), -1)])
    s[torch.rand(n, generator=g) < 0.2] = -1
    s[torch.rand(n, generator=g) < 0.05] = capacity + 3
    return s.to(torch.int32 if seed % 2 else torch.int64).to(device)


def read_slots(n: int, capacity: int, seed: int, device=DEV) -> torch.Tensor:
    """Any slots: repeats, -1, beyond capacity; a non-contiguous view."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-1, capacity + 2, (2 * n,), generator=g)
    return s.to(device)[::2]


def bits(t) -> torch.Tensor:
    """A tensor (or a tuple of them, concatenated) as its raw bytes."""
    if isinstance(t, tuple):
        t = torch.cat([u.contiguous() for u in t], dim=1)
    return t.contiguous().view(torch.uint8)


def assert_same_values(a, b):
    """Bitwise equal, except that NaN may have any payload (both must be NaN)."""
    if isinstance(a, tuple):
        a, b = (torch.cat([u.contiguous() for u in t], dim=1) for t in (a, b))
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.is_floating_point():
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        assert torch.equal(nan_a, nan_b)
        a, b = a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0)
    assert torch.equal(bits(a), bits(b))


def kernel(layout):
    return kk.IMPLEMENTATIONS[layout.name]


# ----------------------------------------------------------------------------- registration


def test_import_kvformats_does_not_import_triton():
    code = "import sys, kvformats; assert 'triton' not in sys.modules and 'kvformats_kernels' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("fmt", kvf.list_formats())
@pytest.mark.parametrize("op", ["encode", "decode", "gather"])
def test_triton_backend_registered(fmt, op):
    require(fmt, "kernels", op=op)
    fn = registry.resolve(fmt, op, "triton", torch.device("cuda"))
    assert fn is getattr(kk.IMPLEMENTATIONS[fmt], op)


def test_every_shipped_format_has_triton_kernels():
    """The kernel skips above are for formats added outside the package, never a shipped one."""
    from kvformats.formats import FORMATS

    missing = [(cls.name, op) for cls in FORMATS for op in ("encode", "decode", "gather")
               if not registry.has_backend(cls.name, op, "triton")]
    assert not missing


# ----------------------------------------------------------------------------- element helpers

HELPERS = ("bf16_rne_bits", "e4m3_bits", "e4m3_value", "pow2_bits", "ue8m0_value", "ceil_log2",
           "e2m1_code", "e2m1_value", "block_exponent")


@triton.jit
def _probe_kernel(x_ptr, out_ptr, n, OP: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr,
                  FLOOR_ON_SCALE: tl.constexpr, E_MIN: tl.constexpr, E_MAX: tl.constexpr,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0)
    if OP == 0:
        r = nj.bf16_rne_bits(x)
    elif OP == 1:
        r = nj.e4m3_bits(x)
    elif OP == 2:
        r = nj.f32_bits(nj.e4m3_value(x))
    elif OP == 3:
        r = nj.pow2_bits(x)
    elif OP == 4:
        r = nj.f32_bits(nj.ue8m0_value(x, True))
    elif OP == 5:
        r = nj.ceil_log2(x)
    elif OP == 6:
        r = nj.e2m1_code(x)
    elif OP == 7:
        r = nj.f32_bits(nj.e2m1_value(x))
    else:
        r = nj.block_exponent(x, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
    tl.store(out_ptr + offs, r.to(tl.int32), mask=m)


def probe(name: str, x: torch.Tensor, rule=None, block: int = 1 << 14) -> torch.Tensor:
    """int32 results of helper ``name`` on the 1-D tensor ``x`` (float32 or int32); float
    results come back as bit patterns. ``rule``: the ScaleRule of block_exponent (x = amax)."""
    out = torch.empty(x.shape, dtype=torch.int32, device=x.device)
    consts = rule_constants(rule) if rule is not None else dict(
        FLOOR=0.0, ELEM_MAX=1.0, FLOOR_ON_SCALE=False, E_MIN=0, E_MAX=0)
    _probe_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), OP=HELPERS.index(name), **consts, BLOCK=block)
    return out


def _helper_cases(name: str, n_random: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, expected int32) for helper ``name``: every bf16 pattern, n_random random float32
    patterns, and the float32 neighbourhoods where the helper changes its answer."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    rand = torch.randint(-(1 << 31), (1 << 31) - 1, (n_random,), generator=g, dtype=torch.int64)
    rand = rand.to(torch.int32).view(torch.float32)
    near = torch.randint(100 << 23, 137 << 23, (n_random,), generator=g, dtype=torch.int64).to(torch.int32)
    near = (near | (torch.randint(0, 2, (n_random,), generator=g, dtype=torch.int32) << 31)).view(torch.float32)
    floats = torch.cat([every_bf16, rand, near])
    floats = floats[~torch.isnan(floats)]
    # float32 patterns j = 0..63 above every power of two (the round-down limits of ceil_log2)
    fields = (torch.arange(256, dtype=torch.int32)[:, None] << 23) | torch.arange(64, dtype=torch.int32)[None, :]
    edges = fields.flatten().view(torch.float32)
    if name == "bf16_rne_bits":
        x = floats
        want = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    elif name == "e4m3_bits":
        x = torch.cat([floats, _e4m3_midpoints(), -_e4m3_midpoints(), torch.tensor([464.0, -500.0, 447.9])])
        want = nx.e4m3_encode(x).to(torch.int32)
    elif name == "e4m3_value":
        x = torch.arange(256, dtype=torch.int32)
        want = nx.e4m3_decode(x.to(torch.uint8)).view(torch.int32)
    elif name == "pow2_bits":
        x = torch.arange(-300, 300, dtype=torch.int32)
        want = nx.pow2(x).view(torch.int32)
    elif name == "ue8m0_value":
        x = torch.arange(256, dtype=torch.int32)
        want = nx.ue8m0_decode(x.to(torch.uint8)).view(torch.int32)
    elif name == "ceil_log2":
        x = torch.cat([floats.abs(), edges, torch.tensor([0.0, float("inf")])])
        want = nx.ceil_log2(x)
    elif name == "e2m1_code":
        th = torch.tensor(nx.E2M1_THRESHOLDS + nx.E2M1_VALUES)
        x = torch.cat([floats, th, -th, torch.nextafter(th, torch.zeros(()))])
        want = nx.e2m1_encode(x).to(torch.int32)
    elif name == "e2m1_value":
        x = torch.arange(16, dtype=torch.int32)
        want = nx.e2m1_decode(x.to(torch.uint8)).view(torch.int32)
    return x.to(device), want.to(device)


@pytest.mark.parametrize("name", ["bf16_rne_bits", "e4m3_bits", "e4m3_value", "pow2_bits", "ue8m0_value",
                                  "ceil_log2", "e2m1_code", "e2m1_value"])
def test_helper_matches_numerics(name):
    x, want = _helper_cases(name, 1 << 16, DEV)
    got = probe(name, x)
    if name in ("e4m3_value", "ue8m0_value"):  # NaN bytes: any NaN payload
        nan = torch.isnan(want.view(torch.float32))
        assert torch.isnan(got.view(torch.float32))[nan].all()
        got, want = got[~nan], want[~nan]
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"{name}: {bad.numel()} mismatches, first input bits " \
                             f"{hex(int(x.view(torch.int32)[bad[0, 0]]))}: got {int(got[bad[0, 0]])}, want {int(want[bad[0, 0]])}"


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_indexer", "mxfp4_indexer", "fp8_ds_mla_v41",
                                 "fp8_ds_mla_v41_interleaved"])
def test_block_exponent_matches_scale_rule(fmt):
    rule = LAYOUTS[fmt][0].scale_rule
    g = torch.Generator().manual_seed(1)
    amax = torch.randint(0, 0x7F800000, (1 << 16,), generator=g, dtype=torch.int32).view(torch.float32)
    ulp = torch.arange(-70, 70, dtype=torch.int32)
    top = (torch.tensor([rule.element_max * 2.0**k for k in range(-40, 40)]).view(torch.int32)[:, None] + ulp)
    amax = torch.cat([amax, top.flatten().view(torch.float32), torch.tensor([0.0, 1e-4, 1e-10, 4.48e-8])])
    got = probe("block_exponent", amax.to(DEV), rule=rule)
    assert torch.equal(got.cpu(), rule.exponents(amax[:, None]))


@triton.jit
def _short_exponent_kernel(x_ptr, out_ptr, n, E_FLOOR: tl.constexpr, EM_CARRY: tl.constexpr,
                           EM_FIELD: tl.constexpr, E_MAX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, nj.block_exponent_short(x, E_FLOOR, EM_CARRY, EM_FIELD, E_MAX), mask=offs < n)


SHORT_RULES = [LAYOUTS["fp8_ds_mla"][0].scale_rule,  # element max 448, floor 1e-4 on the maximum
               LAYOUTS["fp8_indexer"][0].scale_rule,  # 448, floor 1e-10 on the scale
               LAYOUTS["mxfp4_indexer"][0].scale_rule,  # 6, floor 1e-4 on the maximum (also the query prep's)
               nx.ScaleRule(element_max=448.0, floor=1e-10, floor_on="absmax", exponent_max=127),
               nx.ScaleRule(element_max=6.0, floor=2.0 ** -100, floor_on="scale"),
               nx.ScaleRule(element_max=1.0, floor=2.0 ** -126, floor_on="scale", exponent_min=-20)]


@pytest.mark.parametrize("rule", SHORT_RULES, ids=["fp8_ds_mla", "fp8_indexer", "mxfp4", "e4m3", "on-scale",
                                               "unit"])
def test_block_exponent_short_equals_the_rule_on_every_bf16_value(rule):
    """``numerics_jit.block_exponent_short`` (the encoders' and the MXFP4 query prep's exponent of
    a bf16 block maximum) against the rule itself on every non-negative bf16 pattern (Inf and NaN
    included)."""
    c = cm.short_exponent(rule)
    assert c["SHORT_E"]
    amax = (torch.arange(0x8000, dtype=torch.int32) << 16).view(torch.float32)  # 0 .. Inf, NaN
    out = torch.empty(amax.shape, dtype=torch.int32)
    amax, out = amax.to(DEV), out.to(DEV)
    _short_exponent_kernel[(triton.cdiv(amax.numel(), 4096),)](
        amax, out, amax.numel(), c["E_FLOOR"], c["EM_CARRY"], c["EM_FIELD"], rule.exponent_max, BLOCK=4096)
    want = rule.exponents(amax.cpu()[:, None])
    bad = (out.cpu() != want).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} differ; first amax {amax[bad[0, 0]].item()!r}"


@pytest.mark.parametrize("rule", [nx.ScaleRule(element_max=6.1, floor=1e-4, floor_on="absmax"),  # 24-bit max
                                  nx.ScaleRule(element_max=6.0, floor=0.0, floor_on="absmax"),  # subnormal q
                                  nx.ScaleRule(element_max=6.0, floor=2.0 ** -126, floor_on="absmax"),
                                  nx.ScaleRule(element_max=0.5, floor=1e-4, floor_on="absmax"),
                                  nx.ScaleRule(element_max=6.0, floor=1e-4, floor_on="absmax", power_of_two=False),
                                  nx.ScaleRule(element_max=6.0, floor=2.0 ** -127, floor_on="absmax",
                                               exponent_mode="floor_minus_emax", element_emax=2)])
def test_short_exponent_refuses_rules_it_does_not_cover(rule):
    assert cm.short_exponent(rule)["SHORT_E"] is False


# ----------------------------------------------------------------------------- codecs


def _encode_both(name, dtype, pad, n, seed):
    layout = LAYOUTS[name][0]
    pages = max(2, (n + layout.page_size - 1) // layout.page_size + 1)
    x, kwargs = encode_input(name, n, dtype, seed)
    slots = encode_slots(n, pages * layout.page_size, seed)
    (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, pad), arena_cache(layout, pages, pad)
    ops.encode_reference(layout, x, ref, slots, **kwargs)
    kernel(layout).encode(layout, x, tri, slots, **kwargs)
    return layout, arena_ref, arena_tri, ref, tri


@pytest.fixture(params=["few", "small", "large"])
def launch_config(request, launch_settings):
    """Each test of this fixture runs with every launch configuration of its kernels: the
    overrides of calls of very few rows (``FEW`` on top of ``SMALL``, what n = 24 picks), those
    of calls of few rows (``SMALL`` alone) and the configuration of large calls."""
    if request.param != "few":
        launch_settings("bounds", "few_rows", 0)
    if request.param == "large":
        launch_settings("bounds", "small_rows", 0)
    return request.param


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pad", [0, 37])
def test_encode_matches_reference(name, dtype, pad, launch_config):
    n = 24
    layout, arena_ref, arena_tri, _, _ = _encode_both(name, dtype, pad, n, seed=n + pad)
    assert torch.equal(bits(arena_tri), bits(arena_ref)), "bytes differ (or a write strayed outside its rows)"


@pytest.mark.parametrize("lane", [0, 1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("profile", ["tokenspeed", "vllm", "ocp"])
def test_mxfp4_encode_layouts_and_e2m1_paths(lane, dtype, profile, launch_settings):
    """Both layouts of the MXFP4 encoder, and in the lane layout both e2m1 paths: programs of
    finite bf16 rows take the short rounding, a program holding a NaN or an Inf the full one
    (as do float32 input and the RNE / signed-zero profiles); the bytes are the reference's."""
    key = ("indexer", "encode_mxfp4")
    launch_settings("config", key, dict(tuning.CONFIG[key], block_m=8, num_warps=1, lane=lane))
    launch_settings("bounds", "small_rows", 0)  # CONFIG's programs of eight rows, whatever the call's size
    layout = kvf.get_format("mxfp4_indexer", page_size=4, profile=profile)
    n = 24  # three programs of eight rows (32 blocks: one per lane)
    x = rows(n, layout.head_dim, 32, 6.0, torch.float32, seed=5)
    x[1, 3] = float("nan")  # program 0
    x[9, 100] = float("-inf")  # program 1
    x[14, :32] = torch.tensor([6.0 * 2**-3, 7.0 * 2**-3] * 16)  # program 1: block max on a code edge
    # program 2: finite bf16 rows, the short e2m1 rounding
    x = padded(x.to(dtype).to(DEV))
    pages = n // layout.page_size + 2
    slots = encode_slots(n, pages * layout.page_size, seed=6)
    (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, 5), arena_cache(layout, pages, 5)
    ops.encode_reference(layout, x, ref, slots)
    kernel(layout).encode(layout, x, tri, slots)
    assert torch.equal(bits(arena_tri), bits(arena_ref))


FP4_V41 = [(f, p) for f in ("fp4_ds_mla_v41", "fp4_ds_mla_v41_interleaved") for p in kvf.supported_profiles()[f]]


@pytest.mark.parametrize("n", [1, 5, 24, 130])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt,profile", FP4_V41, ids=[f"{f}-{p}" for f, p in FP4_V41])
def test_fp4_v41_lane_paths_match_reference(n, dtype, fmt, profile):
    """fp4_ds_mla_v41's one-(row, block)-pair-per-lane encode and decode (both layouts, every
    profile), which take bf16 input rows on 16 bytes and word-aligned caches (the other tests'
    padded rows and offset arenas, and float32 rows here, take the per-row kernels): the
    reference's bytes and values, on the adversarial blocks, with a NaN, an Inf, a zero block
    and a subnormal-scale block in the first row."""
    from kvformats_kernels import v41

    if n == 130 and profile != kvf.get_format(fmt).profile:
        pytest.skip("the long call runs in the default profile; the others take the short ones")
    layout = kvf.get_format(fmt, page_size=4, profile=profile)
    assert v41._encode_config(layout, True, True)[1] and v41._lanes(layout, v41.CONFIG["decode"])
    x = rows(n, layout.head_dim, 16, 6.0, torch.float32, seed=n)
    x[0, 3], x[0, 20], x[0, 32:48], x[0, 48:64] = float("nan"), float("-inf"), 0.0, 0.003  # 0.003 / 6 < 2^-9
    x[0, 64:80] = torch.linspace(-0.05, 0.05, 16)  # a subnormal e4m3 scale (amax / 6 < 2^-6)
    x = x.to(dtype).to(DEV)  # contiguous: rows on 16 bytes
    pages = n // layout.page_size + 2
    slots = encode_slots(n, pages * layout.page_size, seed=n)
    slots[0] = min(set(range(pages * layout.page_size)) - set(slots.tolist()))  # row 0 lands, in a slot of its own
    ref, tri = layout.allocate(pages).fill_(SENTINEL).to(DEV), layout.allocate(pages).fill_(SENTINEL).to(DEV)
    ops.encode_reference(layout, x, ref, slots)
    v41.encode(layout, x, tri, slots)
    if dtype == torch.float32 and layout.numerics.e2m1_nan_sign:
        # the nibble of the NaN (element 3: byte 1's high nibble) carries its sign after the
        # rounding to bf16, which float32 input leaves unspecified (spec/nan-policy.md §1.3)
        at = layout.slot_offsets(int(slots[0]))["values"] + 1
        ref.view(-1)[at] &= 0x7F
        tri.view(-1)[at] &= 0x7F
    assert torch.equal(bits(tri), bits(ref))
    want, got = ops.decode_reference(layout, ref, slots), v41.decode(layout, ref, slots)
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("n", [1, 2, 5, 40])
def test_mxfp4_encode_narrow_rows_and_ties(head_dim, n, launch_config):
    """Rows of one, two or four blocks, few or many of them, on e2m1 rounding ties: the cases
    the GPU fuzz found wrong when the one-block-per-lane layout ran programs with fewer blocks
    than lanes (a head dim of 32: codes scaled by the maximum of part of a block, zero rows)."""
    layout = kvf.get_format("mxfp4_indexer", head_dim=head_dim, page_size=2)
    g = torch.Generator().manual_seed(head_dim + n)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x = ties[torch.randint(0, 8, (n, head_dim), generator=g)] * torch.where(torch.rand(n, head_dim, generator=g) < 0.5,
                                                                              -1.0, 1.0)
    x[::2] *= 1e-3  # small rows beside large ones
    x = x.to(torch.bfloat16).to(DEV)
    pages = n // 2 + 2
    slots = encode_slots(n, pages * 2, seed=n)
    (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, 0), arena_cache(layout, pages, 0)
    ops.encode_reference(layout, x, ref, slots)
    kernel(layout).encode(layout, x, tri, slots)
    assert torch.equal(bits(arena_tri), bits(arena_ref))


def test_mxfp4_lane_layout_needs_a_block_per_lane():
    from kvformats_kernels import indexer

    wide, narrow = kvf.get_format("mxfp4_indexer"), kvf.get_format("mxfp4_indexer", head_dim=32)
    assert indexer._whole_blocks_per_lane(wide, {"block_m": 8, "num_warps": 1, "lane": 1})
    assert not indexer._whole_blocks_per_lane(wide, {"block_m": 4, "num_warps": 1, "lane": 1})
    assert not indexer._whole_blocks_per_lane(narrow, {"block_m": 8, "num_warps": 1, "lane": 1})
    assert not indexer._whole_blocks_per_lane(wide, {"block_m": 32, "num_warps": 4, "lane": 0})


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("pad", [0, 11])
def test_decode_and_gather_match_reference(name, pad, launch_config):
    layout, _, _, cache, _ = _encode_both(name, torch.float32, pad, 20, seed=3)
    slots = read_slots(33, cache.shape[0] * layout.page_size, seed=4)
    assert torch.equal(kernel(layout).gather(layout, cache, slots), ops.gather_reference(layout, cache, slots))
    assert_same_values(kernel(layout).decode(layout, cache, slots), ops.decode_reference(layout, cache, slots))


@pytest.mark.parametrize("name", ["compressor_state", "compressor_state-128"])
def test_state_decode_outputs_are_separate_tensors(name):
    """The kernel writes kv and score apart (two dense tensors, no shared storage): the torch op
    returns them without copies, and the values are the reference's, holes zero."""
    layout, _, _, cache, _ = _encode_both(name, torch.float32, 0, 20, seed=5)
    capacity = cache.shape[0] * layout.page_size
    slots = read_slots(17, capacity, seed=8).clone()
    slots[0], slots[1] = -1, capacity  # a hole and an out-of-range slot: zero rows in both outputs
    kv, score = kernel(layout).decode(layout, cache, slots)
    assert kv.is_contiguous() and score.is_contiguous() and kv._base is None and score._base is None
    assert kv.untyped_storage().data_ptr() != score.untyped_storage().data_ptr()
    want_kv, want_score = ops.decode_reference(layout, cache, slots)
    assert torch.equal(bits(kv), bits(want_kv)) and torch.equal(bits(score), bits(want_score))
    assert not bits(kv[:2]).any() and not bits(score[:2]).any()


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's inf products
def test_decode_arbitrary_bytes(name):
    """Every byte pattern decodes like the reference (NaN payloads aside)."""
    layout = LAYOUTS[name][0]
    _, cache = arena_cache(layout, 3, 5, fill=None)
    slots = read_slots(16, 3 * layout.page_size, seed=6)
    assert_same_values(kernel(layout).decode(layout, cache, slots), ops.decode_reference(layout, cache, slots))
    assert torch.equal(kernel(layout).gather(layout, cache, slots), ops.gather_reference(layout, cache, slots))


def _reference_decode_shapes(layout):
    """(shape, dtype) of each tensor decode returns for zero rows, read off one reference row."""
    one = ops.decode_reference(layout, layout.allocate(1), torch.zeros(1, dtype=torch.int64))
    return [((0, *t.shape[1:]), t.dtype) for t in (one if isinstance(one, tuple) else (one,))]


@pytest.mark.parametrize("name", ["fp8_ds_mla", "mxfp4_indexer", "compressor_state"])
def test_empty_inputs(name):
    layout = LAYOUTS[name][0]
    x, kwargs = encode_input(name, 0, torch.bfloat16, 0)
    cache = layout.allocate(2, device=DEV)
    slots = torch.empty(0, dtype=torch.int64, device=DEV)
    kernel(layout).encode(layout, x, cache, slots, **kwargs)
    assert not cache.view(torch.uint8).any()
    dec = kernel(layout).decode(layout, cache, slots)
    for got, want in zip(dec if isinstance(dec, tuple) else (dec,), _reference_decode_shapes(layout)):
        assert (got.shape, got.dtype) == want
    assert kernel(layout).gather(layout, cache, slots).shape == (0, layout.row_bytes)
    empty = layout.allocate(0, device=DEV)  # zero pages: every slot is out of range
    x, kwargs = encode_input(name, 4, torch.bfloat16, 0)
    kernel(layout).encode(layout, x, empty, torch.arange(4, device=DEV), **kwargs)
    assert not bits(kernel(layout).gather(layout, empty, torch.arange(4, device=DEV))).any()


# ----------------------------------------------------------------------------- GPU only


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_indexer", "mxfp4_indexer", "compressor_state",
                                 "fp8_ds_mla_v41", "fp4_ds_mla_v41", "fp8_ds_mla_v41_interleaved",
                                 "fp4_ds_mla_v41_interleaved"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_public_api_matches_reference(fmt, dtype):
    layout = kvf.get_format(fmt)
    n, pages = 6000, 6000 // layout.page_size + 50
    x, kwargs = encode_input(fmt, n, dtype, seed=11, layout=layout)
    slots = encode_slots(n, pages * layout.page_size, seed=12)
    slots[slots >= pages * layout.page_size] = -1  # the public API rejects them (check=True)
    (a_ref, ref), (a_tri, tri) = arena_cache(layout, pages, 576), arena_cache(layout, pages, 576)
    layout.encode(x, ref, slots, backend="reference", **kwargs)
    layout.encode(x, tri, slots, backend="triton", **kwargs)
    assert torch.equal(bits(a_tri), bits(a_ref))
    rs = read_slots(5000, pages * layout.page_size, seed=13)
    rs[rs >= pages * layout.page_size] = -1
    assert torch.equal(layout.gather(ref, rs, backend="triton"), layout.gather(ref, rs, backend="reference"))
    assert_same_values(layout.decode(ref, rs, backend="triton"), layout.decode(ref, rs, backend="reference"))
    # check=False: slots beyond the capacity are skipped, never written
    wild = slots.clone()
    wild[::7] = pages * layout.page_size + 1000
    layout.encode(x, tri, wild, backend="triton", check=False, **kwargs)
    layout.encode(x, ref, wild.where(wild < pages * layout.page_size, -1), backend="reference", **kwargs)
    assert torch.equal(bits(a_tri), bits(a_ref))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_indexer", "mxfp4_indexer", "compressor_state",
                                 "fp8_ds_mla_v41", "fp4_ds_mla_v41", "fp8_ds_mla_v41_interleaved",
                                 "fp4_ds_mla_v41_interleaved"])
def test_gpu_cuda_graph_capture_and_replay(fmt):
    layout = kvf.get_format(fmt)
    n, pages = 64, 40
    cap = pages * layout.page_size
    x, kwargs = encode_input(fmt, n, torch.bfloat16, seed=21, layout=layout)
    slots = encode_slots(n, cap, seed=22).to(torch.int64)
    slots[slots >= cap] = -1
    slots[-8:] = -1  # CUDA-graph padding
    _, cache = arena_cache(layout, pages, 0)
    layout.encode(x, cache, slots, backend="triton", **kwargs)  # warm-up: compile outside capture
    layout.decode(cache, slots, backend="triton")
    layout.gather(cache, slots, backend="triton")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layout.encode(x, cache, slots, backend="triton", **kwargs)
        dec = layout.decode(cache, slots, backend="triton")
        gat = layout.gather(cache, slots, backend="triton")
    for seed in (23, 24):
        x2, kw2 = encode_input(fmt, n, torch.bfloat16, seed=seed, layout=layout)
        s2 = encode_slots(n, cap, seed=seed + 100).to(torch.int64)
        s2[s2 >= cap] = -1
        s2[-8:] = -1
        if isinstance(x, tuple):
            for dst, src in zip(x, x2):
                dst.copy_(src)
            for k in kwargs:
                kwargs[k].copy_(kw2[k])
        else:
            x.copy_(x2)
        slots.copy_(s2)
        _, ref = arena_cache(layout, pages, 0)
        ref.copy_(cache)
        ops.encode_reference(layout, x, ref, slots, **kwargs)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(cache), bits(ref))
        assert torch.equal(gat, ops.gather_reference(layout, ref, slots))
        assert_same_values(dec, ops.decode_reference(layout, ref, slots))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bf16_rne_bits", "e4m3_bits", "ceil_log2", "e2m1_code"])
def test_gpu_helpers_exhaustive(name):
    """Every bf16 pattern and 8 M random float32 patterns, against torch on the same GPU."""
    x, want = _helper_cases(name, 1 << 22, DEV)
    assert torch.equal(probe(name, x), want)
    if name in ("bf16_rne_bits", "e4m3_bits"):  # torch's own GPU casts as the oracle, too
        cast = torch.bfloat16 if name == "bf16_rne_bits" else torch.float8_e4m3fn
        y = x if name == "bf16_rne_bits" else x.clamp(-448, 448)
        oracle = y.to(cast).view(torch.int16 if cast == torch.bfloat16 else torch.uint8).to(torch.int32)
        assert torch.equal(probe(name, x), oracle & (0xFFFF if cast == torch.bfloat16 else 0xFF))
