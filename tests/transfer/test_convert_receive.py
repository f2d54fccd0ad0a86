"""Across record layouts (issue 45): the receiver lands the source's bytes in a staging cache of
the source's layout, verifies them, then converts into its own pages; lossy conversions only on
request; a record with no declared conversion is refused naming both identities."""

from __future__ import annotations

import pytest
import torch

from kvformats.codec.convert import convert_rows
from kvformats.errors import ConversionError, HandshakeError, IntegrityError
from kvformats.formats import (Fp4DsMlaV41, Fp4DsMlaV41Interleaved, Fp8DsMla, Fp8DsMlaV32, Fp8DsMlaV41,
                               Fp8DsMlaV41Interleaved)
from kvformats.transfer import (conversion_route, describe_caches, expected_checksums, plan_transfer,
                                receive_converted, staging_for)
from tests.harness.plan_apply import apply

TOKENS = 150
SRC_PAGES = [5, 2, 0]  # three pages of 64 rows hold 150 rows




def slots(pages, page: int, n: int = TOKENS) -> torch.Tensor:
    t = torch.arange(n)
    return torch.as_tensor(pages)[t // page] * page + t % page


def values(n: int = TOKENS, dim: int = 512, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, dim, generator=g) * torch.rand(n, 1, generator=g) * 4).to(torch.bfloat16)


def source(layout, x: torch.Tensor, pages: int = 6) -> dict:
    cache = layout.allocate(pages)
    layout.encode(x, cache, slots(SRC_PAGES, layout.page_size, x.shape[0]))
    return {"kv": (layout, cache)}


