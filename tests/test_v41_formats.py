"""The DeepSeek V4.1 formats (spec/formats/fp8_ds_mla_v41.md, fp4_ds_mla_v41.md and their
_interleaved pages): both layouts' geometry, the bytes of the edge cases the format files state
for the default profile (tokenspeed-kernel 0.1.4's writer), NaN / Inf, the profiles, and the
typed errors of bad parameters."""

import pytest
import torch

import kvformats as kvf


def encode_one(layout, row: list[float]) -> torch.Tensor:
    cache = layout.allocate(1)
    x = torch.tensor([row], dtype=torch.float32)
    layout.encode(x, cache, torch.tensor([0]))
    return layout.gather(cache, torch.tensor([0]))[0]


def test_geometry_from_the_interface_text():
    big, fp4 = kvf.Fp8DsMlaV41(), kvf.Fp4DsMlaV41()
    assert (big.row_bytes, big.page_bytes) == (528, 64 * 528)
    assert (fp4.row_bytes, fp4.page_bytes) == (288, 64 * 288)
    # data rows of the whole page first, then the scale rows; no page pad
    assert [(r.name, r.offset, r.row_stride) for r in big.regions] == [("values", 0, 512), ("scale", 64 * 512, 16)]
    assert [(r.name, r.offset, r.row_stride) for r in fp4.regions] == [("values", 0, 256), ("scale", 64 * 256, 32)]
    assert big.slot_offsets(70) == {"values": 36864, "scale": 66656}
    assert fp4.slot_offsets(70) == {"values": 19968, "scale": 35008}


def test_interleaved_geometry():
    """Each token's values, then its own scales: the same bytes per token as the planar pair."""
    big, fp4 = kvf.get_format("fp8_ds_mla_v41_interleaved"), kvf.get_format("fp4_ds_mla_v41_interleaved")
    assert (big.row_bytes, big.page_bytes, fp4.row_bytes, fp4.page_bytes) == (528, 64 * 528, 288, 64 * 288)
    assert [(r.name, r.offset, r.row_stride) for r in big.regions] == [("values", 0, 528), ("scale", 512, 528)]
    assert [(r.name, r.offset, r.row_stride) for r in fp4.regions] == [("values", 0, 288), ("scale", 256, 288)]
    assert big.slot_offsets(70) == {"values": 33792 + 6 * 528, "scale": 33792 + 6 * 528 + 512}


@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v41", "fp4_ds_mla_v41"])
def test_interleaved_rows_equal_planar_rows(fmt):
    """Same profile, same row bytes (gather), same decode; only where they sit in a page differs."""
    x = torch.randn(5, 512, dtype=torch.bfloat16) * 3
    slots = torch.tensor([3, 70, 0, -1, 127])
    got = []
    for name in (fmt, fmt + "_interleaved"):
        layout = kvf.get_format(name, profile="flashmla")
        cache = layout.allocate(2)
        layout.encode(x, cache, slots)
        got.append((layout.gather(cache, slots), layout.decode(cache, slots), cache))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    assert not torch.equal(got[0][2], got[1][2])


def test_the_extra_cache_shares_the_page_geometry():
    """Beside a 528 B cache of P rows per page sits a 288 B cache of P rows: the same slot names
    the same (page, row) in both."""
    for p in (2, 64):
        big, fp4 = kvf.Fp8DsMlaV41(page_size=p), kvf.Fp4DsMlaV41(page_size=p)
        for slot in (0, p - 1, 5 * p + 1):
            assert divmod(slot, big.page_size) == divmod(slot, fp4.page_size)


def test_fp8_v41_edge_bytes():
    layout = kvf.Fp8DsMlaV41(head_dim=64, page_size=1)
    row = encode_one(layout, [0.0] * 32 + [56.0, -56.0, 17 * 2.0**-3] + [0.0] * 29)
    assert row[64] == 0x69 and not row[:32].any()  # zero block: e = -22
    assert row[65] == 127 - 3 and row[32:35].tolist() == [0x7E, 0xFE, 0x58]  # 56 = 448 / 8; 17 -> 16 (even)


