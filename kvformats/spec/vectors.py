"""Golden vectors (``spec/vectors/*.json``): load one, rebuild its inputs bit for bit, run the op
through the public API and compare bytes.

    vec = load_vector("spec/vectors/A.json")
    checks = run_vector(vec)                    # backend="auto", device="cpu"
    bad = [c for c in checks if not c.ok]

A vector holds: ``format`` + ``params``; ``inputs`` (tensors as dtype, shape and little-endian
hex; ``x`` is a list of tensors for a tuple input, other keys are encode keyword arguments);
``slots``; ``cache`` (num_pages, page_stride in cache elements or null, sentinel byte);
``expected`` with any of ``rows`` (full gathered rows, hex), ``spans`` (row, start, hex),
``sha256`` (row, start, stop, digest), ``decoded`` (row, start, dtype, hex), ``cache_bytes``
(absolute byte offset in the cache storage, hex), ``written`` (the [offset, length] byte spans
encode may change; every other byte must keep the sentinel) and ``slot_offsets``.

``op`` is "encode" (above) or "decode": ``inputs.cache`` (uint8) is then copied to the start of
the sentinel-filled cache storage and only ``decoded`` is checked (engine readers captured on
arbitrary bytes, spec/vectors/captured). A ``decoded`` entry with ``"nan": "any"`` compares NaN
positions, not NaN bits (spec/nan-policy.md §1.3 leaves payloads and signs unspecified).

``run_vector(vec, nan_codes_equal=True)`` (used for the vectors captured from engines' code) takes
the two e4m3 NaN codes 0x7F and 0xFF as equal in ``cache_bytes``, ``rows`` and ``spans``, and only
in the bytes of float8_e4m3fn data regions (the layout's ``regions``, placed at each page's offset;
scales, pads and every other byte stay exact; ``sha256`` digests stay exact): an engine may write
either code for a NaN (spec/nan-policy.md §1.3). Off by default, so golden vectors pin one code.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import attrs
import torch

from kvformats.codec.registry import get_format
from kvformats.errors import InputError, UnsupportedError
from kvformats.layout import storage_bytes
from kvformats.numerics.elements import ELEMENTS

DTYPES = {name: e.torch_dtype for name, e in ELEMENTS.items()}  # a stored tensor's dtype by name


E4M3_NAN_CODES = (0x7F, 0xFF)  # the two float8_e4m3fn NaN codes (spec/nan-policy.md §1.3)
_NAN_CODE = bytes.maketrans(bytes([E4M3_NAN_CODES[1]]), bytes([E4M3_NAN_CODES[0]]))


@attrs.frozen
class Check:
    """One comparison: ``name`` says what, ``actual`` and ``expected`` are hex strings.

    ``nan_code_spans``: sorted, disjoint ``(start, stop)`` byte ranges of the compared bytes that
    hold e4m3 elements (``run_vector(..., nan_codes_equal=True)``); inside them 0x7F and 0xFF
    count as equal, every other byte must match exactly. Empty (the default): all bytes exact."""

    name: str
    actual: str
    expected: str
    nan_code_spans: tuple[tuple[int, int], ...] = attrs.field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        if self.actual == self.expected:
            return True
        if not self.nan_code_spans or len(self.actual) != len(self.expected):
            return False
        got, want = bytes.fromhex(self.actual), bytes.fromhex(self.expected)
        at = 0
        for lo, hi in self.nan_code_spans:
            if got[at:lo] != want[at:lo] or got[lo:hi].translate(_NAN_CODE) != want[lo:hi].translate(_NAN_CODE):
                return False
            at = max(at, hi)
        return got[at:] == want[at:]


def load_vector(path) -> dict:
    """The vector stored at ``path`` (a JSON file)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def tensor_from_spec(spec: dict, device="cpu") -> torch.Tensor:
    """Rebuild a tensor from ``{"dtype", "shape", "hex"}`` (little-endian element bytes)."""
    if sys.byteorder != "little":  # the hex is little-endian; a big-endian host would reinterpret it
        raise UnsupportedError("golden vectors are little-endian; this host is big-endian")
    raw = torch.frombuffer(bytearray(bytes.fromhex(spec["hex"])), dtype=torch.uint8)
    if raw.numel() == 0:
        return torch.empty(spec["shape"], dtype=DTYPES[spec["dtype"]], device=device)
    return raw.view(DTYPES[spec["dtype"]]).reshape(spec["shape"]).to(device)


