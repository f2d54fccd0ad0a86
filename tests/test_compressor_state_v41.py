"""compressor_state_v41: DeepSeek V4.1's ratio-2 compressor ring (spec/formats/compressor_state_v41.md,
spec/engines.md §7.5). Golden: the cache read back as float32 holds the inputs' bit patterns at
the ring slots the test computes (vLLM 0.33.0: ``block * capacity + p % capacity``; tokenspeed
0.1.4: pages of 2 rows), -0.0, NaN payloads and Inf included."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.errors import InputError, InputTypeError, LayoutError


def f32_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def special_rows(n: int, w: int, seed: int) -> torch.Tensor:
    """float32 ``[n, w]``: random values with -0.0, +0.0, ±Inf, NaNs with payloads and a subnormal."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, w, generator=g) * torch.exp(torch.randn(n, 1, generator=g) * 4)
    flat = x.view(-1)
    specials = torch.tensor([0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFA5A5A5, 0x00000001],
                            dtype=torch.int64).to(torch.int32).view(torch.float32)
    k = min(flat.numel(), specials.numel())
    flat[torch.randperm(flat.numel(), generator=g)[:k]] = specials[:k]
    return x


def next_pow2(v: int) -> int:
    return 1 << (v - 1).bit_length()


def test_defaults_geometry_and_record():
    lay = kvf.get_format("compressor_state_v41")
    assert lay == kvf.CompressorStateV41(head_dim=512, page_size=8)
    assert (lay.width, lay.row_bytes, lay.page_bytes) == (512, 4096, 32768)
    assert lay.cache_shape(3) == (3, 8, 1024) and lay.container_dtype == torch.float32
    assert {r.name: (r.offset, r.nbytes, r.dtype) for r in lay.regions} == {
        "kv": (0, 2048, "float32"), "score": (2048, 2048, "float32")}
    assert lay.decode_dtype is None and lay.decode_dtypes == (torch.float32, torch.float32)
    assert not lay.paged_reads
    assert lay.record.name == "dsv41-compressor-ring-4096" and lay.record.version == "V4.1"
    # the same 4096 B as the V4 HCA state: a size alone names both, a hint tells them apart
    assert {r.name for r in kvf.identify(4096)} == {"dsv4-hca-state-4096", "dsv41-compressor-ring-4096"}
    assert kvf.identify_one(4096, hint="V4.1").format == "compressor_state_v41"
    assert kvf.identify_one(4096, hint="vllm").format == "compressor_state_v41"
    assert kvf.identify_one(4096, hint="V4").format == "compressor_state"
    assert kvf.CompressorStateV41(page_size=2).record is lay.record  # tokenspeed's pages of 2 rows
    assert kvf.CompressorStateV41(head_dim=64).record.derived


