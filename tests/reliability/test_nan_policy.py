"""spec/nan-policy.md: the bytes encode writes for NaN, ±Inf and overflowing input, and the values
decode returns for corrupt bytes, on the reference and on every Triton launcher (interpreter on
CPU, compiled on a GPU): the same bytes on both."""

from __future__ import annotations

import attrs
import pytest
import torch

import kvformats as kvf
from kvformats.codec.rows import write_rows
from kvformats.numerics import codes as nx
from tests.harness.reliability_harness import DEVICE, Arena, backend_has, run_op, same_values, triton_available

NAN, INF = float("nan"), float("inf")
NEG_NAN = -float("nan")  # sign bit set
LAYOUTS = {
    "fp8_ds_mla": kvf.Fp8DsMla(head_dim=192, rope_dim=64, page_size=2),  # 2 NoPE blocks of 64
    "fp8_indexer": kvf.Fp8Indexer(head_dim=256, page_size=2),  # 2 blocks of 128
    "mxfp4_indexer": kvf.Mxfp4Indexer(head_dim=64, page_size=2),  # 2 blocks of 32
    "compressor_state": kvf.CompressorState(head_dim=2, ratio=4, page_size=2),
}
QUANT = ("fp8_ds_mla", "fp8_indexer", "mxfp4_indexer")
BLOCK = {"fp8_ds_mla": 64, "fp8_indexer": 128, "mxfp4_indexer": 32}
CLAMP_E = {"fp8_ds_mla": 128, "fp8_indexer": 128, "mxfp4_indexer": 127}  # exponent of a non-finite block
BACKENDS = ["reference", "triton"]

def needs(backend: str, fmt: str, op: str = "encode") -> None:
    if backend == "triton" and not (triton_available() and backend_has("triton", fmt, op)):
        pytest.skip(f"no Triton {fmt}.{op} here")


def encode_one(backend: str, layout, x, **kwargs) -> torch.Tensor:
    """Encode one row into slot 1 of a guarded arena; check nothing else changed; -> its bytes."""
    arena = Arena(layout, 2, pad=3, lead=7, tail=7, sentinel=0xA5)
    slots = torch.tensor([1], device=DEVICE)
    run_op(backend, layout.encode, x.to(DEVICE) if isinstance(x, torch.Tensor) else x, arena.cache, slots, **kwargs)
    row = run_op("reference", layout.gather, arena.cache, slots)[0]
    arena.put(1, row)
    arena.check()  # only the row's bytes changed
    return row


def row_input(fmt: str, special: float, dtype, at: int = 0) -> torch.Tensor:
    layout = LAYOUTS[fmt]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, layout.head_dim, generator=g) * 3
    x[0, at] = special
    return x.to(dtype)