def build_inputs(vec: dict, device="cpu") -> tuple[object, dict]:
    """(x, keyword arguments) for ``layout.encode``; x is a tuple when the vector stores a list."""
    inputs = vec["inputs"]
    x = inputs["x"]
    x = tuple(tensor_from_spec(t, device) for t in x) if isinstance(x, list) else tensor_from_spec(x, device)
    kwargs = {k: tensor_from_spec(v, device) for k, v in inputs.items() if k != "x"}
    return x, kwargs


def make_cache(layout, spec: dict, device="cpu") -> torch.Tensor:
    """A cache as the vector describes it, every storage byte set to the sentinel."""
    cache = layout.allocate(spec["num_pages"], device=device, page_stride=spec["page_stride"])
    storage_bytes(cache).fill_(spec["sentinel"])
    return cache


def _hex(t: torch.Tensor) -> str:
    return bytes(t.contiguous().view(torch.uint8).cpu().reshape(-1).tolist()).hex()


def _e4m3_regions(layout) -> list:
    """The regions whose bytes may hold e4m3 NaN codes: float8_e4m3fn data (not scales, not pads)."""
    return [r for r in layout.regions if r.dtype == "float8_e4m3fn" and r.role == "data" and not r.per_page]


def _clip(spans, start: int, stop: int) -> tuple[tuple[int, int], ...]:
    """``spans`` (absolute byte ranges) inside [start, stop), relative to ``start``, sorted and merged."""
    out: list[list[int]] = []
    for lo, hi in sorted((max(lo, start) - start, min(hi, stop) - start) for lo, hi in spans):
        if lo >= hi:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _row_nan_spans(layout, rows: torch.Tensor) -> list[tuple[int, int]]:
    """Byte ranges of a gathered row holding e4m3 elements (``Region.row_span``)."""
    return [(r.row_span.start, r.row_span.stop) for r in _e4m3_regions(layout)] if rows.dim() == 2 else []


def _cache_nan_spans(layout, cache: torch.Tensor) -> list[tuple[int, int]]:
    """Byte ranges of the cache storage holding e4m3 elements: every row of every such region of
    every page."""
    regions = _e4m3_regions(layout)
    if not regions:
        return []
    stride = layout.byte_pages(cache)[1]
    base = cache.storage_offset() * cache.element_size()
    return [(at, at + r.nbytes) for page in range(cache.shape[0]) for r in regions for row in range(r.rows)
            for at in (base + page * stride + r.offset + row * r.row_stride,)]


