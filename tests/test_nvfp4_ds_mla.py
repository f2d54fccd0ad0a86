"""nvfp4_ds_mla golden bytes: encode and decode against an independent oracle.

The oracle below shares no code with kvformats: it builds each 352 B record from Python floats
with ml_dtypes' float8_e4m3fn cast (after the clamp to ±448 that torch 2.13's saturating cast
performs: ml_dtypes itself gives NaN from 464 up), numpy float32 divisions, an e2m1 rounding
written out from the value table, and FlashMLA's literal permutation ``8 * (s & 3) + (s >> 2)``
(spec/formats/nvfp4_ds_mla.md). The cases: the permutation, the round-up bump, every e2m1 tie,
zero, -0.0 and tiny negatives, saturated blocks, NaN and ±Inf blocks, the RoPE cast.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import kvformats as kvf

F8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NAN, INF = float("nan"), float("inf")
SENTINEL = 0xA5


# ----------------------------------------------------------------------------- the oracle


def f32(v: float) -> np.float32:
    return np.float32(v)


def e4m3_byte(v: float) -> int:
    """torch 2.13's float32 -> float8_e4m3fn cast: saturating at ±448 (±Inf too), RNE, NaN kept."""
    if not math.isnan(v):
        v = min(max(v, -448.0), 448.0)
    return int(np.array(v, dtype=np.float32).astype(F8).view(np.uint8))


def e4m3_value(byte: int) -> float:
    return float(np.array(byte, dtype=np.uint8).view(F8).astype(np.float32))


def e2m1_magnitude(a: float) -> int:
    """Round-half-even code (0..7) of a >= 0 on the e2m1 grid, saturating at 6; NaN -> 7."""
    if math.isnan(a):
        return 7
    a = min(a, 6.0)
    dist = [abs(a - v) for v in E2M1]
    best = min(dist)
    ties = [c for c, d in enumerate(dist) if d == best]
    return ties[0] if len(ties) == 1 else next(c for c in ties if c % 2 == 0)


