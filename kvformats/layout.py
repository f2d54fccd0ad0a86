"""Declarative layouts: a format declares its parameters and ordered segments; everything else
(region offsets, row and page bytes, typed views, allocation) is derived here, once.

A page is a sequence of *segments* followed by a page pad. A segment holds one fixed-size
record per row (``page_size`` records back to back); a record is a tuple of *fields*. So
fp8_ds_mla declares ``token = (nope, rope)`` then ``scales = (scale, scale_pad)``; a slot's
encoded row (what ``gather`` returns) is its records of every segment, concatenated in order.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import attrs
import torch

from kvformats.errors import BackendUnavailableError, InputError, InputTypeError, LayoutError, describe
from kvformats.examples import Examples
from kvformats.numerics.elements import ELEMENTS, ElementType
from kvformats.runtime import deferred
from kvformats.validation import check_cache, check_float_rows

# Element types by their ml_dtypes/torch names (kvformats.numerics.elements): (bytes per stored unit,
# elements per unit) and the torch dtype of a typed view, as read from the one table.
ELEMENT_TYPES = {name: (e.unit_bytes, e.per_unit) for name, e in ELEMENTS.items()}
TORCH_DTYPES = {name: e.torch_dtype for name, e in ELEMENTS.items()}


INT64_MAX = 2**63 - 1  # the largest tensor dimension (and byte count) torch can hold

# The public ops (encode, decode, gather, the paged reads) validate and dispatch in the codec
# layer, which sits above this declaration: ``kvformats.codec.slot_ops`` (encode, decode, gather)
# and ``kvformats.codec.paged_ops`` (dequantize_gather, gather_paged, decode_topk). The package
# front, the composition root, hands those two modules in through ``bind_codec``, so the
# declaration imports nothing from dispatch, not even for type checkers: the two protocols below
# say what it calls.
class SlotOps(Protocol):
    """What ``kvformats.codec.slot_ops`` provides: each op takes the layout first."""

    encode: Callable
    decode: Callable
    gather: Callable


class PagedOps(Protocol):
    """What ``kvformats.codec.paged_ops`` provides: each op takes the layout first."""

    dequantize_gather: Callable
    gather_paged: Callable
    decode_topk: Callable


SLOT_OPS = ("encode", "decode", "gather")
PAGED_OPS = ("dequantize_gather", "gather_paged", "decode_topk")


class _Unbound:
    """The layouts' ops before the codec layer is imported: a typed error naming the fix."""

    def __getattr__(self, name: str):
        raise BackendUnavailableError(f"Layout.{name} needs the codec layer, which the package front binds: "
                                      f"import kvformats first")


slot_ops: SlotOps = _Unbound()  # bound by the package front
paged_ops: PagedOps = _Unbound()


def bind_codec(slot: SlotOps, paged: PagedOps) -> None:
    """Give the layouts' public methods the codec layer's ops (``SlotOps``, ``PagedOps``); an
    object missing one of them is an InputTypeError, and nothing is bound then."""
    global slot_ops, paged_ops
    missing = [name for ops, names in ((slot, SLOT_OPS), (paged, PAGED_OPS)) for name in names
               if not callable(getattr(ops, name, None))]
    if missing:
        raise InputTypeError(f"bind_codec needs callables {', '.join(missing)}, got {describe(slot)} "
                             f"and {describe(paged)}")
    slot_ops, paged_ops = slot, paged


def _plain_html(layout) -> str:
    """A layout's region table as preformatted text: its display until ``bind_html`` is called."""
    import html

    return f"<pre>{html.escape(layout.describe())}</pre>"


_html_view: Callable = _plain_html  # Layout._repr_html_; the package front binds the report's drawing


def bind_html(view: Callable) -> None:
    """Give ``Layout._repr_html_`` its drawing (``kvformats.report.layout_html.layout_html``, a
    layer above this declaration: handed in by the package front, as the codec's ops are)."""
    global _html_view
    if not callable(view):
        raise InputTypeError(f"bind_html needs a callable, got {describe(view)}")
    _html_view = view