def _row_checks(rows: torch.Tensor, expected: dict, nan_spans=()) -> list[Check]:
    out = []
    size = rows.element_size()
    for i, want in enumerate(expected.get("rows", [])):
        out.append(Check(f"gathered row {i}", _hex(rows[i]), want, _clip(nan_spans, 0, rows.shape[-1] * size)))
    for s in expected.get("spans", []):
        n = len(s["hex"]) // 2
        start = s["start"] * size
        out.append(Check(f"gathered row {s['row']} bytes [{s['start']}:{s['start'] + n}]",
                         _hex(rows[s["row"], s["start"]:s["start"] + n]), s["hex"],
                         _clip(nan_spans, start, start + len(s["hex"]) // 2)))
    for s in expected.get("sha256", []):
        digest = hashlib.sha256(bytes.fromhex(_hex(rows[s["row"], s["start"]:s["stop"]]))).hexdigest()
        out.append(Check(f"sha256 of row {s['row']} bytes [{s['start']}:{s['stop']}]", digest, s["sha256"]))
    return out


def _decoded_checks(decoded, expected: dict) -> list[Check]:
    if isinstance(decoded, tuple):  # compressor_state decodes to (kv, score_state): one row again
        decoded = torch.cat(decoded, dim=1)
    out = []
    for d in expected.get("decoded", []):
        if DTYPES[d["dtype"]] != decoded.dtype:
            out.append(Check(f"decoded dtype of row {d['row']}", str(decoded.dtype), d["dtype"]))
            continue
        n = len(d["hex"]) // 2 // decoded.element_size()
        got = decoded[d["row"], d["start"]:d["start"] + n]
        want_hex = d["hex"]
        if d.get("nan") == "any":  # one canonical NaN on both sides: positions count, bits do not
            want = tensor_from_spec({"dtype": d["dtype"], "shape": [n], "hex": want_hex}).to(got.device)
            nan = torch.full_like(got, float("nan"))
            got, want_hex = torch.where(got.isnan(), nan, got), _hex(torch.where(want.isnan(), nan, want))
        out.append(Check(f"decoded row {d['row']} elements [{d['start']}:{d['start'] + n}]",
                         _hex(got), want_hex))
    return out


def _cache_checks(layout, before: torch.Tensor, after: torch.Tensor, expected: dict, nan_spans=()) -> list[Check]:
    out = []
    for c in expected.get("cache_bytes", []):
        n = len(c["hex"]) // 2
        out.append(Check(f"cache bytes [{c['offset']}:{c['offset'] + n}]",
                         _hex(after[c["offset"]:c["offset"] + n]), c["hex"],
                         _clip(nan_spans, c["offset"], c["offset"] + n)))
    if "written" in expected:
        keep = torch.ones(after.numel(), dtype=torch.bool, device=after.device)
        for off, n in expected["written"]:
            keep[off:off + n] = False
        changed = ((before != after) & keep).nonzero()
        first = "none" if changed.numel() == 0 else f"first at byte {int(changed[0, 0])}"
        out.append(Check("bytes outside the written rows unchanged", f"{changed.numel()} changed, {first}",
                         "0 changed, none"))
    for s in expected.get("slot_offsets", []):
        got = layout.slot_offsets(s["slot"], s["page_stride"])[s["region"]]
        out.append(Check(f"slot_offsets({s['slot']}, {s['page_stride']})[{s['region']}]", str(got),
                         str(s["offset"])))
    return out


def run_vector(vec: dict, *, backend: str = "auto", device="cpu", nan_codes_equal: bool = False) -> list[Check]:
    """Encode the vector's inputs into a sentinel-filled cache through the public API, then gather
    and decode its slots; every expected item becomes a Check.

    ``nan_codes_equal``: in the bytes of float8_e4m3fn data regions, the NaN codes 0x7F and 0xFF
    compare equal in ``cache_bytes``, ``rows`` and ``spans`` (spec/nan-policy.md §1.3; for vectors
    captured from engines' code). Every other byte, scales included, stays exact."""
    if vec["op"] == "decode":
        return _run_decode(vec, backend=backend, device=device)
    if vec["op"] != "encode":
        raise InputError(f"vector {vec['id']}: unsupported op {vec['op']!r}")
    layout = get_format(vec["format"], **vec["params"])
    x, kwargs = build_inputs(vec, device)
    slots = tensor_from_spec(vec["slots"], device)
    cache = make_cache(layout, vec["cache"], device)
    before = storage_bytes(cache).clone()
    layout.encode(x, cache, slots, backend=backend, **kwargs)
    after = storage_bytes(cache)
    rows = layout.gather(cache, slots, backend=backend)
    decoded = layout.decode(cache, slots, backend=backend)
    expected = vec["expected"]
    row_spans = _row_nan_spans(layout, rows) if nan_codes_equal else []
    cache_spans = _cache_nan_spans(layout, cache) if nan_codes_equal else []
    return (_row_checks(rows, expected, row_spans) + _decoded_checks(decoded, expected)
            + _cache_checks(layout, before, after, expected, cache_spans))


def _run_decode(vec: dict, *, backend: str, device) -> list[Check]:
    """Copy ``inputs.cache`` to the start of the cache storage and decode ``slots``."""
    layout = get_format(vec["format"], **vec["params"])
    cache = make_cache(layout, vec["cache"], device)
    raw = tensor_from_spec(vec["inputs"]["cache"], device).reshape(-1)
    storage = storage_bytes(cache)
    if raw.numel() > storage.numel():
        raise InputError(f"vector {vec['id']}: {raw.numel()} cache bytes exceed the cache ({storage.numel()})")
    storage[:raw.numel()] = raw
    decoded = layout.decode(cache, tensor_from_spec(vec["slots"], device), backend=backend)
    return _decoded_checks(decoded, vec["expected"])


def vector_paths(root) -> list[Path]:
    """The vector files under ``root`` (``spec/vectors``), sorted."""
    return sorted(Path(root).glob("*.json"))
