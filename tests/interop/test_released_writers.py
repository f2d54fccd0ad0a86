"""The released V4.1 cache writers of tokenspeed-kernel 0.1.4 and vLLM 0.33.0 (and SGLang 0.5.23's
torch reference of its own), run on CPU, write the bytes of a kvformats profile: byte for byte,
whole caches (every byte a writer leaves alone keeps the sentinel), on six kinds of finite bf16
input (tests/harness/released.py
``input_rows``: N(0, 1), N(0, 0.02), signed zeros, tiny values, 32-tiles spanning 1e-4..1e2,
exact e4m3 / e2m1 / e4m3-scale ties) at random slots with -1 (skipped) among them.

Writers (``tests.harness.released.WRITERS``) and the profile each one writes:

* tokenspeed-kernel 0.1.4 ``tokenspeed_kernel/ops/attention/dsv41/triton.py``: ``cache_scatter``
  'swa' and ``triton_dsv41_swa_rope_scatter`` (RoPE, then quantize) -> ``fp8_ds_mla_v41``
  tokenspeed; 'global' -> ``fp4_ds_mla_v41`` tokenspeed; 'index' (68 B) -> ``mxfp4_indexer`` vllm;
* vllm 0.33.0 ``vllm/models/deepseek_v41/common/ops/cache_utils.py`` ``quantize_and_insert_k_cache``
  (``_quantize_and_insert_k_mxfp8_kernel``) and ``fused_compress_quant_cache.py``
  ``rope_quant_insert`` (``_rope_quant_insert_mxfp8_kernel``) -> ``fp8_ds_mla_v41_interleaved``
  vllm; ``rope_quant_insert`` (``_rope_quant_insert_nvfp4_kernel``) ->
  ``fp4_ds_mla_v41_interleaved`` vllm;
* sglang 0.5.23 ``sglang/test/kernels/deepseek_v4/dsv41_kv_quant_reference.py`` (the torch
  reference of its CUDA V4.1 writers, which cannot run here) -> ``fp8_ds_mla_v41`` /
  ``fp4_ds_mla_v41`` flashmla (whole pages).

How they run: the wheels are fetched with ``pip download --no-deps`` (cached per machine under
``~/.cache/kvformats-tests``; skipped only when the package index cannot be reached), only the
files named above (and vLLM's ``fused_indexer_q.py``) are extracted to a temporary folder and
imported with stub modules for their imports; their Triton kernels run under TRITON_INTERPRET=1
in a child process, with the Triton interpreter's float conversions replaced by the GPU's
(``gpu_numerics``: float32 -> float8e4nv as ``cvt.rn.satfinite.e4m3x2.f32``, round to nearest
even and saturating at +-448; float32 -> bfloat16 round to nearest even; exact widenings). The
stock interpreter rounds e4m3 ties away from zero, does not saturate and can drop a binade
(``test_interpreter_casts_depart_from_the_gpu``). vLLM's nvfp4 kernel packs e2m1 codes with PTX
inline assembly (``cvt.rn.satfinite.e2m1x2.f32``), which the interpreter cannot run: the harness
emulates that one instruction with its documented semantics (round to nearest, ties to even;
saturate to +-6; the sign of zero kept, so -0.0 and small negatives give code 0x8) - a shim,
not vLLM's code. tokenspeed's file is compiled by tokenspeed-triton (a Triton 3.8 fork) on a GPU;
here stock Triton's interpreter runs it.

vLLM's rope-insert kernels rotate every GPT-J pair of the row (the NoPE pairs with cos 1, sin 0
as their masked default); the harness gives the 32 RoPE pairs cos 1, sin 0 too, so the kernel
quantizes ``e * 1 - o * 0, o * 1 + e * 0`` in float32: the row itself except signed zeros
(``identity_rope``; ``test_identity_rope_changes_signed_zeros_only``). tokenspeed's
``swa_rope_scatter`` rotates dims 448.. only, the same way, and never writes page 0 (its null
page). Their expected bytes are kvformats' encoding of the rotated rows at the slots they write
(``Writer.quantized_rows``, ``Writer.written_slots``).

Departures, stated exactly rather than tolerated (``test_other_profiles_depart_where_their_rules_differ``,
``test_fp8_floor_departure_is_exactly_the_small_blocks``, ``test_index_writer_departs_on_float32_rows``):
tokenspeed's and vLLM's fp8 writers floor amax at 1e-4, not amax / 448 (FlashMLA, SGLang), so
every 32-block with amax <= 448 * 2^-14 gets another scale than the flashmla profile's;
tokenspeed's index writer takes ceil(log2) exactly from the bits, so on float32 rows (bf16 rows
cannot reach it) a block whose amax * (1/6) is a few ulps above 2^k gets 2^(k+1) where
``mxfp4_indexer`` profile vllm, which models a correctly rounded float32 log2, gives 2^k.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import kvformats as kvf
from kvformats.numerics.profiles import profile_table
from kvformats.spec.vectors import load_vector, tensor_from_spec
from tests.harness import released as rel

N_ROWS = 12

# writer -> (format, profile whose bytes it writes)
PROFILE_OF = {
    "tokenspeed-swa": ("fp8_ds_mla_v41", "tokenspeed"),
    "tokenspeed-swa-rope": ("fp8_ds_mla_v41", "tokenspeed"),
    "tokenspeed-global": ("fp4_ds_mla_v41", "tokenspeed"),
    "tokenspeed-index": ("mxfp4_indexer", "vllm"),
    "vllm-mxfp8": ("fp8_ds_mla_v41_interleaved", "vllm"),
    "vllm-rope-mxfp8": ("fp8_ds_mla_v41_interleaved", "vllm"),
    "vllm-rope-nvfp4": ("fp4_ds_mla_v41_interleaved", "vllm"),
    "sglang-ref-v41": ("fp8_ds_mla_v41", "flashmla"),
    "sglang-ref-v41-fp4": ("fp4_ds_mla_v41", "flashmla"),
}
assert set(PROFILE_OF) == set(rel.WRITERS)

_FP8_FLOOR = ("the writer floors amax at 1e-4 (scale >= 2^-22); FlashMLA's rule floors amax / 448 at 1e-4 "
              "(scale >= 2^-13): every 32-block with amax <= 448 * 2^-14 gets another scale byte")
_V4_INDEX = ("the V4 indexer rules: 1e-4 amax floor and ties toward the smaller magnitude (tokenspeed V4, "
             "DeepGEMM), or 2^(floor(log2 amax) - 2) (OCP); the V4.1 index writer rounds ties to the even code "
             "and floors amax at 6 * 2^-126")
# (writer, other profile) -> (input kinds on which the bytes differ, why); every other pair of a
# writer and a profile of its format gives the same bytes on all six kinds
DEPARTS = {
    ("tokenspeed-swa", "flashmla"): ({"zeros", "tiny", "ties"}, _FP8_FLOOR),
    ("tokenspeed-swa-rope", "flashmla"): ({"zeros", "tiny", "ties"}, _FP8_FLOOR),
    ("sglang-ref-v41", "tokenspeed"): ({"small", "zeros", "tiny", "ties"}, _FP8_FLOOR),
    ("vllm-mxfp8", "flashmla"): ({"zeros", "tiny", "ties"}, _FP8_FLOOR),
    ("vllm-rope-mxfp8", "flashmla"): ({"zeros", "tiny", "ties"}, _FP8_FLOOR),
    ("tokenspeed-index", "tokenspeed"): (set(rel.KINDS), _V4_INDEX),
    ("tokenspeed-index", "deepgemm-ref"): (set(rel.KINDS), _V4_INDEX),
    ("tokenspeed-index", "ocp"): (set(rel.KINDS), _V4_INDEX),
}


@pytest.fixture(scope="session")
def extracted(tmp_path_factory):
    root = tmp_path_factory.mktemp("released")
    folders = {}
    for release in (rel.TOKENSPEED_KERNEL, rel.VLLM, rel.SGLANG):
        try:
            rel.extract(release, root / release.package)
        except rel.IndexUnreachable as err:  # the only reason to skip
            pytest.skip(f"released writers not fetched: {err}")
        folders[release.package] = root / release.package
    return folders


CAPTURED = sorted((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "captured").glob("*/*_release_*.json"))


def _vector_job(path: Path) -> dict:
    """The job that reproduces a committed release capture: its rows, slots and sentinel cache."""
    vec = load_vector(path)
    cache = torch.full((vec["cache"]["num_pages"], vec["params"]["page_size"] * rel.WRITERS[
        vec["captured"]["harness_writer"]].row_bytes), vec["cache"]["sentinel"], dtype=torch.uint8)
    return dict(writer=vec["captured"]["harness_writer"], kind=f"vector:{vec['id']}",
                x=tensor_from_spec(vec["inputs"]["x"]), slots=tensor_from_spec(vec["slots"]), cache=cache,
                page_size=vec["params"]["page_size"])


@pytest.fixture(scope="session")
def runs(extracted, tmp_path_factory):
    """(writer, kind) -> (job, the cache the released writer wrote); one child process."""
    jobs = rel.make_jobs(n=N_ROWS) + [_index_float32_job()] + [_vector_job(p) for p in CAPTURED]
    caches = rel.run_writers(jobs, extracted, tmp_path_factory.mktemp("released-run"))
    return {(j["writer"], j["kind"]): (j, c) for j, c in zip(jobs, caches)}


def _layout(writer: str, profile: str | None = None, page_size: int = 64):
    fmt, default = PROFILE_OF[writer]
    extra = {"head_dim": 128} if rel.WRITERS[writer].dim == 128 else {}
    return kvf.get_format(fmt, profile=profile or default, page_size=page_size, **extra)


def _expected(writer: str, job: dict, profile: str | None = None) -> torch.Tensor:
    layout = _layout(writer, profile, job["page_size"])
    cache = job["cache"].clone()
    assert cache.shape == layout.allocate(cache.shape[0]).shape
    w = rel.WRITERS[writer]
    layout.encode(w.quantized_rows(job["x"]), cache, w.written_slots(job["slots"], job["page_size"]))
    return cache


def _first_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    diff = (got != want).nonzero()
    if diff.numel() == 0:
        return "none"
    p, b = diff[0].tolist()
    return (f"{diff.shape[0]} bytes differ, first at page {p} byte {b}: got {int(got[p, b]):#04x} "
            f"want {int(want[p, b]):#04x}")


@pytest.mark.parametrize("kind", rel.KINDS)
@pytest.mark.parametrize("writer", list(rel.WRITERS))
def test_released_writer_writes_its_profile(runs, writer, kind):
    job, got = runs[(writer, kind)]
    want = _expected(writer, job)
    assert torch.equal(got, want), f"{writer} on {kind}: {_first_difference(got, want)}"
    w = rel.WRITERS[writer]
    written = w.written_slots(job["slots"], job["page_size"]) >= 0
    assert 0 < int(written.sum()) <= job["slots"].numel()
    assert w.whole_pages or int(written.sum()) < job["slots"].numel()  # skipped rows too (slot -1, page 0)


@pytest.mark.parametrize("writer", list(rel.WRITERS))
def test_other_profiles_depart_where_their_rules_differ(runs, writer):
    fmt, own = PROFILE_OF[writer]
    for profile in profile_table(fmt).names:
        if profile == own:
            continue
        differ = {kind for kind in rel.KINDS
                  if not torch.equal(runs[(writer, kind)][1], _expected(writer, runs[(writer, kind)][0], profile))}
        want, why = DEPARTS.get((writer, profile), (set(), "same rule on finite input"))
        assert differ == want, f"{writer} vs {fmt} profile {profile} ({why}): differ on {sorted(differ)}"


def test_fp8_floor_departure_is_exactly_the_small_blocks(runs):
    """tokenspeed's 'swa' against profile flashmla: the scale bytes differ exactly on the 32-blocks
    with amax <= 448 * 2^-14, and only rows of those blocks differ."""
    job, got = runs[("tokenspeed-swa", "tiny")]
    layout = _layout("tokenspeed-swa", "flashmla")
    want = layout.gather(_expected("tokenspeed-swa", job, "flashmla"), job["slots"])
    rows = layout.gather(got, job["slots"])
    live = job["slots"] >= 0
    amax = job["x"].float().view(job["x"].shape[0], 16, 32).abs().amax(-1)
    scale = layout.row_span("scale")
    differ = rows[:, scale] != want[:, scale]
    assert torch.equal(differ[live], (amax <= 448 * 2.0**-14)[live])
    assert bool(differ[live].any())


# (k, n): a 32-block of float32 rows whose amax is n float32 ulps above 6 * 2^k
_BOUNDARY_BLOCKS = [(-30, 2), (-20, 0), (-20, 1), (-20, 3), (-10, 1), (-6, 1), (-1, 1), (0, 1),
                    (1, 1), (4, 1), (4, 2), (10, 1), (10, 5), (20, 1), (20, 8), (30, 1)]


def _index_float32_job() -> dict:
    """float32 rows for the 'index' writer (bf16 rows cannot hold these amax): four 32-blocks a
    row, block i with amax ``_BOUNDARY_BLOCKS[i]`` and smaller random values."""
    g = torch.Generator().manual_seed(11)
    blocks = []
    for k, n in _BOUNDARY_BLOCKS:
        top = torch.tensor(6.0 * 2.0**k, dtype=torch.float32)
        for _ in range(n):
            top = torch.nextafter(top, torch.tensor(float("inf")))
        b = (torch.rand(32, generator=g) * 2 - 1) * (3.0 * 2.0**k)
        b[(k + n) % 32] = -top if n % 2 else top
        blocks.append(b)
    x = torch.stack(blocks).view(-1, 128)
    return dict(writer="tokenspeed-index", kind="float32-boundary", x=x, slots=torch.arange(x.shape[0]),
                cache=torch.full((1, 64 * 68), rel.SENTINEL, dtype=torch.uint8), page_size=64)


def test_index_writer_departs_on_float32_rows(runs):
    """On float32 rows the 'index' writer takes ceil(log2(q)) exactly from the bits of
    q = amax * fl32(1/6) (any mantissa bit rounds up); profile vllm models a correctly rounded
    float32 log2 of amax / 6, which rounds onto k when q is within a few ulps above 2^k (more
    ulps the larger |k|). So a block a few ulps above 6 * 2^k gets scale 2^(k+1) from the writer
    and 2^k from the profile: exactly the blocks where the two models differ have a scale byte
    one higher, and nothing else differs in those rows' scales."""
    job, got = runs[("tokenspeed-index", "float32-boundary")]
    layout = _layout("tokenspeed-index")
    rows = layout.gather(got, job["slots"])
    ref = layout.gather(_expected("tokenspeed-index", job), job["slots"])
    scale = layout.row_span("scale")
    amax = job["x"].view(-1, 32).abs().amax(-1).numpy()
    q_writer = amax * np.float32(1 / 6)  # float32 product, as the kernel computes it
    mant, exp = np.frexp(q_writer.astype(np.float64))  # q = mant * 2^exp, mant in [0.5, 1)
    e_writer = np.where(mant == 0.5, exp - 1, exp)
    q_profile = amax / np.float32(6.0)
    e_profile = np.ceil(np.log2(q_profile.astype(np.float64)).astype(np.float32)).astype(np.int64)
    want = torch.from_numpy(e_writer - e_profile).view(-1, 4).to(torch.int32)
    delta = rows[:, scale].to(torch.int32) - ref[:, scale].to(torch.int32)
    assert torch.equal(delta, want), (delta, want)
    assert int((want == 1).sum()) >= 4 and int((want == 0).sum()) >= 4


