"""Shared pieces of the stateful fuzzers (tests/reliability and tools/fuzz_at_scale.py).

* ``Arena``: a cache inside a sentinel-filled byte arena (guard bytes before and after, a padded
  page stride, pages possibly wider than ``min_page_bytes``) together with an *expected image*
  of every arena byte. Expected row bytes are placed by an independent offset computation
  (segment offset + row * record size), not by kvformats' row I/O. ``check()`` compares the
  whole arena: any difference is a byte changed outside the written rows (or a wrong row).
* ``Model``: per slot, the gathered row bytes that ``encode_rows`` gives for that row alone, or
  nothing (zeros) for never-written and reused slots.
* Backends: ``reference`` (public API, backend="reference") and ``triton``: the public API with
  its validation, dispatched to the Triton launchers. On CPU the launchers are registered for
  CUDA only, so ``kernel_routing`` makes ``registry.resolve`` hand them out for CPU tensors
  (run under TRITON_INTERPRET=1); with CUDA the real dispatch is used.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time

import torch

from kvformats.codec import registry
from kvformats.errors import BackendUnavailableError

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
SENTINELS = (0xA5, 0xCC, 0xDD, 0xFF)  # never 0x00: a stray zero write must show
INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

class OutOfTime(KeyboardInterrupt):
    """A fuzz run's time budget is spent (tools/fuzz_at_scale.py). A KeyboardInterrupt, so that
    hypothesis lets it through instead of reporting a failing example."""


class OpCounter(collections.Counter):
    """(format, backend, op) -> calls. Once ``deadline`` (time.monotonic) has passed, counting
    the next operation raises OutOfTime instead: a time budget stops the machines between two
    operations, at a plain Python statement, never inside one (an exception raised from a
    signal handler can land inside C code, e.g. Triton's compiler, and surface as another
    error, a false failing example)."""

    deadline = float("inf")

    def __setitem__(self, key, value):
        if time.monotonic() > self.deadline:
            raise OutOfTime()
        super().__setitem__(key, value)


# The fuzz tool prints COUNTS. MISMATCHED[0]: arena bytes that differed from the expected image
# (0 on every passing run). POOLED_APART: [values one code apart, values compared] in the
# compressed rows a kernel wrote (the pooling path's bar, kvformats.testing.tolerance; exact elsewhere).
COUNTS = OpCounter()
MISMATCHED = [0]
ARENA_BYTES_CHECKED = [0]
POOLED_APART = [0, 0]


# ----- backends ---------------------------------------------------------------------------------
def triton_available() -> bool:
    if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import kvformats_kernels as kk
    except ImportError:
        return False
    return bool(getattr(kk, "AVAILABLE", False))


def kernel_impl(fmt, op: str):
    """The Triton implementation of ``(fmt, op)`` (a format's codec or paged op, or a model op
    under its registry.OpFamily), read from the kernel package's table as the registry reads it;
    None where there is none or Triton does not import."""
    try:
        import kvformats_kernels as kk
    except ImportError:
        return None
    key = (registry.MODEL_OP, fmt.name, op) if isinstance(fmt, registry.OpFamily) else (fmt, op)
    return kk.kernel_table().get(key)


def family_kernel(family: str, op: str):
    """A Triton implementation of the deepseek_v4 op ``op`` (``family`` "deepseek_v4") where
    kernels can run (CUDA, or the interpreter), else None."""
    return kernel_impl(registry.OpFamily(family), op) if triton_available() else None


@contextlib.contextmanager
def kernel_routing():
    """Inside: ``backend="triton"`` resolves to the Triton launchers for CPU tensors too (the
    interpreter), after the public API has validated its arguments. A no-op with CUDA."""
    if CUDA:
        yield
        return
    real = registry.resolve

    def resolve(fmt, op, backend, device):
        if backend != "triton":
            return real(fmt, op, backend, device)
        impl = kernel_impl(fmt, op)
        if impl is None:
            raise BackendUnavailableError(f"no Triton kernel for {fmt}.{op}")
        return impl

    registry.resolve = resolve
    try:
        yield
    finally:
        registry.resolve = real


def run_op(backend: str, fn, *args, **kwargs):
    """Call a public kvformats function with ``backend=``; kernels routed for CPU tensors."""
    if backend == "reference":
        return fn(*args, backend="reference", **kwargs)
    with kernel_routing():
        return fn(*args, backend="triton", **kwargs)


def backend_has(backend: str, fmt: str, op: str) -> bool:
    if backend == "reference":
        return registry.has_backend(fmt, op, "reference")
    if not triton_available():
        return False
    if CUDA:  # what the registry serves on the GPU
        return registry.has_backend(fmt, op, "triton")
    return kernel_impl(fmt, op) is not None


# ----- comparisons ------------------------------------------------------------------------------
def as_tuple(t):
    return t if isinstance(t, tuple) else (t,)


def same_values(a, b) -> bool:
    """Bitwise equal tensors (or tuples), except that a NaN may have any payload."""
    a, b = as_tuple(a), as_tuple(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        x, y = x.cpu(), y.cpu()
        if x.is_floating_point():
            nx_, ny_ = torch.isnan(x), torch.isnan(y)
            if not torch.equal(nx_, ny_):
                return False
            x, y = x.masked_fill(nx_, 0), y.masked_fill(ny_, 0)
        if not torch.equal(x.contiguous().view(INT_OF[x.element_size()]),
                           y.contiguous().view(INT_OF[y.element_size()])):
            return False
    return True


# ----- arena + model ----------------------------------------------------------------------------
class Arena:
    """A cache of ``layout`` inside a sentinel-filled arena, and the expected image of the arena.

    Bytes: ``lead`` guard bytes, then ``num_pages`` pages every ``stride`` elements (each page
    ``width`` bytes wide for byte formats), then the stride pad of the last page and ``tail``
    guard bytes. The rows' records start zeroed (as ``allocate`` gives them); page pads, stride
    pads and guards hold the sentinel.
    """

    def __init__(self, layout, num_pages: int, *, pad: int, lead: int, tail: int, sentinel: int,
                 width: int | None = None, device=DEVICE):
        self.layout = layout
        item = torch.empty(0, dtype=layout.container_dtype).element_size()
        page_shape = layout.cache_shape(1)[1:]
        if layout.container_dtype == torch.uint8 and width is not None:
            page_shape = (width,)
        page_elems = 1
        for d in page_shape:
            page_elems *= d
        stride = page_elems + pad
        total = lead + num_pages * stride + tail
        self.raw = torch.full((total * item,), sentinel, dtype=torch.uint8, device=device)
        arena = self.raw.view(layout.container_dtype)
        inner = torch.empty(page_shape).stride()
        self.cache = arena.as_strided((num_pages, *page_shape), (stride, *inner), lead)
        self.lead_bytes, self.stride_bytes, self.width_bytes = lead * item, stride * item, page_elems * item
        self.num_pages = num_pages
        self.capacity = num_pages * layout.page_size
        for page in range(num_pages):  # zero the row records (not the page pad)
            base = self.lead_bytes + page * self.stride_bytes
            self.raw[base:base + layout.min_page_bytes] = 0
        self.expected = self.raw.clone()
        self.rows: dict[int, torch.Tensor] = {}  # the model: slot -> expected gathered row bytes

    # -- independent byte placement
    def spans(self, slot: int):
        """(absolute byte offset, offset inside the gathered row, bytes) of each record of a slot."""
        page, row = divmod(slot, self.layout.page_size)
        base, at = self.lead_bytes + page * self.stride_bytes, 0
        out = []
        for seg in self.layout.segments:
            off = base + self.layout.segment_offsets[seg.name] + row * seg.record_bytes
            out.append((off, at, seg.record_bytes))
            at += seg.record_bytes
        return out

    def put(self, slot: int, row: torch.Tensor) -> None:
        """The model: ``slot`` now holds ``row`` (uint8 [row_bytes])."""
        row = row.to(self.raw.device)
        for off, at, n in self.spans(slot):
            self.expected[off:off + n] = row[at:at + n]
        self.rows[slot] = row

    def zero_page(self, page: int) -> None:
        """Page reuse: the engine zeroes the page's ``width`` bytes (row records and page pad)."""
        self.cache[page].zero_()
        base = self.lead_bytes + page * self.stride_bytes
        self.expected[base:base + self.width_bytes] = 0
        ps = self.layout.page_size
        for s in range(page * ps, (page + 1) * ps):
            self.rows.pop(s, None)

    def reuse(self, page: int) -> None:
        """Page reuse (a state machine's rule): the page zeroed, then every arena byte checked."""
        self.zero_page(page)
        self.check()

    def model_rows(self, slots) -> torch.Tensor:
        """uint8 ``[N, row_bytes]`` the model says gather returns for ``slots``."""
        slots = [int(s) for s in torch.as_tensor(slots).reshape(-1).tolist()]
        out = torch.zeros((len(slots), self.layout.row_bytes), dtype=torch.uint8, device=self.raw.device)
        for i, s in enumerate(slots):
            if 0 <= s < self.capacity and s in self.rows:
                out[i] = self.rows[s]
        return out

    def check(self) -> None:
        """Every arena byte equals the expected image (guards, pads, unwritten rows included)."""
        ARENA_BYTES_CHECKED[0] += self.raw.numel()
        diff = (self.raw != self.expected).nonzero().flatten()
        if diff.numel():
            MISMATCHED[0] += diff.numel()
            first = [int(i) for i in diff[:8]]
            raise AssertionError(
                f"{diff.numel()} arena bytes differ from the model (first at byte offsets {first}: got "
                f"{[hex(int(self.raw[i])) for i in first]}, expected {[hex(int(self.expected[i])) for i in first]}); "
                f"lead {self.lead_bytes} B, page stride {self.stride_bytes} B, page width {self.width_bytes} B")


