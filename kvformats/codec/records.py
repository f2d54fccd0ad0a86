"""Record identity: every KV-cache record ABI kvformats knows, as declared data, and the lookup
from a byte count to the records it may be.

Consumers tell a record by its bytes per token (FlashMLA's ``detect_kv_cache_format_for_headdim_512``,
vLLM's ``cache_dtype_str``), but a size does not name a record: 528 B is the DeepSeek V4.1 record
page-planar (tokenspeed, the FlashMLA forks) or token-interleaved (upstream FlashMLA, vLLM), or
FlashMLA's V3.2 row without its RoPE tail; the worst reported bugs were such same-size layout
confusions (vllm-project/vllm#50576, #40991, #54563; 1CatAI/1Cat-vLLM#250). So:

* ``RECORDS`` declares each record once: its name, model version, bytes per token, head size,
  layout kind, the kvformats format that implements it (or none: a record known only from an
  open pull request or a note) and which engines and kernels write and read it, each with its
  repository, path and commit or release (``Source``).
* ``identify(bytes_per_token, head_dim=None, hint=None)`` returns every record that fits;
  ``identify_one`` returns the one record that fits or raises ``AmbiguousRecordError`` naming
  every candidate: it never guesses.
* ``record_of(layout)`` (also ``layout.record``) is a layout's record: the declared entry its
  format and parameters give, or an identity derived from its name and parameters (a format a
  user registers, a non-default head size). Cache files (``kvformats.caches.files``) and the
  transfer handshake (``kvformats.transfer.describe``) carry ``record.identity()`` and refuse a
  record that differs from the one the other side or the format says.

A format joins by declaration: a ``Record`` whose ``format`` names it. Until that format is
registered the record is listed as known, not implemented; once it is, its bytes per token,
head size and layout kind are checked against the layout (tests/test_records.py).
"""
from __future__ import annotations

from typing import Iterable

from kvformats.codec.record_table import RECORDS
from kvformats.codec.record_types import (IDENTITY_KEYS, KIND_ALIASES, LAYOUT_KINDS, ROLES, Record,  # noqa: F401
                                          Source, identity_label, identity_problem)
from kvformats.codec.registry import get_format
from kvformats.errors import AmbiguousRecordError, InputError, InputTypeError, LayoutError, describe
from kvformats.layout import Layout

_BY_NAME = {r.name: r for r in RECORDS}
if len(_BY_NAME) != len(RECORDS):  # pragma: no cover - a declaration error
    raise LayoutError("two records share a name in kvformats.codec.records.RECORDS")


def list_records() -> tuple[Record, ...]:
    """Every declared record, by bytes per token then name."""
    return tuple(sorted(RECORDS, key=lambda r: (r.bytes_per_token, r.name)))


def get_record(name: str) -> Record:
    """The declared record ``name``; LayoutError naming the records for another name."""
    if name not in _BY_NAME:
        raise LayoutError(f"unknown record {name!r}; records: {', '.join(sorted(_BY_NAME))}")
    return _BY_NAME[name]


# ----- a layout's record -----------------------------------------------------------------------
def layout_kind(layout: Layout) -> str:
    """The layout kind a declaration gives: no scale field, unscaled rows; one segment,
    token-interleaved; more, page-planar (page-tail scales when pages round up to a record)."""
    fields = [f for s in layout.segments for f in s.fields]
    if not any(f.role == "scale" for f in fields):
        return "unscaled rows"
    if len(layout.segments) == 1:
        return "token-interleaved"
    return "page-planar" if layout.page_alignment is None else "page-tail scales"


def _matches(record: Record, layout: Layout) -> bool:
    params = layout.params
    return (record.format == layout.name and record.bytes_per_token == layout.row_bytes
            and record.head_dim == getattr(layout, "head_dim", 0)
            and all(params.get(k) == v for k, v in record.params))