@pytest.mark.parametrize("bad", [dict(head_dim=0), dict(page_size=0), dict(ratio=2)])
def test_bad_parameters_are_layout_errors(bad):
    with pytest.raises(LayoutError):
        kvf.get_format("compressor_state_v41", **bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_golden_ring_rows_are_the_inputs_bits(dtype):
    """Two requests' rings (vLLM: one block each, capacity = max(8, next_pow2(spec + 2))); each
    chunk stores its last min(tokens, capacity) rows at p % capacity, the second chunk wrapping
    around the ring; block 0 (the null block) is never written (its slots are -1)."""
    w, spec_tokens = 8, 7
    capacity = max(8, next_pow2(spec_tokens + 2))
    assert capacity == 16
    lay = kvf.CompressorStateV41(head_dim=w, page_size=capacity)
    cache = lay.allocate(3).fill_(1.5)  # block 0 null, blocks 1 and 2 the requests' rings
    expect = cache.clone()
    for chunk, (start, tokens) in enumerate([(0, 21), (21, 11)]):  # positions [start, start + tokens)
        for block in (1, 2):
            pos = torch.arange(start, start + tokens)
            kv = special_rows(tokens, w, seed=10 * chunk + block).to(dtype)
            score = special_rows(tokens, w, seed=10 * chunk + block + 5).to(dtype)
            kept = pos >= start + tokens - min(tokens, capacity)
            slots = torch.where(kept, block * capacity + pos % capacity, -1)
            slots[0] = -1  # and a hole anywhere else
            lay.encode((kv, score), cache, slots)
            for i in range(tokens):
                if slots[i] >= 0:
                    expect[block, int(pos[i]) % capacity] = torch.cat([kv[i].float(), score[i].float()])
    assert torch.equal(f32_bits(cache), f32_bits(expect))
    assert torch.equal(f32_bits(cache[0]), f32_bits(torch.full((capacity, 2 * w), 1.5)))
    # the wrap-around: position 21 + 10 = 31 overwrote slot 31 % 16 = 15 of chunk 0's position 15
    kv_last = special_rows(11, w, seed=10 + 1).to(dtype).float()
    assert torch.equal(f32_bits(cache[1, 15, :w]), f32_bits(kv_last[10]))


def test_float32_inputs_are_stored_bit_for_bit_and_decode_gives_them_back():
    lay = kvf.CompressorStateV41(head_dim=16, page_size=2)  # tokenspeed 0.1.4: page slot // 2, row slot % 2
    kv, score = special_rows(5, 16, seed=1), special_rows(5, 16, seed=2)
    score[0] = -0.0
    slots = torch.tensor([3, -1, 0, 6, 5])
    cache = lay.allocate(4)
    lay.encode((kv, score), cache, slots)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            row = cache[s // 2, s % 2]
            assert torch.equal(f32_bits(row[:16]), f32_bits(kv[i])) and torch.equal(f32_bits(row[16:]), f32_bits(score[i]))
    assert torch.signbit(cache[1, 1, 16:]).all()  # -0.0 scores stay -0.0
    got_kv, got_score = lay.decode(cache, slots)
    live = slots >= 0
    assert torch.equal(f32_bits(got_kv[live]), f32_bits(kv[live]))
    assert torch.equal(f32_bits(got_score[live]), f32_bits(score[live]))
    assert not f32_bits(got_kv[~live]).any() and not f32_bits(got_score[~live]).any()
    rows = lay.gather(cache, slots)
    assert rows.dtype == torch.uint8 and rows.shape == (5, 128)
    assert torch.equal(rows[live].view(torch.int32), torch.cat([f32_bits(kv), f32_bits(score)], 1)[live])


def test_it_differs_from_compressor_state_by_the_signed_zero_score():
    """compressor_state(ratio=128, head_dim=512) has the same 4096 B row, but stores score + ape:
    with an all-zero APE a -0.0 score becomes +0.0; the V4.1 ring keeps it."""
    v4, v41 = kvf.CompressorState(ratio=128, head_dim=8, page_size=8), kvf.CompressorStateV41(head_dim=8)
    assert v4.row_bytes == v41.row_bytes and v4.page_bytes == v41.page_bytes
    kv, score = torch.randn(2, 8), torch.full((2, 8), -0.0)
    a, b = v4.allocate(1), v41.allocate(1)
    slots = torch.tensor([0, 5])
    v4.encode((kv, score), a, slots, positions=torch.tensor([0, 5]), ape=torch.zeros(128, 8))
    v41.encode((kv, score), b, slots)
    assert torch.equal(a[0, :, :8], b[0, :, :8])
    assert not torch.signbit(a[0, slots, 8:]).any() and torch.signbit(b[0, slots, 8:]).all()


def test_encode_takes_no_keyword_arguments_and_a_pair():
    lay = kvf.CompressorStateV41(head_dim=8, page_size=4)
    cache = lay.allocate(2)
    kv, score, slots = torch.randn(3, 8), torch.randn(3, 8), torch.arange(3)
    for kwargs in (dict(positions=torch.arange(3)), dict(ape=torch.zeros(2, 8)),
                   dict(positions=torch.arange(3), ape=torch.zeros(2, 8))):
        with pytest.raises(InputError, match="no keyword arguments"):
            lay.encode((kv, score), cache, slots, **kwargs)
    for x in (kv, (kv,), (kv, score, score), [kv, score]):
        with pytest.raises(InputTypeError, match=r"x = \(kv, score\)"):
            lay.encode(x, cache, slots)
    with pytest.raises(InputError):
        lay.encode((kv, torch.randn(3, 16)), cache, slots)  # score of another width
    with pytest.raises(InputError):
        lay.encode((kv, torch.randn(2, 8)), cache, slots)  # score of another row count
    with pytest.raises(InputError):
        lay.encode((torch.randn(3, 8, dtype=torch.float64), score), cache, slots)
    assert not cache.view(torch.int32).any()  # nothing written by a refused call


def test_example_encode_args_decode_back_exactly():
    lay = kvf.CompressorStateV41(head_dim=4, page_size=3)
    g = torch.Generator().manual_seed(0)
    x, kwargs, ref = lay.examples.encode_args(5, None, g)
    assert kwargs == {}
    cache = lay.allocate(2)
    slots = torch.tensor([0, 2, 4, 5, -1])
    lay.encode(x, cache, slots, **kwargs)
    kv, score = lay.decode(cache, slots)
    assert torch.equal(torch.cat([kv, score], 1)[:4], ref[:4])
