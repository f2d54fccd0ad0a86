"""What a side may believe of its peer: JSON read with a depth bound, and a cache description
checked against the layout its format and parameters give.

A description is what one side tells the other; nothing in it is used before these checks. Every
count is bounded below 2**62, so the sums the plan forms of a few of them (offset + page *
stride + length) stay inside int64; every field the layout decides (rows per page, profile,
fingerprint, record identity, page width) is rebuilt here and compared; and the pages must lie
inside the arena the description says is registered.
"""

from __future__ import annotations

import functools
import json

import torch

from kvformats.codec.records import identity_label, record_of
from kvformats.errors import HandshakeError, KVFormatError, describe
from kvformats.layout import Layout

LIMIT = 1 << 62  # bound of every count a description carries
MAX_DEPTH = 8  # nesting of a peer's JSON: a hello needs 4 levels; deeper is refused before any use
COUNTS = ("page_size", "page_bytes", "page_stride", "num_pages", "offset", "storage_bytes")


def short(v) -> str:
    """``repr(v)`` (a tensor's ``describe``), cut to 200 characters: a peer's values go into
    messages, and a peer chooses their size."""
    text = describe(v) if isinstance(v, torch.Tensor) else repr(v)
    return text if len(text) <= 200 else text[:200] + "..."


def label(record: dict) -> str:
    return identity_label(record) if record else "none (a format this kvformats does not know)"


def loads(text, what: str):
    """JSON from a peer: HandshakeError for anything but JSON text nested at most MAX_DEPTH deep
    (json's own parser gives up near 1,000 levels with a RecursionError, and deep values would
    make every later walk of them recurse as deep)."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise HandshakeError(f"{what} must be JSON text, got {short(text)}")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise HandshakeError(f"{what} is not JSON: {str(err)[:200] or type(err).__name__}") from None
    level, todo = 0, [value]
    while todo:  # breadth first, no recursion
        level += 1
        if level > MAX_DEPTH:
            raise HandshakeError(f"{what} is nested more than {MAX_DEPTH} levels deep")
        todo = [v for c in todo if isinstance(c, (list, dict)) for v in (c.values() if isinstance(c, dict) else c)]
    return value


@functools.lru_cache(maxsize=256)
def _layout(fmt: str, params_json: str) -> Layout:
    from kvformats.codec.registry import get_format

    return get_format(fmt, **json.loads(params_json))


@functools.lru_cache(maxsize=256)
def _derived(layout: Layout) -> tuple[str, tuple[dict, ...]]:
    """(spec fingerprint, accepted record identities) of a layout: hashing its byte definition
    costs ~1 ms, and a plan checks every cache of both sides."""
    from kvformats.codec.records import accepted_identities
    from kvformats.spec.formats import fingerprint

    return fingerprint(layout), accepted_identities(layout)


def checked_layout(desc, whose: str = "", *, record: bool = True) -> Layout:
    """The layout ``desc.format`` and ``desc.params`` give, after checking every field of the
    description (a ``CacheDesc``) it decides: rows per page, profile, fingerprint, the record
    identity (unless ``record`` is False: the handshake compares records itself, naming both), a
    page width the layout accepts, a page stride of at least the width, every count below
    2**62, and every page inside the arena. HandshakeError naming the cache and field otherwise."""
    where = f"{whose}cache {desc.name!r}"
    for f in COUNTS:
        v = getattr(desc, f)
        if type(v) is not int or not 0 <= v < LIMIT:  # noqa: E721 - a bool is refused
            raise HandshakeError(f"{where}: {f} = {short(v)} is not a non-negative int below 2**62")
    if not isinstance(desc.format, str) or not isinstance(desc.params, dict):
        raise HandshakeError(f"{where}: format must be a str and params a dict, got {short(desc.format)} and "
                             f"{short(desc.params)}")
    try:
        layout = _layout(desc.format, json.dumps(desc.params, sort_keys=True))
    except (KVFormatError, TypeError, ValueError) as err:
        raise HandshakeError(f"{where}: format {desc.format!r} with params {short(desc.params)} is not a layout "
                             f"this kvformats builds: {err}") from None
    fingerprint, accepted = _derived(layout)
    derived = {"page_size": layout.page_size, "profile": str(layout.params.get("profile", "")),
               "fingerprint": fingerprint}
    for f, want in derived.items():
        if getattr(desc, f) != want:
            raise HandshakeError(f"{where}: {f} = {short(getattr(desc, f))}, but {desc.format} with these params "
                                 f"has {want!r}")
    if record and desc.record and desc.record not in accepted:
        raise HandshakeError(f"{where} is described as {desc.format}, whose record is "
                             f"{identity_label(record_of(layout).identity())}, but carries the record "
                             f"{label(desc.record)}")
    exact = layout.container_dtype != torch.uint8  # typed containers have exactly allocate's page shape
    if desc.page_bytes < layout.min_page_bytes or (exact and desc.page_bytes != layout.page_bytes):
        need = f"exactly {layout.page_bytes}" if exact else f"at least {layout.min_page_bytes}"
        raise HandshakeError(f"{where}: page_bytes = {desc.page_bytes}, but {desc.format} pages are {need} bytes "
                             f"wide")
    if desc.page_stride < desc.page_bytes:
        raise HandshakeError(f"{where}: page_stride = {desc.page_stride} is less than the page width "
                             f"{desc.page_bytes}: pages would overlap")
    end = desc.offset + (desc.num_pages - 1) * desc.page_stride + desc.page_bytes if desc.num_pages else 0
    if end > desc.storage_bytes:
        raise HandshakeError(f"{where}: its {desc.num_pages} pages end at byte {end} of the arena, beyond its "
                             f"storage_bytes = {desc.storage_bytes}")
    return layout