def record_of(layout: Layout) -> Record:
    """The record of ``layout`` (also ``layout.record``): the declared record its format and
    parameters give, else an identity derived from its name and its parameters other than
    page_size and profile (``derived=True``; the version of its format's declared records)."""
    if not isinstance(layout, Layout):
        raise InputTypeError(f"record_of takes a Layout, got {describe(layout)}")
    for record in RECORDS:
        if _matches(record, layout):
            return record
    return derived_record(layout)


def derived_record(layout: Layout) -> Record:
    """The identity derived from ``layout``'s declaration alone (``derived=True``), whether or
    not a record is declared for it."""
    shaping = {k: v for k, v in layout.params.items() if k not in ("page_size", "profile")}
    name = layout.name + ("(" + ", ".join(f"{k}={v}" for k, v in sorted(shaping.items())) + ")" if shaping else "")
    versions = {r.version for r in RECORDS if r.format == layout.name}
    return Record(name=name, version=versions.pop() if len(versions) == 1 else "", bytes_per_token=layout.row_bytes,
                  head_dim=getattr(layout, "head_dim", 0), layout=layout_kind(layout),
                  summary="derived from the layout's declaration (no declared record ABI)", format=layout.name,
                  params=shaping, derived=True)


def accepted_identities(layout: Layout) -> tuple[dict, ...]:
    """The identities that name ``layout``'s record: its record's and the one derived from its
    declaration. A file or a peer from a kvformats whose table declared no record for these
    parameters yet carries the derived one; another record of the same size is neither."""
    own, derived = record_of(layout).identity(), derived_record(layout).identity()
    return (own,) if own == derived else (own, derived)


def same_record(a: dict, b: dict, fmt: str, params: dict) -> bool:
    """Whether two identities carried for caches of format ``fmt`` with ``params`` (both sides
    agree on those) name the same record: equal, or each one of ``accepted_identities`` of
    that layout (when this kvformats can build it)."""
    if a == b:
        return True
    try:
        accepted = accepted_identities(get_format(fmt, **params))
    except (LayoutError, InputError, TypeError, ValueError):
        return False
    return a in accepted and b in accepted


def record_identity(fmt: str, params: dict) -> dict | None:
    """The identity of the record of format ``fmt`` with ``params`` (for a peer or a file that
    did not carry one); None when this kvformats cannot build that layout."""
    try:
        return record_of(get_format(fmt, **params)).identity()
    except (LayoutError, InputError, TypeError, ValueError):
        return None


# ----- identify --------------------------------------------------------------------------------
def _version_key(text: str) -> str:
    return text.lower().lstrip("v").replace(".", "")


def _hint_terms(hint) -> tuple[str, ...]:
    if hint is None:
        return ()
    if isinstance(hint, str):
        hint = (hint,)
    if not isinstance(hint, (tuple, list)) or not hint or not all(isinstance(h, str) and h for h in hint):
        raise InputTypeError(f"hint must be a non-empty string or a tuple of them (a layout kind, an engine, a "
                             f"format or record name, a version), got {describe(hint)}")
    return tuple(h.strip().lower() for h in hint)


def _hint_matches(record: Record, term: str) -> bool:
    kind = KIND_ALIASES.get(term, term)
    return (term in (record.name.lower(), record.format.lower()) or kind == record.layout
            or any(_version_key(term) == _version_key(v) for v in record.version.split(" / "))
            or any(term in (s.engine.lower(), s.repository.lower()) for s in record.sources))


def hint_vocabulary() -> list[str]:
    """Every word a hint may be: layout kinds and their aliases, engines, repositories,
    versions, record and format names."""
    words = set(LAYOUT_KINDS) | set(KIND_ALIASES)
    for r in RECORDS:
        words |= {r.name, *r.version.split(" / "), *(s.engine for s in r.sources), *(s.repository for s in r.sources)}
        words |= {r.format} if r.format else set()
    return sorted(words, key=str.lower)