def test_identity_rope_changes_signed_zeros_only():
    """The cos = 1, sin = 0 rotation vLLM's rope-insert kernels apply is the identity on every
    non-zero value (subnormals too); only zeros' signs can change (-0 - (-0) = +0)."""
    for kind in rel.KINDS:
        x = rel.input_rows(kind, N_ROWS)
        y = rel.identity_rope(x)
        same = x.view(torch.int16) == y.view(torch.int16)
        assert bool(same[x != 0].all()), kind
        if kind != "zeros":
            continue
        assert not bool(same.all())
        pairs = x.float().view(x.shape[0], -1, 2)
        neg = torch.signbit(pairs)
        flips_even = neg[..., 0] & ((pairs[..., 1] < 0) | (neg[..., 1] & (pairs[..., 1] == 0)))
        flips_odd = neg[..., 1] & ~neg[..., 0]
        assert torch.equal(~same.view(x.shape[0], -1, 2), torch.stack([flips_even, flips_odd], dim=-1))


def test_e2m1_instruction_emulation():
    """The stand-in for PTX ``cvt.rn.satfinite.e2m1x2.f32``: nearest e2m1 value, ties to the even
    code, saturating at 6, the sign kept on zero results."""
    x = np.array([0.0, -0.0, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.0, 7.0, 1e30, -0.1, -0.75, -5.0,
                  1e-40], dtype=np.float32)
    want = [0, 8, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 7, 8, 10, 14, 0]
    assert rel.e2m1_rn_satfinite(x).tolist() == want
    with pytest.raises(ValueError):
        rel.e2m1_rn_satfinite(np.array([np.nan], dtype=np.float32))