def test_fp4_v41_edge_bytes():
    layout = kvf.Fp4DsMlaV41(head_dim=64, page_size=1)
    ties = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 2
    row = encode_one(layout, [0.0] * 16 + [-0.0, -(2.0**-12)] * 8 + ties + [4096.0] + [1.0] * 15)
    scales = row[32:36].tolist()
    assert scales == [0x01, 0x01, 0x38, 0x7E]  # floor 2^-9, floor 2^-9, 6 / 6 = 1.0, clamped at 448
    assert not row[:8].any() and set(row[8:16].tolist()) == {0x88}  # signed zero kept
    assert row[16:20].tolist() == [0x07, 0x22, 0x44, 0x66]  # ties to even: 0, 1, 1, 2, 2, 4, 4
    out = layout.decode(layout.allocate(1), torch.tensor([-1]))
    assert out.dtype == torch.bfloat16 and not out.any()


def test_fp4_v41_decode_is_exact():
    layout = kvf.Fp4DsMlaV41(head_dim=16, page_size=1)
    cache = layout.allocate(1)
    cache[0, :8] = torch.tensor([0x17, 0x2F, 0xA9, 0x00, 0x88, 0x7E, 0x5D, 0x31], dtype=torch.uint8)
    cache[0, 8] = 0x3F  # e4m3 1.875
    got = layout.decode(cache, torch.tensor([0])).float()[0]
    codes = [0x7, 0x1, 0xF, 0x2, 0x9, 0xA, 0x0, 0x0, 0x8, 0x8, 0xE, 0x7, 0xD, 0x5, 0x1, 0x3]
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    want = [(-1.0 if c & 8 else 1.0) * mags[c & 7] * 1.875 for c in codes]
    assert got.tolist() == want


def test_nan_and_inf_follow_the_format_files():
    fp4 = kvf.Fp4DsMlaV41(head_dim=32, page_size=1)
    row = encode_one(fp4, [float("nan")] + [1.0] * 15 + [float("-inf")] + [1.0] * 15)
    assert row[16] == 0x7F and not row[:8].any()  # NaN block: NaN scale, every nibble 0
    assert row[17] == 0x7E and row[8] & 0xF == 0xF  # -Inf block: s = 448, the Inf saturates at -6
    big = kvf.Fp8DsMlaV41(head_dim=32, page_size=1)
    assert encode_one(big, [float("inf")] + [1.0] * 31)[32] == 0xFF


def test_flashmla_profile_poisons_non_finite_blocks():
    """FlashMLA's fp8 writer divides by the block's scale: an Inf block's scale is 2^128 = +Inf
    (byte 0xFF), so its finite elements code as signed zeros and its Inf as NaN. Its fp4 writer
    makes a NaN block's scale NaN and treats an Inf as the largest float (scale 448, saturated)."""
    fp4 = kvf.Fp4DsMlaV41(head_dim=32, page_size=1, profile="flashmla")
    x = torch.tensor([[1.0] * 32], dtype=torch.bfloat16)
    x[0, 16] = float("-inf")
    x.view(torch.int16)[0, 0], x.view(torch.int16)[0, 3] = 0x7FC0, -0x40  # +NaN; -NaN (bits 0xFFC0)
    cache = fp4.allocate(1)
    fp4.encode(x, cache, torch.tensor([0]))
    row = cache[0]
    assert row[16:18].tolist() == [0x7F, 0x7E] and row[8] & 0xF == 0xF
    # NaN block: every nibble 0, but a NaN's own, which carries its sign (+NaN 0x0, -NaN 0x8)
    assert row[:8].tolist() == [0x00, 0x80, 0, 0, 0, 0, 0, 0]
    big = kvf.Fp8DsMlaV41(head_dim=32, page_size=1, profile="flashmla")
    row = encode_one(big, [float("inf"), -2.0] + [1.0] * 30)
    assert row[32] == 0xFF and row[0] & 0x7F == 0x7F and row[1] == 0x80 and not row[2:32].any()


@pytest.mark.parametrize("fmt,bad", [("fp8_ds_mla_v41", 48), ("fp4_ds_mla_v41", 40), ("fp4_ds_mla_v41", 0)])
def test_bad_head_dim_is_a_layout_error(fmt, bad):
    with pytest.raises(kvf.LayoutError):
        kvf.get_format(fmt, head_dim=bad)