def _is_int(value) -> bool:
    """An exact int: not a bool (``True == 1``), not a float (``4.0 == 4``), which would compare
    and hash equal to a valid parameter and still break later (issue #25)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _got(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def positive(instance, attribute, value):
    """attrs validator: a positive int (not bool, not float)."""
    if not _is_int(value) or value <= 0:
        raise LayoutError(f"{attribute.name} must be a positive int, got {_got(value)}")


def one_of(*allowed):
    """attrs validator: the value is one of ``allowed``, of the same type (an int parameter takes
    exactly an int: not ``4.0``, not ``True``); a LayoutError otherwise."""

    def check(instance, attribute, value):
        if isinstance(value, bool) or not any(isinstance(value, type(a)) and value == a for a in allowed):
            kinds = " or ".join(sorted({"an int" if _is_int(a) else type(a).__name__ for a in allowed}))
            raise LayoutError(f"{attribute.name} must be one of {', '.join(map(str, allowed))} ({kinds}), "
                              f"got {_got(value)}")

    return check


def storage_bytes(cache: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``cache`` (arena padding included) as a uint8 alias ``[bytes]``."""
    return torch.empty(0, dtype=torch.uint8, device=cache.device).set_(cache.untyped_storage())


@functools.lru_cache(maxsize=1024)
def _page_bytes(layout) -> int:
    """``layout.page_bytes``, remembered per parameter set: construction checks it, and ops build
    layouts per call, and deriving the segments costs far more than a hash lookup
    (docs/explanation/measured-choices.md)."""
    return layout.page_bytes


@attrs.frozen
class Field:
    """One typed run of elements inside a segment record. ``role``: data, scale or pad."""

    name: str
    dtype: str = attrs.field(validator=attrs.validators.in_(ELEMENTS))
    count: int
    role: str = attrs.field(default="data", validator=attrs.validators.in_(("data", "scale", "pad")))
    doc: str = ""
    scale: str = ""  # name of the field holding this field's scales ("" = unscaled)
    block: int = 0  # elements sharing one scale

    @property
    def nbytes(self) -> int:
        return ELEMENTS[self.dtype].nbytes(self.count)


@attrs.frozen
class Segment:
    """``page_size`` records of ``fields``, back to back."""

    name: str
    fields: tuple[Field, ...]

    @property
    def record_bytes(self) -> int:
        return sum(f.nbytes for f in self.fields)