def value_bytes(fmt: str, row: torch.Tensor, block: int) -> list[int]:
    """The element codes of NoPE/value block ``block`` (nibbles for mxfp4)."""
    b = BLOCK[fmt]
    if fmt == "mxfp4_indexer":
        codes = nx.unpack_nibbles(row[:LAYOUTS[fmt].head_dim // 2].cpu())
        return codes[block * b:(block + 1) * b].tolist()
    return row[block * b:(block + 1) * b].cpu().tolist()


def scale_bytes(fmt: str, row: torch.Tensor, block: int) -> list[int]:
    layout = LAYOUTS[fmt]
    if fmt == "fp8_ds_mla":
        tok = layout.nope_dim + 2 * layout.rope_dim
        return [int(row[tok + block])]
    if fmt == "fp8_indexer":
        return row[layout.head_dim + 4 * block:layout.head_dim + 4 * block + 4].cpu().tolist()
    return [int(row[layout.head_dim // 2 + block])]


EXPECTED_SCALE = {"fp8_ds_mla": [0xFF], "fp8_indexer": [0x00, 0x00, 0x80, 0x7F], "mxfp4_indexer": [0xFE]}


def expected_codes(fmt: str, xs: torch.Tensor) -> list[set]:
    """Policy codes of a non-finite block: element code of x * 2^-E (E the clamp exponent); NaN:
    e4m3 0x7F or 0xFF (sign unspecified), e2m1 0."""
    y = xs.float() * nx.pow2(torch.tensor(-CLAMP_E[fmt]))
    out = []
    for v, yv in zip(xs.float().tolist(), y.reshape(-1, 1)):
        if v != v:
            out.append({0x7F, 0xFF} if fmt != "mxfp4_indexer" else {0})
        elif fmt == "mxfp4_indexer":
            out.append({int(nx.e2m1_encode(yv)[0])})
        else:
            out.append({int(nx.e4m3_encode(yv)[0])})
    return out


NONFINITE = [pytest.param(NAN, id="nan"), pytest.param(NEG_NAN, id="-nan"), pytest.param(INF, id="inf"),
             pytest.param(-INF, id="-inf")]


def _params_nonfinite():
    out = []
    for fmt in QUANT:
        for backend in BACKENDS:
            for sp in NONFINITE:
                special = sp.values[0]
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    out.append(pytest.param(fmt, backend, special, dtype,
                                            id=f"{fmt}-{backend}-{sp.id}-{str(dtype)[6:]}"))
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fmt,backend,special,dtype", _params_nonfinite())
def test_encode_nonfinite_block(fmt, backend, special, dtype):
    """A NaN/±Inf element: its block gets the clamp exponent, elements coded by the ordinary
    formula at that exponent; the other block, the RoPE tail and the pad are as without it."""
    needs(backend, fmt)
    layout = LAYOUTS[fmt]
    x = row_input(fmt, special, dtype, at=3)
    row = encode_one(backend, layout, x)
    assert scale_bytes(fmt, row, 0) == EXPECTED_SCALE[fmt]
    xs = x[0, :BLOCK[fmt]]
    if fmt == "fp8_ds_mla":
        xs = xs.to(torch.bfloat16)
    got = value_bytes(fmt, row, 0)
    want = expected_codes(fmt, xs)
    assert all(g in w for g, w in zip(got, want)), [(i, hex(g), sorted(map(hex, w))) for i, (g, w) in
                                                     enumerate(zip(got, want)) if g not in w][:4]
    clean = x.clone()
    clean[0, 3] = 0.0
    ref = layout.encode_rows(clean.to(DEVICE))[0]
    assert value_bytes(fmt, row, 1) == value_bytes(fmt, ref, 1) and scale_bytes(fmt, row, 1) == scale_bytes(fmt, ref, 1)
    if fmt == "fp8_ds_mla":
        tok = layout.nope_dim + 2 * layout.rope_dim
        assert torch.equal(row[layout.nope_dim:tok], ref[layout.nope_dim:tok])  # RoPE tail
        assert int(row[-1]) == 0  # scale pad
    dec = layout.decode_rows(row[None].cpu())[0].float()
    block0 = dec[:BLOCK[fmt]]
    if fmt == "mxfp4_indexer":  # NaN is dropped (no e2m1 NaN); Inf -> 6 * 2^127 = Inf
        finite = [v for v in xs.float().tolist()]
        assert (torch.isinf(block0[3]) and block0[3] * special > 0) if special == special else block0[3] == 0
        assert bool(torch.isfinite(torch.cat([block0[:3], block0[4:]])).all()) or any(abs(v) > 2**125 for v in finite)
    else:
        assert not bool(torch.isfinite(block0).any()), "every decoded value of the block is non-finite"
        if special != special:  # a NaN element reads back NaN, whatever the scale byte reads as
            assert bool(torch.isnan(block0[3])), block0[3]
        elif fmt == "fp8_indexer" or layout.numerics.ue8m0_ff == "inf":  # an Inf scale: ±Inf reads back
            assert block0[3].item() == special
        else:  # scale byte 0xFF read as NaN poisons the Inf too
            assert bool(torch.isnan(block0[3])), block0[3]
    assert bool(torch.isfinite(dec[BLOCK[fmt]:2 * BLOCK[fmt]]).all())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt,value,dtype,scale,code,decoded", [
    # finite overflow: fp32 beyond bf16's range becomes Inf in fp8_ds_mla's bf16 step
    ("fp8_ds_mla", 3.4e38, torch.float32, [0xFF], 0x7E, None),
    ("fp8_ds_mla", 3.38e38, torch.float32, [0xF7], 0x78, INF),   # finite bf16, code 256 * 2^120 = Inf
    ("fp8_ds_mla", 1e38, torch.float32, [0xF5], 0x79, 9.570441569651394e37),
    ("fp8_indexer", 3.4e38, torch.float32, [0, 0, 0x80, 0x7B], 0x78, INF),
    ("fp8_indexer", -3.29e38, torch.float32, [0, 0, 0x80, 0x7B], 0xF7, -240 * 2.0**120),
    ("mxfp4_indexer", 3.4e38, torch.float32, [0xFD], 0x6, INF),
    ("mxfp4_indexer", -2.9e38, torch.float32, [0xFD], 0xD, -3 * 2.0**126),
    ("fp8_indexer", 65504.0, torch.float16, [0, 0, 0x80, 0x43], 0x78, 65536.0),
])
def test_encode_finite_overflow(backend, fmt, value, dtype, scale, code, decoded):
    """Finite inputs never reach the clamp exponent unless rounding makes them infinite first;
    the largest ones may decode to ±Inf (the code rounds up to 2^128)."""
    needs(backend, fmt)
    layout = LAYOUTS[fmt]
    x = row_input(fmt, value, dtype)
    row = encode_one(backend, layout, x)
    assert scale_bytes(fmt, row, 0) == scale
    assert value_bytes(fmt, row, 0)[0] == code
    if decoded is not None:
        assert layout.decode_rows(row[None].cpu())[0, 0].float().item() == decoded


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("special", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_encode_rope_nonfinite(backend, special, dtype):
    """fp8_ds_mla's RoPE tail stores bf16(x): ±Inf exactly, NaN as some bf16 NaN (bf16 input:
    verbatim); the NoPE blocks are unaffected."""
    needs(backend, "fp8_ds_mla")
    layout = LAYOUTS["fp8_ds_mla"]
    at = layout.nope_dim + 5
    x = row_input("fp8_ds_mla", special, dtype, at=at)
    row = encode_one(backend, layout, x)
    rope = row[layout.nope_dim:layout.nope_dim + 2 * layout.rope_dim].cpu().view(torch.bfloat16)
    got = rope[5:6]
    want = x[0, at:at + 1].to(torch.bfloat16)
    if dtype == torch.bfloat16 and special == special:
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert same_values(got, want)
    clean = x.clone()
    clean[0, at] = 0.0
    ref = layout.encode_rows(clean.to(DEVICE))[0]
    assert torch.equal(row[:layout.nope_dim], ref[:layout.nope_dim]) and torch.equal(row[-8:], ref[-8:])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_encode_state_nonfinite(backend, dtype):
    """compressor_state: kv stored as its float32 value, score as fl32(score + ape[p % 4]) in IEEE
    arithmetic (Inf + -Inf = NaN); NaN payloads unspecified; finite/Inf bits exact."""
    needs(backend, "compressor_state")
    layout = LAYOUTS["compressor_state"]
    kv = torch.tensor([[NAN, -INF, INF, 3.4e38]]).to(dtype)
    score = torch.tensor([[NAN, INF, -INF, 1.0]]).to(dtype)
    ape = torch.tensor([[1.0, -INF, -INF, 3.4e38]] * 4).to(dtype)
    pos = torch.tensor([6])
    row = encode_one(backend, layout, (kv.to(DEVICE), score.to(DEVICE)), positions=pos.to(DEVICE),
                     ape=ape.to(DEVICE)).cpu().view(torch.float32)
    want = torch.cat([kv.float()[0], score.float()[0] + ape.float()[6 % 4]])
    assert same_values(row, want)


# ----- decode of corrupt bytes ------------------------------------------------------------------
def decode_bytes(backend, layout, row: torch.Tensor):
    arena = Arena(layout, 1, pad=0, lead=0, tail=4, sentinel=0xA5)
    write_rows(layout, arena.cache, torch.tensor([0], device=DEVICE), row[None].to(DEVICE))
    arena.put(0, row.to(DEVICE))
    out = run_op(backend, layout.decode, arena.cache, torch.tensor([0, -1], device=DEVICE))
    arena.check()
    gathered = run_op(backend, layout.gather, arena.cache, torch.tensor([0], device=DEVICE))
    assert torch.equal(gathered[0].cpu(), row), "gather returns the bytes verbatim"
    return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()


def e4m3_f64(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).to(torch.float64)


def ue8m0_f64(s: int, ff: str) -> float:
    """A ue8m0 byte's scale as the profile reads it: 2^(s - 127) rounded to float32, so 0xFF is
    +Inf ("inf", tokenspeed), or NaN for 0xFF ("nan", float8_e8m0fnu)."""
    if s == 0xFF:
        return INF if ff == "inf" else NAN
    return 2.0 ** (s - 127)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("profile", ["tokenspeed", "vllm"])
def test_decode_corrupt_fp8_ds_mla(backend, profile):
    needs(backend, "fp8_ds_mla", "decode")
    layout = attrs.evolve(LAYOUTS["fp8_ds_mla"], profile=profile)
    codes = torch.arange(128, dtype=torch.uint8) * 2 + torch.tensor([0, 1], dtype=torch.uint8).repeat(64)
    codes[:4] = torch.tensor([0x7F, 0xFF, 0x7E, 0x01])
    rope = torch.tensor([NAN, INF, -INF, 1.5] * 16).to(torch.bfloat16)
    rope.view(torch.int16)[0] = 0x7FA1  # a NaN payload: stored and returned verbatim
    for s0, s1, pad in [(0xFF, 0x7F, 0x00), (0x7F, 0xFE, 0xAB), (0x00, 0xF7, 0xFF), (0x00, 0xFF, 0x00)]:
        row = torch.cat([codes, rope.view(torch.uint8), torch.tensor([s0, s1, pad], dtype=torch.uint8)])
        got = decode_bytes(backend, layout, row)
        ff = layout.numerics.ue8m0_ff
        # float64: 0 * Inf is NaN, code * Inf is ±Inf, NaN codes stay NaN (spec/nan-policy.md §4)
        vals = e4m3_f64(codes).reshape(2, 64) * torch.tensor([ue8m0_f64(s0, ff), ue8m0_f64(s1, ff)],
                                                             dtype=torch.float64)[:, None]
        want = torch.cat([vals.reshape(-1).to(torch.bfloat16), rope])[None]
        assert same_values(got[:1], want), (s0, s1)
        assert torch.equal(got[0, 128:].view(torch.int16), rope.view(torch.int16)), "RoPE bits verbatim"
        assert not bool(got[1].view(torch.int16).any()), "slot -1 gives +0.0"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_corrupt_fp8_indexer(backend):
    needs(backend, "fp8_indexer", "decode")
    layout = LAYOUTS["fp8_indexer"]
    codes = torch.arange(256, dtype=torch.uint8)
    for s0, s1 in [(NAN, INF), (-INF, -2.0), (0.0, 3.0), (1e-45, 2.0**127)]:
        scales = torch.tensor([s0, s1], dtype=torch.float32)
        row = torch.cat([codes, scales.view(torch.uint8)])
        got = decode_bytes(backend, layout, row)
        want = (e4m3_f64(codes).float().reshape(2, 128) * scales[:, None]).reshape(1, -1)
        assert same_values(got[:1], want), (s0, s1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's 0 * Inf
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("profile", ["tokenspeed", "ocp"])
def test_decode_corrupt_mxfp4(backend, profile):
    needs(backend, "mxfp4_indexer", "decode")
    layout = attrs.evolve(LAYOUTS["mxfp4_indexer"], profile=profile)
    nib = torch.arange(64, dtype=torch.uint8) % 16
    for s0, s1 in [(0xFF, 0x00), (0xFE, 0x7F)]:
        row = torch.cat([nx.pack_nibbles(nib), torch.tensor([s0, s1], dtype=torch.uint8)])
        got = decode_bytes(backend, layout, row)
        mags = torch.tensor(nx.E2M1_VALUES, dtype=torch.float64)[(nib & 7).long()]
        vals = torch.where((nib & 8) != 0, -mags, mags).reshape(2, 32)
        ff = layout.numerics.ue8m0_ff
        # "nan": a NaN scale poisons every element, zeros too; "inf": ±Inf, zero codes (±0) NaN
        vals = vals * torch.tensor([ue8m0_f64(s0, ff), ue8m0_f64(s1, ff)], dtype=torch.float64)[:, None]
        want = vals.reshape(1, -1).float()
        assert same_values(got[:1], want), (s0, s1)
        assert got[0, 8].item() == 0 and torch.signbit(got[0, 8 + 32]) or s0 == 0xFF  # nibble 0x8 = -0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_corrupt_state(backend):
    """compressor_state decode returns the stored float32 bits, NaN payloads included."""
    needs(backend, "compressor_state", "decode")
    layout = LAYOUTS["compressor_state"]
    words = torch.tensor([0x7FC00001, 0xFF800000, 0x7F800000, 0x00000001, 0x80000000, 0xFFFFFFFF,
                          0x7FA00000, 0x3F800000], dtype=torch.int64).to(torch.int32)
    kv, score = decode_bytes(backend, layout, words.view(torch.uint8))
    assert torch.equal(torch.cat([kv[0], score[0]]).view(torch.int32), words)
