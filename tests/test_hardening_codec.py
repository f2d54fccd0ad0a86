"""Issue #25, codec side: layout parameters are exact ints with bounded pages."""

import json

import pytest
import torch

import kvformats as kvf
from kvformats import torch_ops as kops

INT_PARAMS = [(name, field) for name in kvf.list_formats()
              for field, value in kvf.get_format(name).params.items() if isinstance(value, int)]


# ----- item 6: exact-int parameters, bounded pages -------------------------------------------------
@pytest.mark.parametrize("name, field", INT_PARAMS)
@pytest.mark.parametrize("kind", [float, bool])
def test_int_parameters_refuse_floats_and_bools(name, field, kind):
    value = kvf.get_format(name).params[field]
    bad = float(value) if kind is float else True
    with pytest.raises(kvf.LayoutError, match=field) as info:
        kvf.get_format(name, **{field: bad})
    assert type(bad).__name__ in str(info.value)


def test_float_ratio_is_refused_and_cannot_poison_the_op_layout_cache():
    with pytest.raises(kvf.LayoutError, match=r"ratio must be one of 4, 128 \(an int\), got 4.0 \(float\)"):
        kvf.CompressorState(ratio=4.0)
    with pytest.raises(kvf.LayoutError, match="bool"):
        kvf.CompressorState(ratio=True)
    lay = kvf.CompressorState(ratio=4, page_size=2)
    assert json.loads(kops.layout_key(lay)[1])["ratio"] == 4
    w = lay.width
    cache = lay.allocate(2)
    kv, score = torch.randn(3, w), torch.randn(3, w)
    kops.encode(lay, (kv, score), cache, torch.tensor([0, 2, 3]), positions=torch.arange(3), ape=torch.zeros(4, w))
    got_kv, _ = kops.decode(lay, cache, torch.tensor([0, 2, 3]))
    assert torch.equal(got_kv, kv)


@pytest.mark.parametrize("name", kvf.list_formats())
def test_huge_page_size_is_a_layout_error_at_construction(name):
    with pytest.raises(kvf.LayoutError, match="page_size") as info:
        kvf.get_format(name, page_size=2**62)
    assert "2**63 - 1" in str(info.value)
    lay = kvf.get_format(name, page_size=2**20)  # large but representable: fine
    assert lay.page_bytes < 2**63


def test_allocate_bounds_the_arena_and_takes_exact_ints():
    lay = kvf.Fp8Indexer(page_size=2**40)
    with pytest.raises(kvf.LayoutError, match="allocate fewer pages"):
        lay.allocate(2**30)
    with pytest.raises(kvf.LayoutError, match="num_pages"):
        lay.allocate(2.0)
    with pytest.raises(kvf.LayoutError, match="page_stride"):
        kvf.Fp8Indexer().allocate(2, page_stride=True)
    assert kvf.Fp8Indexer(page_size=2).allocate(0).shape == (0, 264)