@attrs.frozen
class Region:
    """A placed field: row r of this region starts at ``offset + r * row_stride`` in the page.

    ``shape`` is the per-row element shape; the page pad is a region with ``row_stride`` 0 and
    ``per_page=True``. ``row_offset`` is where the field sits inside a gathered row.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    row_stride: int
    nbytes: int
    role: str
    segment: str
    row_offset: int
    rows: int = 1
    per_page: bool = False
    doc: str = ""
    scale: str = ""
    block: int = 0

    @property
    def page_nbytes(self) -> int:
        return self.nbytes if self.per_page else self.nbytes * self.rows

    @property
    def element(self) -> ElementType:
        """The entry of the element-type table for ``dtype``."""
        return ELEMENTS[self.dtype]

    @property
    def count(self) -> int:
        """Elements per row (``shape`` counts stored units: an e2m1 byte holds two elements)."""
        return self.shape[0] * ELEMENTS[self.dtype].per_unit

    @property
    def row_span(self) -> slice:
        """The bytes of this field inside a gathered row."""
        return slice(self.row_offset, self.row_offset + self.nbytes)


@attrs.frozen(kw_only=True)
class Layout:
    """Base of every format. Subclasses add parameters and implement ``_segments``,
    ``encode_rows`` and ``decode_rows``; the public ops validate and dispatch in
    ``kvformats.codec.slot_ops`` and ``paged_ops`` (bound in by ``bind_codec``)."""

    name: ClassVar[str] = ""
    if TYPE_CHECKING:  # a field every format declares with its own default and validator
        head_dim: int
        record: Any  # the record ABI (kvformats.codec.records.Record), bound by the package front (bind_records)
    page_alignment: ClassVar[str | None] = None  # name of a segment whose record size pages round up to
    container_dtype: ClassVar[torch.dtype] = torch.uint8
    quant_input_dtype: ClassVar[torch.dtype] = torch.float32  # what encode rounds its input to first
    # The format's fixtures for tests and docs (parameter sets, worked examples, example encode
    # arguments and the values decode gives back for them): kvformats.examples.Examples, bound to
    # the layout when read through one.
    examples: ClassVar[Examples] = Examples()

    page_size: int = attrs.field(default=64, validator=positive)

    def __attrs_post_init__(self):
        """Checks across parameters, after each one's validator: the format's own geometry
        (``_check_geometry``), then a page that a tensor can hold."""
        self._check_geometry()
        if _page_bytes(self) > INT64_MAX:
            raise LayoutError(f"{self.name} pages of page_size={self.page_size} rows would take "
                              f"{self.page_bytes} bytes, more than a tensor dimension holds (2**63 - 1); "
                              f"pass a smaller page_size (or head size)")

    def _check_geometry(self) -> None:
        """Format-specific checks across parameters (LayoutError); none by default."""

    # ----- declaration ---------------------------------------------------------------------
    def _segments(self) -> tuple[Segment, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    # ----- derived geometry ----------------------------------------------------------------
    @functools.cached_property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments()

    @functools.cached_property
    def segment_offsets(self) -> dict[str, int]:
        """In-page byte offset of each segment's first record."""
        offsets, at = {}, 0
        for seg in self.segments:
            offsets[seg.name] = at
            at += self.page_size * seg.record_bytes
        return offsets

    @functools.cached_property
    def row_bytes(self) -> int:
        """Bytes of one encoded row (all segments' records)."""
        return sum(seg.record_bytes for seg in self.segments)

    @functools.cached_property
    def min_page_bytes(self) -> int:
        """The narrowest page an op accepts: ``page_size * row_bytes``."""
        return self.page_size * self.row_bytes

    @functools.cached_property
    def page_bytes(self) -> int:
        """Bytes ``allocate`` gives a page: the minimum, rounded up to the alignment record."""
        if self.page_alignment is None:
            return self.min_page_bytes
        unit = next(s.record_bytes for s in self.segments if s.name == self.page_alignment)
        return -(-self.min_page_bytes // unit) * unit

    @functools.cached_property
    def regions(self) -> tuple[Region, ...]:
        """Every region of a page in byte order, the page pad (if any) last."""
        out, row_at = [], 0
        for seg in self.segments:
            at = self.segment_offsets[seg.name]
            for f in seg.fields:
                per_unit = ELEMENTS[f.dtype].per_unit
                out.append(Region(name=f.name, dtype=f.dtype, shape=(f.count // per_unit,), offset=at,
                                  row_stride=seg.record_bytes, nbytes=f.nbytes, role=f.role,
                                  segment=seg.name, row_offset=row_at, rows=self.page_size, doc=f.doc,
                                  scale=f.scale, block=f.block))
                at += f.nbytes
                row_at += f.nbytes
        pad = self.page_bytes - self.min_page_bytes
        if pad:
            out.append(Region(name="page_pad", dtype="uint8", shape=(pad,), offset=self.min_page_bytes,
                              row_stride=0, nbytes=pad, role="pad", segment="", row_offset=-1,
                              rows=1, per_page=True, doc="never written"))
        return tuple(out)

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise LayoutError(f"{self.name} has no region {name!r}; regions: {[r.name for r in self.regions]}")

    def row_span(self, name: str) -> slice:
        """The bytes of region ``name`` inside a gathered row (``Region.row_span``)."""
        return self.region(name).row_span

    @property
    def data_regions(self) -> tuple[Region, ...]:
        """The regions holding values, in row order: what ``decode`` returns, side by side."""
        return tuple(r for r in self.regions if r.role == "data")

    def scale_order(self, region: str) -> tuple[int, ...] | None:
        """For a scale region stored out of block order: entry b is the element of the region's
        row that holds block b's scale (nvfp4_ds_mla permutes its scales); None, the default,
        when element b is block b's. Generic readers (dump, diff) pair blocks with scales by it."""
        return None

    @property
    def params(self) -> dict:
        """The declared parameters, as keyword arguments for ``get_format``."""
        return attrs.asdict(self)

    def slot_offsets(self, slot: int, page_stride: int | None = None) -> dict[str, int]:
        """Absolute byte offset of each non-pad region of one slot (for docs, dumps, tests)."""
        stride = self.page_bytes if page_stride is None else page_stride
        page, row = divmod(slot, self.page_size)
        return {r.name: page * stride + r.offset + row * r.row_stride for r in self.regions if not r.per_page}

    def describe(self) -> str:
        """A plain-text region table (name, dtype, shape, offset, bytes per row and per page)."""
        head = f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params.items())}): " \
               f"row {self.row_bytes} B, page {self.page_bytes} B (min {self.min_page_bytes} B)"
        lines = [head, f"{'region':<12} {'dtype':<17} {'shape':<8} {'offset':>7} {'row B':>6} {'page B':>7}"]
        for r in self.regions:
            shape = "page" if r.per_page else f"[{r.shape[0]}]"
            lines.append(f"{r.name:<12} {r.dtype:<17} {shape:<8} {r.offset:>7} "
                         f"{'-' if r.per_page else r.nbytes:>6} {r.page_nbytes:>7}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the byte map and the region table (``bind_html``)."""
        return _html_view(self)

    # ----- caches --------------------------------------------------------------------------
    def cache_shape(self, num_pages: int) -> tuple[int, ...]:
        return (num_pages, self.page_bytes)

    @functools.cached_property
    def page_shape(self) -> tuple[int, ...]:
        """``cache_shape`` without the page count (computed once: every op checks against it)."""
        return self.cache_shape(1)[1:]

    def allocate(self, num_pages: int, device=None, page_stride: int | None = None) -> torch.Tensor:
        """A zeroed cache of ``num_pages`` pages.

        Byte formats: uint8 ``[num_pages, page_bytes]``. ``page_stride`` (in elements of the
        cache tensor, i.e. ``cache.stride(0)``) may exceed the page width; the cache is then a
        strided view into a larger zeroed arena, as engines that share one arena allocate.
        """
        if not _is_int(num_pages) or num_pages < 0:
            raise LayoutError(f"num_pages must be a non-negative int, got {_got(num_pages)}")
        shape = self.cache_shape(num_pages)
        page_elems = 1
        for d in shape[1:]:
            page_elems *= d
        if page_stride is not None and (not _is_int(page_stride) or page_stride < page_elems):
            raise LayoutError(f"page_stride must be an int >= {page_elems} (one page of {self.name}), "
                              f"got {_got(page_stride)}")
        if device is not None:  # a typed error, not torch's AssertionError for a CUDA-less torch
            device = deferred.available_device(device)
        stride = page_elems if page_stride is None else page_stride
        elems = max(num_pages - 1, 0) * stride + page_elems if num_pages else 0
        if elems * self.container_dtype.itemsize > INT64_MAX:
            raise LayoutError(f"{num_pages} pages of {self.name} (page stride {stride} elements) would take "
                              f"more bytes than a tensor holds (2**63 - 1); allocate fewer pages")
        if page_stride is None:
            return torch.zeros(shape, dtype=self.container_dtype, device=device)
        arena = torch.zeros(max(num_pages - 1, 0) * page_stride + page_elems,
                            dtype=self.container_dtype, device=device)
        inner = torch.empty(shape[1:]).stride() if len(shape) > 1 else ()
        return arena.as_strided(shape, (page_stride, *inner))

    def byte_pages(self, cache: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(a uint8 alias of the cache storage, page stride in bytes)."""
        if cache.dtype == torch.uint8:
            return cache, cache.stride(0)
        u8 = cache.view(torch.uint8)
        return u8, u8.stride(0)

    def segment_view(self, cache: torch.Tensor, segment: str) -> torch.Tensor:
        """uint8 ``[pages, page_size, record_bytes]`` view of one segment (zero-copy)."""
        seg = next(s for s in self.segments if s.name == segment)
        u8, stride = self.byte_pages(cache)
        return u8.as_strided((cache.shape[0], self.page_size, seg.record_bytes),
                             (stride, seg.record_bytes, 1),
                             u8.storage_offset() + self.segment_offsets[segment])

    def views(self, cache: torch.Tensor) -> dict[str, torch.Tensor]:
        """Region name -> zero-copy typed view ``[pages, page_size, *shape]`` (the page pad:
        uint8 ``[pages, pad]``, only the pad bytes inside the cache's page width: a page of
        exactly ``page_size * row_bytes`` has an empty pad; no view reaches between pages)."""
        check_cache(self, cache)
        u8, stride = self.byte_pages(cache)
        width = functools.reduce(int.__mul__, u8.shape[1:], 1)  # bytes of one page of this cache
        out = {}
        for r in self.regions:
            if r.per_page:
                pad = max(0, min(r.nbytes, width - r.offset))
                out[r.name] = u8.as_strided((cache.shape[0], pad), (stride, 1), u8.storage_offset() + r.offset)
                continue
            raw = u8.as_strided((cache.shape[0], self.page_size, r.nbytes), (stride, r.row_stride, 1),
                                u8.storage_offset() + r.offset)
            try:
                out[r.name] = raw.view(TORCH_DTYPES[r.dtype])
            except RuntimeError as err:
                raise LayoutError(f"cannot view region {r.name!r} as {r.dtype}: page stride {stride} B or "
                                  f"offset is not a multiple of its element size ({err})") from None
        return out

    # ----- public ops ----------------------------------------------------------------------
    def encode(self, x, cache: torch.Tensor, slots: torch.Tensor, *, backend: str = "auto",
               check: bool | str = True, **kwargs) -> None:
        """Quantize the rows of ``x [N, head_dim]`` (bf16/fp16/fp32) and write them in place at
        ``slots [N]`` (int32/int64; negative = skip). Only the bytes of written rows change.

        Metadata errors raise InputError/LayoutError before any write. Slot values (below the
        capacity, no repeats) are checked by ``check`` (``kvformats.runtime.deferred``): on CPU tensors
        and with ``check="strict"`` on the host before any write; by default on the GPU without
        a host read, where a slot beyond the cache is skipped and recorded for
        ``kvformats.raise_pending``; ``check=False`` checks no values. Rows named twice in one
        call are refused on the host; on the GPU's default path each byte of such a row comes
        from one of the rows that name it (spec/checks.md).
        """
        slot_ops.encode(self, x, cache, slots, backend=backend, check=check, **kwargs)

    def decode(self, cache: torch.Tensor, slots: torch.Tensor, *, backend: str = "auto", check: bool | str = True):
        """Dequantize the rows at ``slots [N]``; zero rows for negative slots."""
        return slot_ops.decode(self, cache, slots, backend=backend, check=check)

    def gather(self, cache: torch.Tensor, slots: torch.Tensor, *, backend: str = "auto",
               check: bool | str = True) -> torch.Tensor:
        """The encoded rows at ``slots [N]`` -> uint8 ``[N, row_bytes]`` (segments in page order:
        data bytes, then scale bytes); zero rows for negative slots."""
        return slot_ops.gather(self, cache, slots, backend=backend, check=check)

    @property
    def decode_dtype(self) -> torch.dtype | None:
        """dtype of the rows ``decode`` returns (None when it returns several tensors)."""
        return torch.float32

    @property
    def decode_dtypes(self) -> tuple[torch.dtype | None, ...]:
        """dtypes of the tensors ``decode`` returns, in order (one, ``decode_dtype``, unless the
        format decodes to several tensors and says so by overriding this)."""
        return (self.decode_dtype,)

    @property
    def paged_reads(self) -> bool:
        """Whether ``dequantize_gather`` can serve this format: its rows decode to one tensor of
        ``decode_dtype`` (a format decoding to several tensors has no single output to fill)."""
        return self.decode_dtype is not None

    def dequantize_gather(self, cache: torch.Tensor, out: torch.Tensor, *, block_table: torch.Tensor,
                          seq_lens: torch.Tensor, gather_lens: torch.Tensor | None = None,
                          block_table_base_offsets: torch.Tensor | None = None, offset: int = 0,
                          backend: str = "auto", check: bool | str = True) -> torch.Tensor:
        """Decode, for each request b, positions ``seq_lens[b] - gather_lens[b] + i`` (i < gather_len)
        through ``block_table [R, max_pages]`` (page index ``q // page_size - base[b]``) into
        ``out[b, offset + i]`` (``out [R, W, head_dim]`` of ``decode_dtype``). Missing pages give
        zero rows; rows at or beyond gather_len are untouched. Returns ``out``."""
        return paged_ops.dequantize_gather(self, cache, out, block_table=block_table, seq_lens=seq_lens,
                                           gather_lens=gather_lens, block_table_base_offsets=block_table_base_offsets,
                                           offset=offset, backend=backend, check=check)

    def gather_paged(self, cache: torch.Tensor, *, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                     out=None, num_rows: int | None = None, backend: str = "auto", check=True) -> tuple:
        """Copy the encoded records of positions ``[cu[r], cu[r+1])`` of each request r (page
        ``block_table[r, j // page_size]``) into one workspace per segment, in cu order: e.g. for
        the indexers ``(values uint8 [T, 64 or 128], scales uint8 [T, 4])``; pass ``out`` to fill
        preallocated workspaces (rows past ``cu[-1]`` untouched; a scales workspace may be int32
        or float32 ``[T]``, one little-endian word per row). Missing pages give zero rows. Without
        ``out``, pass ``num_rows`` (``cu_seq_lens[-1]``, known to the caller) to allocate them: else
        that value is read from the device, the one host synchronization of this op."""
        return paged_ops.gather_paged(self, cache, block_table=block_table, cu_seq_lens=cu_seq_lens, out=out,
                                      num_rows=num_rows, backend=backend, check=check)

    def decode_topk(self, cache: torch.Tensor, topk_slots: torch.Tensor, *, backend: str = "auto",
                    check: bool | str = True):
        """Decode a ``[T, K]`` matrix of slots (−1 holes give zero rows) -> ``[T, K, head_dim]``."""
        return paged_ops.decode_topk(self, cache, topk_slots, backend=backend, check=check)

    def check_encode_input(self, x, device: torch.device, **kwargs) -> tuple[int, dict]:
        """Validate ``encode``'s row input; returns (N, keyword arguments for encode_rows)."""
        if kwargs:
            raise InputError(f"{self.name}.encode takes no keyword arguments, got {sorted(kwargs)}")
        return check_float_rows("x", x, self.head_dim, device), {}

    # ----- codec (implemented per format) --------------------------------------------------
    def encode_rows(self, x) -> torch.Tensor:  # pragma: no cover - abstract
        """Quantize rows -> uint8 ``[N, row_bytes]`` (the gather order)."""
        raise NotImplementedError

    def decode_rows(self, rows: torch.Tensor):  # pragma: no cover - abstract
        """uint8 ``[N, row_bytes]`` -> dequantized rows."""
        raise NotImplementedError