def oracle_row(x: list[float], nope: int = 512) -> bytes:
    """The 352 B record of one row of bf16-exact values ``x`` (nope + rope dims)."""
    blocks = [x[i:i + 16] for i in range(0, nope, 16)]
    codes, sfs = [], []
    for blk in blocks:
        amax = NAN if any(math.isnan(v) for v in blk) else max(abs(v) for v in blk)
        t = f32(amax) / f32(6.0)
        t = t if math.isnan(t) else max(t, f32(2.0**-9))
        b = e4m3_byte(float(t)) & 0x7F
        if e4m3_value(b) < t and b < 0x7E:
            b += 1
        sfs.append(b)
        sf = f32(e4m3_value(b))
        for v in blk:
            y = f32(v) / sf
            codes.append(e2m1_magnitude(abs(float(y))) | (8 if y < 0 else 0))
    data = bytes(codes[2 * k] | codes[2 * k + 1] << 4 for k in range(nope // 2))
    rope = bytes(e4m3_byte(v) for v in x[nope:])
    stored = [0] * len(sfs)
    for s, b in enumerate(sfs):
        stored[8 * (s & 3) + (s >> 2)] = b  # FlashMLA's NVFP4_SF_BYTE, 32 blocks
    return data + rope + bytes(stored)


def oracle_decode(row: bytes, nope: int = 512) -> list[float]:
    """float values of one 352 B record, unpermuting the scales (each exact in bf16)."""
    nb = nope // 16
    stored = row[nope // 2 + 64:]
    sf = [e4m3_value(stored[8 * (s & 3) + (s >> 2)]) for s in range(nb)]
    out = []
    for k in range(nope // 2):
        for nib in (row[k] & 0xF, row[k] >> 4):
            mag = E2M1[nib & 7]
            v = -mag if nib & 8 else mag
            out.append(v * sf[len(out) // 16])
    out += [e4m3_value(b) for b in row[nope // 2:nope // 2 + 64]]
    return [float(np.float32(v).astype(BF16)) for v in out]


# ----------------------------------------------------------------------------- the rows

def bf16_exact(values: list[float]) -> list[float]:
    out = [float(np.float32(v).astype(BF16)) for v in values]
    assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(out, values)), "not bf16 values"
    return out


def pattern(n: int, seed: int, scale: float) -> list[float]:
    """Deterministic bf16 values of mixed signs and magnitudes."""
    g = np.random.default_rng(seed)
    return bf16_exact([float(np.float32(v).astype(BF16)) for v in g.standard_normal(n) * scale])


TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
NOPE_BLOCKS = {  # block index -> 16 values; the others are patterns
    0: [0.0] * 16,  # all zero: floor scale 0x01, nibbles 0
    1: [-0.0, 0.0, -(2.0**-20), 2.0**-20, -(2.0**-12), -0.0] + [0.0] * 10,  # -0.0 -> 0x0, tiny negatives -> 0x8
    2: [6.0] + TIES + [-t for t in TIES] + [-6.0],  # sf = 1 exactly (no bump), every tie both signs
    3: [6.375, 1.0, -2.0, 0.5] + [0.0] * 12,  # t = 1.0625: RNE to 1.0 (even), bumped to 1.125
    4: [6.25, -6.25] + [1.5] * 14,  # t = 1.0417: RNE 1.0, bumped to 1.125
    5: [6.5, 3.25] + [0.0] * 14,  # t = 1.0833: RNE 1.125 >= t, no bump
    6: [3008.0, -3008.0, 448.0, 1.0] + [0.0] * 12,  # t = 501.3: saturated at 448 (0x7E), elements clipped at 6
    7: [2720.0, 100.0] + [0.0] * 14,  # t = 453.3: 448 (0x7E); no bump past 0x7E
    8: [13.5 * 2.0**-9, 1.5 * 2.0**-9, -(2.0**-11)] + [0.0] * 13,  # t = 2.25 * 2^-9: subnormal 2, bumped to 3
    9: [6.0 * 2.0**-7, 2.0**-9] + [0.0] * 14,  # t = 2^-7 (a subnormal e4m3, exact): no bump
    10: [NAN, 1.0, -2.0] + [0.5] * 13,  # NaN block: scale 0x7F, every nibble 0x7
    11: [INF, 1.0, -896.0, 224.0] + [0.0] * 12,  # +Inf: t = Inf -> 448, Inf element 0x7, others x / 448
    12: [-INF, 0.5, 2.0**-20] + [-0.0] * 13,  # -Inf: 0xF for it
    13: [INF, NAN, -INF] + [0.0] * 13,  # NaN wins: scale 0x7F
    14: [6.0 * 448.0, -6.0 * 448.0] + [100.0] * 14,  # t = 448 exactly: 0x7E, no bump
    15: [2.0**-12] * 16,  # below the floor: sf = 2^-9, y = 0.125 -> code 0
}
ROPE = [0.0, -0.0, 448.0, -448.0, 464.0, 472.0, 480.0, 10240.0, INF, -INF, 2.0**-10, 1.5 * 2.0**-10, -(2.0**-11),
        17.0, 19.0, 9.5, 0.09375, -(2.0**127), 2.0**-9, 240.0, 248.0]


def row0() -> list[float]:
    x = []
    for b in range(32):
        x += bf16_exact(NOPE_BLOCKS[b]) if b in NOPE_BLOCKS else pattern(16, b, 2.0 ** (b - 24))
    rope = bf16_exact(ROPE) + pattern(64 - len(ROPE), 99, 3.0)
    return x + rope


def rows() -> list[list[float]]:
    return [row0(), pattern(576, 1, 1.0), pattern(576, 2, 2.0**-6), pattern(576, 3, 300.0)]


def as_bf16(rs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rs, dtype=torch.float32).to(torch.bfloat16)


# ----------------------------------------------------------------------------- tests

def test_oracle_states_the_edge_bytes():
    """The oracle's own bytes for the hand-made blocks, as spec/formats/nvfp4_ds_mla.md states them."""
    row = oracle_row(row0())
    stored = row[320:]

    def sf(s):
        return stored[8 * (s & 3) + (s >> 2)]

    def nib(i):
        return (row[i // 2] >> (4 * (i % 2))) & 0xF

    assert (sf(0), sf(1), sf(2)) == (0x01, 0x01, 0x38)  # zero blocks floor at 2^-9; max 6 -> 1.0
    assert [nib(16 + i) for i in range(5)] == [0x0, 0x0, 0x8, 0x0, 0x8]  # -0.0 -> 0, tiny negative -> 8
    assert [nib(33 + i) for i in range(7)] == [0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6]  # RNE ties
    assert [nib(40 + i) for i in range(7)] == [0x8, 0xA, 0xA, 0xC, 0xC, 0xE, 0xE]  # negative ties (0.25 -> 0x8)
    assert (sf(3), sf(4), sf(5)) == (0x39, 0x39, 0x39)  # two bumps to 1.125, one RNE already at 1.125
    assert (sf(6), sf(7), sf(14)) == (0x7E, 0x7E, 0x7E)  # saturated, never bumped past 0x7E
    assert (nib(96), nib(97)) == (0x7, 0xF)  # ±3008 / 448 clipped at ±6
    assert sf(8) == 0x03 and [nib(128 + i) for i in range(3)] == [0x6, 0x1, 0x8]  # 2.25 * 2^-9: RNE 2, bumped to 3
    assert sf(9) == 0x04  # 2^-7 exactly: no bump
    assert sf(10) == 0x7F and {nib(160 + i) for i in range(16)} == {0x7}  # NaN block
    assert sf(11) == 0x7E and (nib(176), nib(178), nib(179)) == (0x7, 0xC, 0x1)  # Inf -> 6; -896 / 448 = -2
    assert sf(12) == 0x7E and nib(192) == 0xF
    assert sf(13) == 0x7F
    assert row[256:256 + 10] == bytes([0x00, 0x80, 0x7E, 0xFE, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE])  # RoPE


def test_oracle_decode_inverts_a_scale_permutation():
    row = bytearray(352)
    for s in range(32):
        row[320 + 8 * (s & 3) + (s >> 2)] = 0x38 + (s % 8)  # scale 1 .. 1.875 by block
    row[:256] = bytes([0x22]) * 256  # every value 1.0
    got = oracle_decode(bytes(row))
    assert got[:512] == [e4m3_value(0x38 + (i // 16) % 8) for i in range(512)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_encode_bytes_equal_the_oracle(dtype):
    layout = kvf.get_format("nvfp4_ds_mla")
    rs = rows()
    want = [oracle_row(r) for r in rs]
    x = as_bf16(rs).to(dtype)
    pages, stride = 2, (layout.page_size + 1) * layout.row_bytes  # FlashMLA's spare row: a page stride
    cache = layout.allocate(pages, page_stride=stride)
    storage = torch.empty(0, dtype=torch.uint8).set_(cache.untyped_storage())
    storage.fill_(SENTINEL)
    slots = torch.tensor([70, 3, 127, 64])
    layout.encode(x, cache, slots)
    got = layout.gather(cache, slots)
    for i, (g, w) in enumerate(zip(got, want)):
        g = bytes(g.tolist())
        for k in range(256, 320):  # a RoPE NaN's sign is not specified (spec/nan-policy.md §1.3)
            if (w[k] & 0x7F) == 0x7F:
                assert (g[k] & 0x7F) == 0x7F, (i, k)
                g = g[:k] + w[k:k + 1] + g[k + 1:]
        assert g == w, f"row {i}: first difference at byte {next(k for k in range(352) if g[k] != w[k])}"
    # the bytes sit where the layout says, and nothing else of the arena changed
    written = torch.zeros_like(storage, dtype=torch.bool)
    for slot in slots.tolist():
        page, r = divmod(slot, layout.page_size)
        at = cache.storage_offset() + page * stride + r * layout.row_bytes
        written[at:at + layout.row_bytes] = True
    assert bool((storage[~written] == SENTINEL).all())


def test_decode_equals_the_oracle():
    layout = kvf.get_format("nvfp4_ds_mla")
    rs = rows()
    cache = layout.allocate(2)
    slots = torch.tensor([70, 3, 127, 64])
    layout.encode(as_bf16(rs), cache, slots)
    got = layout.decode(cache, torch.tensor([70, -1, 3, 127, 64]))
    assert got.dtype == torch.bfloat16 and got.shape == (5, 576)
    assert not got[1].view(torch.int16).any()  # slot -1: a zero row
    for g, r in zip(got[[0, 2, 3, 4]], rs):
        want = torch.tensor(oracle_decode(oracle_row(r)), dtype=torch.float32).to(torch.bfloat16)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(g), nan)
        assert torch.equal(g.view(torch.int16)[~nan], want.view(torch.int16)[~nan])  # -0.0 included


def test_decode_of_arbitrary_bytes_equals_the_oracle():
    """Any byte pattern (NaN and negative scales, NaN RoPE codes) decodes as the oracle reads it."""
    layout = kvf.get_format("nvfp4_ds_mla", page_size=2)
    cache = torch.randint(0, 256, (3, layout.page_bytes), generator=torch.Generator().manual_seed(7),
                          dtype=torch.uint8)
    slots = torch.arange(6)
    got = layout.decode(cache, slots)
    raw = layout.gather(cache, slots)
    for g, row in zip(got, raw):
        want = torch.tensor(oracle_decode(bytes(row.tolist())), dtype=torch.float32).to(torch.bfloat16)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(g), nan)
        assert torch.equal(g.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def test_scale_views_permuted_and_in_block_order():
    layout = kvf.get_format("nvfp4_ds_mla", page_size=2)
    assert layout.scale_positions == tuple(8 * (s & 3) + (s >> 2) for s in range(32))
    assert layout.scale_order("scale") == layout.scale_positions and layout.scale_order("nope") is None
    cache = layout.allocate(1)
    x = torch.zeros(1, 576)
    x[0, :512] = torch.arange(32).repeat_interleave(16).float() + 1  # block s has max s + 1
    layout.encode(x, cache, torch.tensor([1]))
    in_order = layout.block_scales(cache)[0, 1].float()
    want = torch.tensor([e4m3_value(oracle_row(bf16_exact(x[0].tolist()))[320 + 8 * (s & 3) + (s >> 2)])
                         for s in range(32)])
    assert torch.equal(in_order, want)
    assert torch.equal(in_order, torch.sort(in_order).values)  # block order: maxima increase
    stored = layout.views(cache)["scale"][0, 1]
    assert stored.dtype == torch.float8_e4m3fn
    assert torch.equal(stored.float(), layout.permute_scales(in_order))
    assert torch.equal(layout.unpermute_scales(stored.float()), in_order)
    assert "permuted" in layout.describe() and "permuted" in layout.region("scale").doc
    assert "block s at byte (s % 4) * 8 + s // 4" in layout.describe()


def test_smaller_geometries_keep_four_quarters():
    """kvformats' generalisation: block s at (s % 4) * (blocks / 4) + s // 4."""
    assert kvf.get_format("nvfp4_ds_mla", head_dim=192).scale_positions == (0, 2, 4, 6, 1, 3, 5, 7)
    assert kvf.get_format("nvfp4_ds_mla", head_dim=96, rope_dim=32).scale_positions == (0, 1, 2, 3)
    with pytest.raises(kvf.LayoutError, match="multiple of 64"):
        kvf.get_format("nvfp4_ds_mla", head_dim=96)


def test_geometry_and_profile():
    layout = kvf.Nvfp4DsMla()
    assert (layout.row_bytes, layout.page_bytes, layout.head_dim, layout.rope_dim) == (352, 22528, 576, 64)
    assert [(r.name, r.offset, r.nbytes) for r in layout.regions] == [("nope", 0, 256), ("rope", 256, 64),
                                                                      ("scale", 320, 32)]
    assert layout.profile == "flashmla" and kvf.supported_profiles()["nvfp4_ds_mla"] == ("flashmla",)
    with pytest.raises(kvf.LayoutError):
        kvf.Nvfp4DsMla(profile="vllm")
