"""Converters: exactness where claimed, the documented bound where not, typed errors with
nothing written."""

import pytest
import torch

import kvformats as kvf
from kvformats.codec import convert as cv

V4, V32, V32V = kvf.Fp8DsMla(page_size=4), kvf.Fp8DsMlaV32(page_size=4), kvf.Fp8DsMlaV32(page_size=4, profile="vllm")


def mixed(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-12, 12, (n, d // 64), generator=g).float()).repeat_interleave(64, 1)
    return x.to(torch.bfloat16)


def test_v32_flashmla_to_v4_is_exact_and_v4_round_trip_is_identity():
    x = mixed(8, 512)
    r4 = V4.encode_rows(x)
    r32 = cv.convert_rows(V4, r4, V32)  # lossy in general (blocks of a tile differ by up to 2^23)
    back = cv.convert_rows(V32, r32, V4, exact=True)
    dec32 = V32.decode_rows(r32)
    assert torch.equal(V4.decode_rows(back).view(torch.int16)[:, :448], dec32.view(torch.int16)[:, :448])
    assert torch.equal(back[:, 448:576], r4[:, 448:576])  # RoPE bytes copied
    assert int(dec32[:, 448:512].count_nonzero()) == 0  # V3.2 NoPE 448..511 are zero


def test_v4_to_v32_bound_and_exact_refusal():
    x = mixed(8, 512, seed=1)
    r4 = V4.encode_rows(x)
    src = V4.decode_rows(r4).double()
    with pytest.raises(cv.ConversionError, match="exact=False"):
        cv.convert_rows(V4, r4, V32, exact=True)
    r32 = cv.convert_rows(V4, r4, V32)
    got = V32.decode_rows(r32).double()
    s = r32[:, 512:528].contiguous().view(torch.float32).double().repeat_interleave(128, 1)[:, :448]
    err = (got[:, :448] - src[:, :448]).abs()
    assert bool((err <= torch.maximum(src[:, :448].abs() / 16, s * 2.0**-10)).all())


def test_v4_to_v32_exact_when_blocks_share_an_exponent():
    x = (torch.randn(4, 512) * 3).to(torch.bfloat16)
    x[:, :448] = x[:, :448].sign() * x[:, :448].abs().clamp(1, 3.5)  # every block's amax in (1.75, 3.5]
    x[:, 0::64] = 3.5
    r4 = V4.encode_rows(x)
    r32 = cv.convert_rows(V4, r4, V32, exact=True)
    assert torch.equal(V32.decode_rows(r32)[:, :448].view(torch.int16), V4.decode_rows(r4)[:, :448].view(torch.int16))


def test_v32_to_v4_drops_nonzero_dims_only_when_not_exact():
    x = mixed(4, 576)
    r = V32.encode_rows(x)
    with pytest.raises(cv.ConversionError, match="448..511"):
        cv.convert_rows(V32, r, V4, exact=True)
    assert cv.convert_rows(V32, r, V4).shape == (4, 584)


def test_profile_conversions():
    x = mixed(4, 576)
    rv = V32V.encode_rows(x)
    with pytest.raises(cv.ConversionError, match="not exact"):
        cv.convert_rows(V32V, rv, V32, exact=True)
    r = V32.encode_rows(x)
    with pytest.raises(cv.ConversionError, match="not exact"):  # amax/448 grid != power-of-two grid
        cv.convert_rows(V32, r, V32V, exact=True)
    assert torch.equal(cv.convert_rows(V32, r, V32, exact=True), r)  # same profile: identity
    src = V32.decode_rows(r).double()
    got = V32V.decode_rows(cv.convert_rows(V32, r, V32V)).double()
    s = cv.convert_rows(V32, r, V32V)[:, 512:528].contiguous().view(torch.float32).double().repeat_interleave(128, 1)
    bound = torch.maximum(src[:, :512].abs() / 16, s * 2.0**-10) + 2.0**-8 * torch.maximum(src, got)[:, :512].abs()
    assert bool(((got - src)[:, :512].abs() <= bound).all())


def test_unsupported_pairs_and_bad_rows():
    with pytest.raises(cv.ConversionError, match="supported"):
        cv.convert_rows(kvf.Fp8Indexer(), torch.zeros(1, 132, dtype=torch.uint8), kvf.Mxfp4Indexer())
    with pytest.raises(kvf.InputError):
        cv.convert_rows(V4, torch.zeros(1, 583, dtype=torch.uint8), V32)


def test_convert_slots_writes_nothing_on_error():
    x = mixed(4, 576)
    src_cache, dst_cache = V32V.allocate(1), V32.allocate(1)
    V32V.encode(x, src_cache, torch.arange(4))
    dst_cache.fill_(0xA5)
    before = dst_cache.clone()
    with pytest.raises(cv.ConversionError):
        cv.convert_slots(V32V, src_cache, torch.arange(4), V32, dst_cache, torch.arange(4), exact=True)
    assert torch.equal(dst_cache, before)
    cv.convert_slots(V32V, src_cache, torch.tensor([0, -1, 2, 3]), V32, dst_cache, torch.tensor([3, 2, 1, 0]))
    assert torch.equal(dst_cache[0, 2 * 656:3 * 656], before[0, 2 * 656:3 * 656])  # slot -1 skipped
    assert not torch.equal(dst_cache[0, :656], before[0, :656])


def test_ue8m0_pack_unpack():
    s = torch.tensor([[0x7F, 0x80, 0x70, 0x75], [1, 2, 3, 4]], dtype=torch.uint8)
    w = cv.pack_ue8m0(s)
    assert w[0, 0].item() == 0x7570807F  # spec/upstream.md §12 E: DeepGEMM int32
    assert torch.equal(cv.unpack_ue8m0(w, 4), s)
    w5 = cv.pack_ue8m0(torch.arange(5, dtype=torch.uint8).reshape(1, 5))
    assert w5.shape == (1, 2) and w5.view(torch.uint8)[0, 5:].tolist() == [127] * 3
    with pytest.raises(cv.ConversionError, match="strict=False"):
        cv.unpack_ue8m0(w, 3)
    assert cv.unpack_ue8m0(w, 3, strict=False).tolist() == [[0x7F, 0x80, 0x70], [1, 2, 3]]
    # the MXFP4 page's scale records read as int32 are exactly the packed words
    lay = kvf.Mxfp4Indexer(page_size=4)
    rows = lay.encode_rows(torch.randn(3, 128))
    assert torch.equal(cv.pack_ue8m0(rows[:, 64:]), rows[:, 64:].contiguous().view(torch.int32))


@pytest.mark.parametrize("name", ["fp8_indexer", "mxfp4_indexer", "fp8_ds_mla", "fp8_ds_mla_v32"])
def test_planar_interleaved_round_trip(name):
    lay = kvf.get_format(name, page_size=4)
    cache = lay.allocate(2, page_stride=lay.page_bytes + 32)
    lay.encode(torch.randn(8, lay.head_dim), cache, torch.arange(8))
    il = cv.to_token_interleaved(lay, cache)
    assert torch.equal(il.reshape(2, 4, lay.row_bytes).reshape(8, -1), lay.gather(cache, torch.arange(8)))
    assert torch.equal(cv.to_page_planar(lay, il)[:, :lay.min_page_bytes], cache[:, :lay.min_page_bytes])
    with pytest.raises(kvf.InputError):
        cv.to_page_planar(lay, il[:, :-1])
