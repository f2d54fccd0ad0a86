"""Hypothesis strategies for fuzzing anything that reads or writes kvformats caches.

    from hypothesis import given, strategies as st
    from kvformats.testing import strategies as kst

    @given(kst.layouts(), st.data())
    def test_my_kernel(layout, data):
        x = data.draw(kst.rows(layout, n=3))                     # [3, head_dim]
        slots = data.draw(kst.slot_mappings(4 * layout.page_size, 3))
        cache = data.draw(kst.caches(layout, num_pages=4))       # sentinel-filled, padded stride

Every strategy validates its arguments when called (``kvformats.errors.StrategyArgumentError``, a
``hypothesis.errors.InvalidArgument``) and returns a strategy. Row values are finite and built
from adversarial blocks (exact rounding ties, block maxima of ``max * 2^k``, zero and -0.0
blocks, subnormals, a single huge outlier, float32 values one ulp above ``max * 2^k``) mixed
with random blocks. Importing this module needs hypothesis (``pip install
'kvformats[strategies]'``); ``import kvformats`` does not import it.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from kvformats.codec.registry import get_format, list_formats
from kvformats.errors import StrategyArgumentError
from kvformats.formats import CompressorState, CompressorStateV41
from kvformats.layout import Layout, storage_bytes
from kvformats.numerics.elements import ELEMENTS
from kvformats.validation import FLOAT_DTYPES

__all__ = ["BLOCK_KINDS", "SENTINELS", "StrategyArgumentError", "caches", "encode_args", "layouts", "rows",
           "slot_mappings", "state_inputs"]

SENTINELS = (0x00, 0xA5, 0xCC, 0xDD, 0xFF)
BLOCK_KINDS = ("random", "zero", "max", "ties", "subnormal", "outlier", "ulp_above_max", "tiny")
_RANDOM_WEIGHT = 3  # random blocks appear this many times as often as each adversarial kind

def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise StrategyArgumentError(f"{name} must be an int {bound}, got {value!r}")


def _check_layout(layout) -> None:
    if not isinstance(layout, Layout):
        raise StrategyArgumentError(f"layout must be a kvformats Layout (e.g. kvformats.get_format(...)), "
                                    f"got {type(layout).__name__} {layout!r}")


def _check_dtype(dtype) -> None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise StrategyArgumentError(f"dtype must be None or one of torch.bfloat16, torch.float16, "
                                    f"torch.float32, got {dtype!r}")


def layouts(formats=None) -> st.SearchStrategy[Layout]:
    """Layouts of the registered formats (all of them for None; a name or a list of names),
    with default and valid non-default parameters: page sizes 1..64 (1..8 for
    compressor_state), fp8_ds_mla head_dim/rope_dim such as 192/64, indexer head_dim 32..256,
    compressor_state ratio 4 or 128 with small head_dim: each format's declared
    ``examples.params`` and ``examples.page_size_range`` (a format that declares none is drawn
    with its defaults and a page_size in 1..64 when it accepts one)."""
    names = list_formats() if formats is None else [formats] if isinstance(formats, str) else formats
    try:
        names = list(names)
    except TypeError:
        raise StrategyArgumentError(f"formats must be None, a format name or a list of names, "
                                    f"got {formats!r}") from None
    if not names:
        raise StrategyArgumentError("formats must name at least one format")
    unknown = [n for n in names if n not in list_formats()]
    if unknown:
        raise StrategyArgumentError(f"unknown formats {unknown!r}; registered formats: {list_formats()}")
    return st.one_of([_layouts_of(name) for name in names])


def _layouts_of(name: str) -> st.SearchStrategy[Layout]:
    cls = type(get_format(name))
    params = st.sampled_from(cls.examples.params)
    sizes = st.integers(*cls.examples.page_size_range)

    def build(p: dict, page_size: int) -> Layout:
        try:
            return get_format(name, **p, page_size=page_size)
        except (TypeError, ValueError):  # a future format with other page-size rules
            return get_format(name, **p)

    return st.builds(build, params, sizes)


# ----- row values -------------------------------------------------------------------------------
def _quantized_region(layout: Layout):
    """The first block-scaled data region (None for a layout that stores exact values)."""
    return next((r for r in layout.data_regions if r.scale), None)


def _element_type(layout: Layout):
    """(element max, rounding midpoints/thresholds, smallest normal) of the layout's codes, from
    its quantized region's element type (e4m3's for a layout without one)."""
    region = _quantized_region(layout)
    grid_type = region.element if region is not None else ELEMENTS["float8_e4m3fn"]
    grid = grid_type.grid
    if grid is None:
        raise StrategyArgumentError(f"{layout.name}: the scaled region's element type {grid_type.name} has no grid")
    codes = grid_type.positive_codes()
    return grid.max, (codes[:-1] + codes[1:]) / 2, grid.smallest_normal


def _block_size(layout: Layout) -> int:
    region = _quantized_region(layout)
    return region.block if region is not None else 32


def _input_width(layout: Layout) -> int:
    return layout.width if isinstance(layout, (CompressorState, CompressorStateV41)) else layout.head_dim


def _k_range(dtype: torch.dtype, element_max: float) -> tuple[int, int]:
    """Exponents k keeping ``element_max * 2^k`` (and one ulp above) finite in ``dtype``, and
    keeping block scales above every format's absmax/scale floor."""
    if dtype == torch.float16:
        return -12, int(math.floor(math.log2(65504.0 / element_max))) - 1
    return -12, 40


