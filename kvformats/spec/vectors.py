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


@attrs.frozen
class Check:
    """One comparison: ``name`` says what, ``actual`` and ``expected`` are hex strings."""

    name: str
    actual: str
    expected: str

    @property
    def ok(self) -> bool:
        return self.actual == self.expected


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


def _row_checks(rows: torch.Tensor, expected: dict) -> list[Check]:
    out = []
    for i, want in enumerate(expected.get("rows", [])):
        out.append(Check(f"gathered row {i}", _hex(rows[i]), want))
    for s in expected.get("spans", []):
        n = len(s["hex"]) // 2
        out.append(Check(f"gathered row {s['row']} bytes [{s['start']}:{s['start'] + n}]",
                         _hex(rows[s["row"], s["start"]:s["start"] + n]), s["hex"]))
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


def _cache_checks(layout, before: torch.Tensor, after: torch.Tensor, expected: dict) -> list[Check]:
    out = []
    for c in expected.get("cache_bytes", []):
        n = len(c["hex"]) // 2
        out.append(Check(f"cache bytes [{c['offset']}:{c['offset'] + n}]",
                         _hex(after[c["offset"]:c["offset"] + n]), c["hex"]))
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


def run_vector(vec: dict, *, backend: str = "auto", device="cpu") -> list[Check]:
    """Encode the vector's inputs into a sentinel-filled cache through the public API, then gather
    and decode its slots; every expected item becomes a Check."""
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
    return (_row_checks(rows, expected) + _decoded_checks(decoded, expected)
            + _cache_checks(layout, before, after, expected))


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
