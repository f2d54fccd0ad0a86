"""The validation fast paths against the rules written out on their own: check_cache accepts a
cache exactly when the cache rules hold, check_tensor a tensor exactly when dtype, shape and
device match; whatever is rejected raises a typed error."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvformats as kvf
from kvformats.validation import check_cache, check_tensor

LAYOUTS = [kvf.Fp8DsMla(page_size=2), kvf.Fp8Indexer(page_size=3), kvf.Mxfp4Indexer(head_dim=64, page_size=2),
           kvf.CompressorState(head_dim=64, page_size=2)]


def rules_hold(layout, cache) -> bool:
    """design.md's cache contract: container dtype and rank, page width, contiguous rows, pages
    that do not overlap."""
    page = layout.page_shape
    if cache.dtype != layout.container_dtype or cache.dim() != 1 + len(page):
        return False
    if cache.dtype == torch.uint8:
        pages, width = cache.shape
        row_ok = cache.stride(1) == 1 or width == 1
        return width >= layout.page_size * layout.row_bytes and row_ok and (pages <= 1 or cache.stride(0) >= width)
    if list(cache.shape[1:]) != list(page) or cache.stride(2) != 1 or cache.stride(1) != page[1]:
        return False
    return cache.shape[0] <= 1 or cache.stride(0) >= page[0] * page[1]


@st.composite
def caches(draw):
    layout = draw(st.sampled_from(LAYOUTS))
    page = list(layout.page_shape)
    dtype = draw(st.sampled_from([layout.container_dtype, layout.container_dtype, torch.uint8, torch.float32,
                                  torch.int32]))
    rank = draw(st.sampled_from([1 + len(page), 1 + len(page), 1, 3]))
    shape = [draw(st.integers(0, 3))]
    for i in range(rank - 1):
        want = page[i] if i < len(page) else 2
        shape.append(draw(st.sampled_from([want, want, want + 1, max(want - 1, 1), 1])))
    dense = [1] * rank
    for i in range(rank - 2, -1, -1):
        dense[i] = dense[i + 1] * shape[i + 1]
    stride = [draw(st.sampled_from([d, d, d + draw(st.integers(1, 5)), max(d - 1, 0), 1])) for d in dense]
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    buf = torch.zeros(max(span, 1), dtype=dtype)
    return layout, buf.as_strided(shape, stride)


@settings(max_examples=400, deadline=None)
@given(caches())
def test_check_cache_accepts_exactly_what_the_rules_allow(case):
    layout, cache = case
    if rules_hold(layout, cache):
        check_cache(layout, cache)
    else:
        with pytest.raises((kvf.InputTypeError, kvf.LayoutError)):
            check_cache(layout, cache)


def test_allocated_caches_pass_and_non_tensors_raise_a_type_error():
    for layout in LAYOUTS:
        check_cache(layout, layout.allocate(3))
        check_cache(layout, layout.allocate(2, page_stride=layout.allocate(1).stride(0) + 5))
        with pytest.raises(kvf.InputTypeError):
            check_cache(layout, layout.allocate(2).tolist())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([torch.bfloat16, torch.float32, torch.int32, torch.uint8]),
       st.lists(st.integers(0, 3), min_size=0, max_size=3),
       st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=3),
       st.sampled_from(["cpu", "meta"]), st.booleans())
def test_check_tensor_accepts_exactly_matching_tensors(dtype, shape, want, device, as_list):
    t = torch.zeros(shape, dtype=dtype, device=device)
    arg = t.tolist() if as_list and device == "cpu" else t
    dtypes = (torch.bfloat16, torch.float32)
    ok = (isinstance(arg, torch.Tensor) and dtype in dtypes and len(shape) == len(want)
          and all(w is None or w == s for w, s in zip(want, shape)) and device == "cpu")
    if ok:
        check_tensor("x", arg, dtypes=dtypes, shape=tuple(want), device=torch.device("cpu"))
    else:
        with pytest.raises((kvf.InputTypeError, kvf.InputError)):
            check_tensor("x", arg, dtypes=dtypes, shape=tuple(want), device=torch.device("cpu"))