@pytest.mark.parametrize("fmt,default,others", [
    ("fp8_ds_mla_v41", "tokenspeed", ("flashmla",)), ("fp4_ds_mla_v41", "tokenspeed", ("flashmla",)),
    ("fp8_ds_mla_v41_interleaved", "flashmla", ("vllm", "tokenspeed")),
    ("fp4_ds_mla_v41_interleaved", "flashmla", ("vllm", "tokenspeed"))])
def test_profiles_of_the_published_writers(fmt, default, others):
    assert kvf.get_format(fmt).profile == default
    assert kvf.get_format(fmt).PROFILES.names == (default, *others)
    with pytest.raises(kvf.LayoutError, match="does not apply") as err:
        kvf.get_format(fmt, profile="ocp")
    assert default in str(err.value)
    with pytest.raises(kvf.LayoutError, match="retired"):  # the rule kvformats chose before any writer
        kvf.get_format(fmt, profile="kvformats")


def test_fp8_profiles_differ_only_where_the_floor_sits():
    """tokenspeed floors amax at 1e-4 before dividing by 448; FlashMLA floors amax / 448 at 1e-4:
    a block whose maximum is below 448e-4 gets another scale."""
    x = torch.zeros(1, 32)
    x[0, 0] = 0.01  # amax / 448 < 1e-4
    rows = [encode_one(kvf.Fp8DsMlaV41(head_dim=32, page_size=1, profile=p), x[0].tolist()) for p in
            ("tokenspeed", "flashmla")]
    # tokenspeed: 2^ceil(log2(0.01 / 448)) = 2^-15; FlashMLA: 2^ceil(log2(max(0.01 / 448, 1e-4))) = 2^-13
    assert rows[0][32] == 127 - 15 and rows[1][32] == 127 - 13


@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v41", "fp4_ds_mla_v41"])
def test_convert_between_the_two_layouts_is_a_byte_copy(fmt):
    from kvformats.codec.convert import convert_slots

    planar = kvf.get_format(fmt, profile="flashmla")
    inter = kvf.get_format(fmt + "_interleaved")
    x = torch.randn(8, 512, dtype=torch.bfloat16) * 0.02
    slots = torch.tensor([0, 5, 64, 65, 70, 100, 127, 3])
    a, b = planar.allocate(2), inter.allocate(2)
    planar.encode(x, a, slots)
    convert_slots(planar, a, slots, inter, b, slots, exact=True)
    want = inter.allocate(2)
    inter.encode(x, want, slots)
    assert torch.equal(b, want)
    back = planar.allocate(2)
    convert_slots(inter, b, slots, planar, back, slots, exact=True)
    assert torch.equal(back, a)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v41", "fp4_ds_mla_v41"])
def test_a_file_written_with_the_retired_profile_loads_with_its_successor(tmp_path, fmt):
    """A cache file of 6425adc (profile 'kvformats', that version's fingerprint, no record key)
    loads as profile tokenspeed and decodes to the values it was written with."""
    import json
    import struct

    pytest.importorskip("safetensors")
    from kvformats.caches.files import load_cache, save_cache
    from kvformats.spec.formats import FORMER_SPEC_DIGESTS

    layout = kvf.get_format(fmt)
    cache = layout.allocate(2)
    slots = torch.tensor([0, 3, 64, 70])
    layout.encode((torch.randn(4, 512) * 0.02).to(torch.bfloat16), cache, slots)
    save_cache(tmp_path / "new.safetensors", layout, cache)
    data = (tmp_path / "new.safetensors").read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    meta = json.loads(header["__metadata__"]["kvformats"])
    entry = meta["tensors"]["cache"]
    entry["params"]["profile"] = "kvformats"
    entry["fingerprint"] = next(iter(FORMER_SPEC_DIGESTS[fmt]))
    entry.pop("record", None)
    header["__metadata__"]["kvformats"] = json.dumps(meta)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    (tmp_path / "old.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size:])
    got = load_cache(tmp_path / "old.safetensors")
    assert got.layout.profile == "tokenspeed" and torch.equal(got.cache, cache)
    assert torch.equal(got.layout.decode(got.cache, slots), layout.decode(cache, slots))