def test_interpreter_casts_depart_from_the_gpu(tmp_path):
    """Why the harness replaces the interpreter's conversions: stock triton's interpreter (3.9 here)
    rounds float32 -> float8e4nv ties away from zero, does not saturate and can drop a binade,
    truncates float32 -> bfloat16, flushes bf16 subnormals when widening and reads e4m3 0x7F as
    480; ``gpu_numerics`` gives the GPU instructions' results on every probe value."""
    probe = rel.run_probe(tmp_path)
    x, ref = probe["x"], probe["reference"]
    for name in ("e4m3", "bf16", "widen_bf16", "widen_e4m3"):
        got = probe["gpu"][name]
        same = (got == ref[name]) | (got.isnan() & ref[name].isnan()) if got.is_floating_point() else got == ref[name]
        assert bool(same.all()), name
    stock = probe["stock"]
    e4_mids = (x.abs() > 0) & (x.abs() <= 448) & (x.to(torch.float8_e4m3fn).float() != x)
    assert bool((stock["e4m3"] != ref["e4m3"])[e4_mids].any())       # ties / rounding
    assert bool((stock["e4m3"] != ref["e4m3"])[x == 500.0].all())  # no saturation
    assert bool((stock["bf16"] != ref["bf16"]).any())                 # truncation
    assert bool((stock["widen_bf16"] != ref["widen_bf16"]).any())     # subnormals flushed
    assert bool(stock["widen_e4m3"][ref["widen_e4m3"].isnan()].isfinite().all())  # 0x7F read as 480


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: p.stem)
def test_committed_release_captures_are_what_the_writers_write(runs, extracted, path):
    """spec/vectors/captured/*/*_release_*.json (tools/capture/from_*_release.py) name the pinned
    wheel and the file that ran by sha256, and the writers write those bytes today."""
    vec = load_vector(path)
    cap = vec["captured"]
    w = rel.WRITERS[cap["harness_writer"]]
    assert (cap["package"], cap["version"], cap["wheel"], cap["wheel_sha256"]) == (
        w.release.package, w.release.version, w.release.filename, w.release.sha256)
    assert cap["file"] == w.file and cap["sha256"] == rel.sha256_file(extracted[w.release.package] / w.file)
    _, got = runs[(w.name, f"vector:{vec['id']}")]
    (want,) = vec["expected"]["cache_bytes"]
    assert want["offset"] == 0 and bytes(got.reshape(-1).tolist()).hex() == want["hex"]