def land_in_staging(src: dict, *, corrupt=None):
    """What the sender and the receiver do up to the conversion: a staging cache of the source's
    layout, a plan into it, the sender's checksums, the bytes moved (``corrupt``: flip one staging
    byte afterwards, a (page, offset) pair)."""
    desc = describe_caches(src)["kv"]
    n = -(-TOKENS // src["kv"][0].page_size)
    layout, cache, staging_desc = staging_for(desc, n)
    staging = {"kv": (layout, cache)}
    plan = plan_transfer({"kv": desc}, {"kv": staging_desc}, {"kv": SRC_PAGES}, {"kv": list(range(n))},
                         tokens=TOKENS)
    sums = expected_checksums(plan, src)
    apply(plan, src, staging)
    if corrupt is not None:
        cache[corrupt] ^= 0x40
    return plan, staging, sums


PAIRS = [
    (Fp8DsMlaV41(page_size=64, profile="flashmla"), Fp8DsMlaV41Interleaved(page_size=32, profile="flashmla")),
    (Fp8DsMlaV41Interleaved(page_size=64), Fp8DsMlaV41(page_size=128, profile="flashmla")),
    (Fp4DsMlaV41(page_size=64), Fp4DsMlaV41Interleaved(page_size=64, profile="tokenspeed")),
    (Fp4DsMlaV41Interleaved(page_size=64, profile="tokenspeed"), Fp4DsMlaV41(page_size=32)),
]


@pytest.mark.parametrize("src_layout,dst_layout", PAIRS, ids=lambda lay: f"{lay.name}/{lay.page_size}")
def test_two_layouts_of_one_record_convert_exactly_on_receive(src_layout, dst_layout):
    """Planar <-> interleaved (fp8 and fp4 V4.1): the destination bytes equal encoding the same
    values directly into the destination layout, and decode equal bit for bit."""
    x = values()
    src = source(src_layout, x)
    dst_layout_cache = dst_layout.allocate(12)
    direct = dst_layout.allocate(12)
    there = slots([7, 3, 10, 0, 5][:-(-TOKENS // dst_layout.page_size)], dst_layout.page_size)
    dst_layout.encode(x, direct, there)
    dst = {"kv": (dst_layout, dst_layout_cache)}
    src_desc, dst_desc = describe_caches(src)["kv"], describe_caches(dst)["kv"]
    assert conversion_route(src_desc, dst_desc) == "convert-exact"
    with pytest.raises(HandshakeError, match="record"):  # no page moves between them directly
        plan_transfer({"kv": src_desc}, {"kv": dst_desc}, {"kv": SRC_PAGES}, {"kv": [0]},
                      tokens=TOKENS)
    plan, staging, sums = land_in_staging(src)
    receive_converted(plan, staging, sums, dst, {"kv": there})
    assert torch.equal(dst_layout_cache, direct)
    got, want = dst_layout.decode(dst_layout_cache, there), src_layout.decode(src["kv"][1], slots(SRC_PAGES, 64))
    got, want = (got, want) if isinstance(got, torch.Tensor) else (got[0], want[0])
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_a_corrupted_staging_byte_is_named_and_nothing_is_written():
    src_layout, dst_layout = PAIRS[0]
    src = source(src_layout, values(seed=1))
    # staging page 1 holds request rows [64, 128); byte 10 of its row 6 lies in the data record
    plan, staging, sums = land_in_staging(src, corrupt=(1, 6 * 512 + 10))
    dst_cache = dst_layout.allocate(8)
    with pytest.raises(IntegrityError, match=r"staging cache 'kv': request rows \[64, 128\), region "
                                             r"'values'.*nothing was written"):
        receive_converted(plan, staging, sums, {"kv": (dst_layout, dst_cache)}, {"kv": slots(range(5), 32)})
    assert not dst_cache.any()


def lossy_values(n: int = TOKENS) -> torch.Tensor:
    """V4 rows whose 64-blocks of one 128-tile have other exponents: not exact in V3.2's tiles."""
    x = values(n, 512, seed=2).float()
    x[:, 64:128] *= 1e-3
    return x.to(torch.bfloat16)


def test_a_lossy_conversion_needs_the_explicit_option():
    src_layout, dst_layout = Fp8DsMla(page_size=64), Fp8DsMlaV32(page_size=64)
    src = source(src_layout, lossy_values())
    dst_cache = dst_layout.allocate(4)
    dst = {"kv": (dst_layout, dst_cache)}
    assert conversion_route(describe_caches(src)["kv"], describe_caches(dst)["kv"]) == "convert-lossy"
    plan, staging, sums = land_in_staging(src)
    there = slots([3, 1, 0], 64)
    with pytest.raises(ConversionError, match="exact=False"):
        receive_converted(plan, staging, sums, dst, {"kv": there})
    assert not dst_cache.any()  # refused before any write
    receive_converted(plan, staging, sums, dst, {"kv": there}, exact=False)
    want = convert_rows(src_layout, src_layout.gather(src["kv"][1], slots(SRC_PAGES, 64)), dst_layout)
    assert torch.equal(dst_layout.gather(dst_cache, there), want)
    # the declared bound (kvformats.codec.convert): each value within max(|x|/16, the tile's step)
    x = src_layout.decode(src["kv"][1], slots(SRC_PAGES, 64)).float()
    y = dst_layout.decode(dst_cache, there).float()
    nope = (y[:, :448] - x[:, :448]).abs()
    assert bool((nope <= x[:, :448].abs() / 16 + x[:, :128].abs().amax(1, keepdim=True) / 2 ** 7).all())
    assert torch.equal(y[:, 512:], x[:, 448:])  # RoPE copied


def test_one_refused_cache_writes_no_cache():
    """Two caches, the second's conversion inexact: the first is not written either."""
    a_src, a_dst = PAIRS[0]
    b_src, b_dst = Fp8DsMla(page_size=64), Fp8DsMlaV32(page_size=64)
    src = {"a": (a_src, source(a_src, values(seed=3))["kv"][1]), "b": (b_src, source(b_src, lossy_values())["kv"][1])}
    descs = describe_caches(src)
    staged = {name: staging_for(descs[name], 3) for name in src}
    staging = {name: (lay, cache) for name, (lay, cache, _) in staged.items()}
    plan = plan_transfer(descs, {name: d for name, (_, _, d) in staged.items()}, {n: SRC_PAGES for n in src},
                         {n: [0, 1, 2] for n in src}, tokens=TOKENS)
    sums = expected_checksums(plan, src)
    apply(plan, src, staging)
    dst = {"a": (a_dst, a_dst.allocate(5)), "b": (b_dst, b_dst.allocate(3))}
    with pytest.raises(ConversionError):
        receive_converted(plan, staging, sums, dst, {"a": slots(range(5), 32), "b": slots(range(3), 64)})
    assert not any(cache.any() for _, cache in dst.values())


def test_a_record_without_conversion_is_refused_naming_both():
    a = {"kv": (Fp8DsMlaV41(page_size=64), Fp8DsMlaV41(page_size=64).allocate(2))}
    b = {"kv": (Fp4DsMlaV41(page_size=64), Fp4DsMlaV41(page_size=64).allocate(2))}
    with pytest.raises(HandshakeError, match=r"fp8_ds_mla_v41\(.*fp4_ds_mla_v41\(.*no conversion"):
        conversion_route(describe_caches(a)["kv"], describe_caches(b)["kv"])


def test_one_record_in_another_geometry_needs_no_conversion():
    a = {"kv": (Fp8DsMlaV41(page_size=64), Fp8DsMlaV41(page_size=64).allocate(2))}
    b = {"kv": (Fp8DsMlaV41(page_size=32), Fp8DsMlaV41(page_size=32).allocate(4))}
    assert conversion_route(describe_caches(a)["kv"], describe_caches(b)["kv"]) == "same"
    other_profile = {"kv": (Fp8DsMlaV41Interleaved(page_size=64), Fp8DsMlaV41Interleaved(page_size=64).allocate(2))}
    # the same record in another layout and profile: a declared re-quantization, exact only per data
    assert conversion_route(describe_caches(a)["kv"], describe_caches(other_profile)["kv"]) == "convert-lossy"