def _check_count(what: str, value, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if type(value) is not int:  # noqa: E721 - bools and floats are refused
        raise InputTypeError(f"{what} must be an int, got {describe(value)}")
    if value <= 0:
        raise InputError(f"{what} must be positive, got {value}")


def identify(bytes_per_token: int, head_dim: int | None = None, hint=None) -> tuple[Record, ...]:
    """Every record of ``bytes_per_token`` bytes (and ``head_dim``, when given) that ``hint``
    names, by name: a tuple of ``Record`` (implemented ones and those known only from a pull
    request or a note), empty when none fits. A size alone is often ambiguous: 528 B is
    ``dsv41-fp8-528-planar``, ``dsv41-fp8-528-interleaved`` and ``dsv32-fp8-528-norope``.

    ``hint``: a string, or a tuple of strings that must all hold, each one of a layout kind
    (``page-planar``, ``planar``, ``token-interleaved``, ``interleaved``, ...), an engine key
    (``tokenspeed``, ``vllm``, ``flashmla``, ``flashmla-vllm``, ``flashmla-sglang``, ``sglang``,
    ...), a repository (``vllm-project/FlashMLA``), a version (``V4.1``), a record name or a
    kvformats format name (case does not matter).

    Raises:
        InputTypeError: ``bytes_per_token`` or ``head_dim`` is not an int, ``hint`` not a string
            or a tuple of strings.
        InputError: a count is not positive, or a hint word names nothing kvformats knows (the
            message lists the words).
    """
    _check_count("bytes_per_token", bytes_per_token, False)
    _check_count("head_dim", head_dim, True)
    terms = _hint_terms(hint)
    unknown = [t for t in terms if not any(_hint_matches(r, t) for r in RECORDS)]
    if unknown:
        raise InputError(f"hint {', '.join(map(repr, unknown))} names no record, layout kind, engine, repository, "
                         f"version or format; hints: {', '.join(hint_vocabulary())}")
    return tuple(r for r in list_records() if r.bytes_per_token == bytes_per_token
                 and (head_dim is None or r.head_dim == head_dim) and all(_hint_matches(r, t) for t in terms))


def _what_differs(candidates: Iterable[Record]) -> str:
    parts = []
    for r in candidates:
        engines = ", ".join(r.engines()) or "no engine"
        fmt = f"format {r.format}" if r.implemented else f"{r.status}, no kvformats format here"
        parts.append(f"{r.label} [{fmt}; {engines}]")
    return "; ".join(parts)


def identify_one(bytes_per_token: int, head_dim: int | None = None, hint=None) -> Record:
    """The one record ``identify`` finds. Never guesses: AmbiguousRecordError (a LayoutError)
    naming every candidate when several fit (pass a ``hint``: a layout kind, an engine, a
    format or record name), LayoutError when none does."""
    found = identify(bytes_per_token, head_dim, hint)
    asked = f"{bytes_per_token} bytes per token" + (f", head_dim {head_dim}" if head_dim is not None else "") + \
            (f", hint {hint!r}" if hint is not None else "")
    if len(found) > 1:
        kinds = ", ".join(sorted({r.layout for r in found} - {"unknown"}))
        raise AmbiguousRecordError(f"{asked} fits {len(found)} records, and kvformats does not guess: "
                                   f"{_what_differs(found)}; pass hint= (a layout kind such as {kinds}, an engine "
                                   f"or a record name)")
    if not found:
        sizes = ", ".join(str(n) for n in sorted({r.bytes_per_token for r in RECORDS}))
        raise LayoutError(f"no record known to kvformats has {asked} (known sizes in bytes: {sizes})")
    return found[0]


def bind_records() -> None:
    """Give every layout its ``record`` property (``record_of``). The declaration (layout.py)
    lies below the registry this table reads, so the package front (the composition root) hands
    the property down, as it hands the codec's ops (``layout.bind_codec``)."""
    if not isinstance(getattr(Layout, "record", None), property):
        setattr(Layout, "record", property(record_of, doc="The layout's record ABI (kvformats.codec.records)."))