def _block(kind: str, k: int, size: int, dtype, etype, g: torch.Generator) -> torch.Tensor:
    element_max, mids, smallest_normal = etype
    top = element_max * 2.0**k
    sign = torch.where(torch.rand(size, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    u = torch.rand(size, generator=g, dtype=torch.float64)
    at = int(torch.randint(size, (1,), generator=g))
    if kind == "random":
        return (sign * u * top * 2.0 ** -int(torch.randint(0, 20, (1,), generator=g))).float()
    if kind == "zero":
        return (sign * 0.0).float()
    if kind == "tiny":  # subnormal magnitudes of the input dtype itself
        tiny = 2.0**-14 if dtype == torch.float16 else 2.0**-126
        return (sign * u * tiny).float()
    if kind == "ties":
        v = sign * mids[torch.randint(len(mids), (size,), generator=g)] * 2.0**k
    elif kind == "subnormal":  # magnitudes below the element type's smallest normal after scaling
        v = sign * u * smallest_normal * 2.0**k
    elif kind == "outlier":
        v = sign * u * top * 2.0**-20
    else:  # "max", "ulp_above_max"
        v = sign * u * top
    v = v.float()
    peak = torch.tensor(top, dtype=torch.float32)
    if kind == "ulp_above_max":  # the float32 log2 rounds onto k here (design.md, Numerics)
        peak = torch.nextafter(peak, torch.tensor(math.inf))
    v[at] = peak * sign[at]
    return v


def _row_values(layout: Layout, n: int, dtype, seed: int, kinds: list, ks: list) -> torch.Tensor:
    width, size = _input_width(layout), _block_size(layout)
    etype = _element_type(layout)
    g = torch.Generator().manual_seed(seed)
    blocks = [_block(kind, k, size, dtype, etype, g) for kind, k in zip(kinds, ks)]
    if n == 0:
        return torch.zeros((0, width), dtype=dtype)
    return torch.cat(blocks).reshape(n, -1)[:, :width].to(dtype).contiguous()


@st.composite
def _rows(draw, layout: Layout, n, dtype):
    n = draw(st.integers(1, 4)) if n is None else n
    dtype = draw(st.sampled_from(FLOAT_DTYPES)) if dtype is None else dtype
    element_max = _element_type(layout)[0]
    k_lo, k_hi = _k_range(dtype, element_max)
    per_row = -(-_input_width(layout) // _block_size(layout))
    kind = st.sampled_from(("random",) * _RANDOM_WEIGHT + BLOCK_KINDS[1:])
    kinds = draw(st.lists(kind, min_size=n * per_row, max_size=n * per_row))
    ks = draw(st.lists(st.integers(k_lo, k_hi), min_size=n * per_row, max_size=n * per_row))
    seed = draw(st.integers(0, 2**32 - 1))
    return _row_values(layout, n, dtype, seed, kinds, ks)


def rows(layout: Layout, n: int | None = None, dtype: torch.dtype | None = None) -> st.SearchStrategy[torch.Tensor]:
    """Finite row inputs for ``layout``: a ``dtype`` tensor ``[n, head_dim]`` (``[n, W]`` for
    compressor_state: one of kv or score). ``n`` None draws 1..4 rows; ``dtype`` None draws
    bf16, fp16 or fp32. Rows are blocks (of the format's quantization block) of the kinds in
    ``BLOCK_KINDS``, exponents ``k`` chosen so every value stays finite in ``dtype``."""
    _check_layout(layout)
    if n is not None:
        _check_int("n", n, 0)
    _check_dtype(dtype)
    return _rows(layout, n, dtype)


@st.composite
def _state_inputs(draw, layout: CompressorState, n, dtype):
    n = draw(st.integers(1, 4)) if n is None else n
    dtype = draw(st.sampled_from(FLOAT_DTYPES)) if dtype is None else dtype
    kv = draw(_rows(layout, n, dtype))
    score = draw(_rows(layout, n, dtype))
    positions = torch.tensor(draw(st.lists(st.integers(0, 2**20), min_size=n, max_size=n)), dtype=torch.int64)
    ape = draw(_rows(layout, layout.ratio, dtype))
    return {"kv": kv, "score": score, "positions": positions, "ape": ape}


def state_inputs(layout: CompressorState, n: int | None = None,
                 dtype: torch.dtype | None = None) -> st.SearchStrategy[dict]:
    """compressor_state encode inputs: a dict with ``kv``, ``score`` (``dtype [n, W]``),
    ``positions`` (int64 ``[n]``, non-negative) and ``ape`` (``dtype [ratio, W]``, checkpoint
    order). Pass as ``encode((d["kv"], d["score"]), cache, slots, positions=..., ape=...)``."""
    if not isinstance(layout, CompressorState):
        raise StrategyArgumentError(f"state_inputs needs a CompressorState layout, got {layout!r}")
    if n is not None:
        _check_int("n", n, 0)
    _check_dtype(dtype)
    return _state_inputs(layout, n, dtype)


@st.composite
def _ring_inputs(draw, layout: CompressorStateV41, n, dtype):
    n = draw(st.integers(1, 4)) if n is None else n
    dtype = draw(st.sampled_from(FLOAT_DTYPES)) if dtype is None else dtype
    return (draw(_rows(layout, n, dtype)), draw(_rows(layout, n, dtype))), {}


def encode_args(layout: Layout, n: int | None = None,
                dtype: torch.dtype | None = None) -> st.SearchStrategy[tuple]:
    """``(x, kwargs)`` such that ``layout.encode(x, cache, slots, **kwargs)`` is valid for any
    format: ``rows`` for the byte formats, ``((kv, score), {positions, ape})`` for the state,
    ``((kv, score), {})`` for the V4.1 ring state (compressor_state_v41)."""
    if isinstance(layout, CompressorStateV41):
        if n is not None:
            _check_int("n", n, 0)
        _check_dtype(dtype)
        return _ring_inputs(layout, n, dtype)
    if isinstance(layout, CompressorState):
        return state_inputs(layout, n, dtype).map(
            lambda d: ((d["kv"], d["score"]), {"positions": d["positions"], "ape": d["ape"]}))
    return rows(layout, n, dtype).map(lambda x: (x, {}))


# ----- slots and caches -------------------------------------------------------------------------
@st.composite
def _slot_mappings(draw, capacity: int, n: int, dtype):
    dtype = draw(st.sampled_from((torch.int32, torch.int64))) if dtype is None else dtype
    min_holes = max(0, n - capacity)
    holes = draw(st.integers(min_holes, n))
    targets = [] if holes == n else draw(
        st.lists(st.integers(0, capacity - 1), unique=True, min_size=n - holes, max_size=n - holes))
    values = targets + [-1] * holes
    order = draw(st.permutations(range(n)))
    return torch.tensor([values[i] for i in order], dtype=dtype)


def slot_mappings(capacity: int, n: int, dtype: torch.dtype | None = None) -> st.SearchStrategy[torch.Tensor]:
    """int32 or int64 (``dtype`` None draws either) slot tensors ``[n]`` for a cache of
    ``capacity`` rows: distinct targets in ``[0, capacity)`` with ``-1`` holes anywhere; at least
    ``n - capacity`` holes, never a repeated non-negative slot."""
    _check_int("capacity", capacity, 0)
    _check_int("n", n, 0)
    if dtype is not None and dtype not in (torch.int32, torch.int64):
        raise StrategyArgumentError(f"dtype must be None, torch.int32 or torch.int64, got {dtype!r}")
    return _slot_mappings(capacity, n, dtype)


@st.composite
def _caches(draw, layout: Layout, num_pages, sentinel, guard_pages):
    num_pages = draw(st.integers(1, 4)) if num_pages is None else num_pages
    sentinel = draw(st.sampled_from(SENTINELS)) if sentinel is None else sentinel
    item = torch.empty(0, dtype=layout.container_dtype).element_size()
    page_elems = math.prod(layout.cache_shape(1)[1:])
    # Pads keep 4-byte alignment so typed views (bf16 rope, float32 scales) stay valid.
    pad_bytes = draw(st.one_of(st.integers(1, 16), st.integers(17, 1200))) * 4
    stride = page_elems + max(pad_bytes // item, 1)
    lead = draw(st.integers(0, 1)) if guard_pages is None else guard_pages
    arena = layout.allocate(num_pages + 2 * lead, page_stride=stride)
    storage_bytes(arena).fill_(sentinel)
    return arena[lead:lead + num_pages]


def caches(layout: Layout, num_pages: int | None = None, *, sentinel: int | None = None,
           guard_pages: int | None = None) -> st.SearchStrategy[torch.Tensor]:
    """Caches from ``layout.allocate(..., page_stride=...)`` with a page stride wider than a page
    (4..4800 bytes of padding) and every byte of the underlying arena, padding included, set to
    ``sentinel`` (drawn from ``SENTINELS`` for None). ``num_pages`` None draws 1..4 pages;
    ``guard_pages`` (0 or 1, None draws) extra sentinel pages sit before and after the cache in
    the same arena. Byte formats: uint8 ``[num_pages, page_bytes]``; compressor_state: float32
    ``[num_pages, page_size, 2W]``. Use ``storage_bytes(cache)`` to compare the whole arena."""
    _check_layout(layout)
    if num_pages is not None:
        _check_int("num_pages", num_pages, 0)
    if sentinel is not None:
        _check_int("sentinel", sentinel, 0, 255)
    if guard_pages is not None:
        _check_int("guard_pages", guard_pages, 0, 1)
    return _caches(layout, num_pages, sentinel, guard_pages)
