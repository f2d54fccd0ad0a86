"""Invalid arguments of the interop API: typed errors naming the alternatives, nothing written."""

import pytest
import torch

import kvformats as kvf
from kvformats.codec import convert as cv

UNSUPPORTED = [("fp8_ds_mla", "ocp"), ("fp8_ds_mla", "deepgemm-ref"), ("fp8_ds_mla_v32", "tokenspeed"),
               ("fp8_ds_mla_v32", "ocp"), ("fp8_indexer", "flashmla-ref"), ("fp8_indexer", "ocp"),
               ("mxfp4_indexer", "flashmla-ref")]


@pytest.mark.parametrize("name, profile", UNSUPPORTED)
def test_unsupported_profile_names_the_alternatives(name, profile):
    with pytest.raises(kvf.LayoutError) as err:
        kvf.get_format(name, profile=profile)
    msg = str(err.value)
    assert f"does not apply to {name}" in msg
    for alt in kvf.supported_profiles()[name]:
        assert alt in msg


@pytest.mark.parametrize("bad", ["TOKENSPEED", "sglang", "", 3, None])
def test_unknown_profile_values(bad):
    with pytest.raises(kvf.LayoutError, match="tokenspeed"):
        kvf.Fp8DsMla(profile=bad)


def test_compressor_state_has_no_profile():
    with pytest.raises(kvf.LayoutError):
        kvf.get_format("compressor_state", profile="tokenspeed")


def test_inexact_conversion_into_a_cache_writes_nothing():
    src, dst = kvf.Fp8DsMla(page_size=4), kvf.Fp8DsMlaV32(page_size=4)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 512, generator=g) * torch.exp2(torch.arange(8).repeat_interleave(64).float() * 10))
    x = x.to(torch.bfloat16)
    sc, dc = src.allocate(1), dst.allocate(1)
    src.encode(x, sc, torch.arange(4))
    dc.fill_(0xCC)
    with pytest.raises(cv.ConversionError) as err:
        cv.convert_slots(src, sc, torch.arange(4), dst, dc, torch.arange(4), exact=True)
    assert "exact=False" in str(err.value) and isinstance(err.value, ValueError)
    assert bool((dc == 0xCC).all())


def test_bad_conversion_slots_write_nothing():
    src, dst = kvf.Fp8DsMla(page_size=4), kvf.Fp8DsMlaV32(page_size=4)
    sc, dc = src.allocate(1), dst.allocate(1)
    with pytest.raises(kvf.InputError):
        cv.convert_slots(src, sc, torch.arange(4), dst, dc, torch.tensor([0, 1, 2, 99]))
    with pytest.raises(kvf.InputError):
        cv.convert_slots(src, sc, torch.arange(4), dst, dc, torch.tensor([0, 1, 1, 2]))  # duplicate
    assert int(dc.count_nonzero()) == 0


def test_v32_triton_is_unavailable_with_the_fix_named():
    lay = kvf.Fp8DsMlaV32()
    with pytest.raises(kvf.BackendUnavailableError, match="backend='reference'"):
        lay.encode(torch.ones(1, 576), lay.allocate(1), torch.tensor([0]), backend="triton")