PER_ROW_KWARGS = ("positions",)  # encode keyword arguments with one entry per row


def row_alone(layout, x, kwargs: dict, i: int) -> torch.Tensor:
    """Reference bytes of row ``i`` encoded on its own: uint8 ``[row_bytes]``."""
    xi = tuple(t[i:i + 1] for t in x) if isinstance(x, tuple) else x[i:i + 1]
    kw = {k: (v[i:i + 1] if k in PER_ROW_KWARGS else v) for k, v in kwargs.items()}
    return layout.encode_rows(xi, **kw)[0]


def strided(t: torch.Tensor, extra: int = 5) -> torch.Tensor:
    """The same rows as a view with a padded row stride (offset inside a wider tensor)."""
    wide = torch.zeros(t.shape[0], t.shape[1] + 2 * extra, dtype=t.dtype, device=t.device)
    wide[:, extra:extra + t.shape[1]] = t
    return wide[:, extra:extra + t.shape[1]]


def table_slot(table: list, r: int, pos: int, page_size: int, num_pages: int, base=None) -> int:
    """Plain-Python block-table lookup: slot of position ``pos`` of request ``r``, −1 when missing."""
    if pos < 0 or not 0 <= r < len(table):
        return -1
    pidx = pos // page_size - (base[r] if base is not None else 0)
    if not 0 <= pidx < len(table[r]):
        return -1
    entry = table[r][pidx]
    if entry < 0 or entry >= num_pages:
        return -1
    return entry * page_size + pos % page_size
