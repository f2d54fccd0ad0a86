"""The types of the record table (kvformats.codec.records): a ``Source`` (who writes or reads a
record, where, at which commit or release) and a ``Record`` (one record ABI), with the helpers
that read a record identity (the dict cache files and the transfer handshake carry)."""

from __future__ import annotations

import attrs

from kvformats.codec.registry import get_format, list_formats
from kvformats.errors import LayoutError
from kvformats.layout import Layout

# Layout kinds: where a token's bytes lie in a page.
LAYOUT_KINDS = {
    "page-planar": "a page holds its page_size data records, then its page_size scale records; no page pad",
    "token-interleaved": "each token's data bytes are followed by its own scale bytes (one record per token)",
    "page-tail scales": "the V4 584 B row's layout: a page's data records (NoPE and RoPE), then its scale "
                        "records at the page tail, the page padded to a whole number of data records",
    "unscaled rows": "one unquantized record per token (no scales)",
    "unknown": "not read byte by byte here (a record known from a pull request or a note)",
}
# What a hint may also say for a layout kind.
KIND_ALIASES = {"planar": "page-planar", "interleaved": "token-interleaved", "page-tail": "page-tail scales"}
ROLES = ("writes", "reads", "writes, reads", "reference", "proposes")
# Identity fields: what a file and a handshake carry, and compare.
IDENTITY_KEYS = ("name", "version", "layout", "bytes_per_token", "head_dim")


@attrs.frozen
class Source:
    """One project's code that writes or reads a record: ``engine`` is the short key a hint
    names (``"vllm"``, ``"tokenspeed"``, ``"flashmla"`` for deepseek-ai/FlashMLA,
    ``"flashmla-vllm"`` / ``"flashmla-sglang"`` for the forks); ``repository`` is
    ``owner/name`` on GitHub or ``pypi:<package>``; ``version`` a commit, a release, or ""
    (read without recording one, spec/engines.md); ``pull`` a pull request number when the code
    is known only from one; ``profile`` the kvformats numerics profile that reproduces its
    bytes ("" when none does)."""

    engine: str
    project: str
    repository: str
    path: str
    version: str
    role: str = attrs.field(validator=attrs.validators.in_(ROLES))
    symbol: str = ""
    profile: str = ""
    pull: int | None = None

    @property
    def url(self) -> str:
        """Where to read it: the PyPI release, the pull request, or the file at its commit."""
        if self.repository.startswith("pypi:"):
            return f"https://pypi.org/project/{self.repository[5:]}/{self.version}/"
        if self.pull is not None:
            return f"https://github.com/{self.repository}/pull/{self.pull}"
        if self.version and self.path:
            return f"https://github.com/{self.repository}/blob/{self.version}/{self.path}"
        return f"https://github.com/{self.repository}"

    @property
    def where(self) -> str:
        """``repository path @version`` (or ``#pull``), for tables and messages."""
        at = f"#{self.pull}" if self.pull is not None else f"@{self.version}" if self.version else ""
        return " ".join(p for p in (self.repository, self.path) if p) + (f" {at}" if at else "")

    def as_dict(self) -> dict:
        return {**attrs.asdict(self), "url": self.url}


def _params(value) -> tuple[tuple[str, int | str], ...]:
    return tuple(sorted(dict(value).items()))


@attrs.frozen
class Record:
    """One KV-cache record ABI.

    ``name``: the record's identity (``dsv41-fp8-528-planar``); ``version``: the DeepSeek model
    version(s) it serves (``V4.1``); ``bytes_per_token`` and ``head_dim``: its size and the
    head size it stores; ``layout``: its kind (``LAYOUT_KINDS``); ``format`` and ``params``: the
    kvformats format (and non-default parameters) implementing it, "" for none; ``profiles``:
    the numerics profiles engines write it with, for a record whose format is not registered
    here (a registered format's own table wins, ``profile_names``); ``sources``: who writes
    and reads it; ``derived``: an identity made from a layout, not declared here."""

    name: str
    version: str
    bytes_per_token: int
    head_dim: int
    layout: str = attrs.field(validator=attrs.validators.in_(LAYOUT_KINDS))
    summary: str
    format: str = ""
    params: tuple[tuple[str, int | str], ...] = attrs.field(default=(), converter=_params)
    profiles: tuple[str, ...] = ()
    sources: tuple[Source, ...] = ()
    note: str = ""
    derived: bool = False

    @property
    def implemented(self) -> bool:
        """Whether kvformats implements it here: its format is registered."""
        return bool(self.format) and self.format in list_formats()

    @property
    def status(self) -> str:
        """``implemented``, ``declared`` (its format is named but not registered here) or
        ``known`` (no kvformats format: known from a pull request or a note)."""
        return "implemented" if self.implemented else "declared" if self.format else "known"

    def layout_object(self) -> Layout:
        """The registered layout of this record (its format at these parameters); LayoutError
        for a record kvformats does not implement here."""
        if not self.implemented:
            why = f"its format {self.format!r} is not registered" if self.format else "no format"
            raise LayoutError(f"record {self.name} is not implemented by a registered kvformats format ({why})")
        return get_format(self.format, **dict(self.params))

    def profile_names(self) -> tuple[str, ...]:
        """The numerics profiles of its format (the registered table, default first), else the
        declared ones."""
        if self.implemented:
            table = getattr(type(get_format(self.format)), "PROFILES", None)
            return tuple(table.names) if table is not None else ()
        return self.profiles

    def engines(self) -> tuple[str, ...]:
        """The engine keys of its sources, in order, once each."""
        return tuple(dict.fromkeys(s.engine for s in self.sources))

    def identity(self) -> dict:
        """What a cache file and a transfer handshake carry: ``IDENTITY_KEYS``."""
        return {k: getattr(self, k) for k in IDENTITY_KEYS}

    @property
    def label(self) -> str:
        """One line naming the identity: ``dsv41-fp8-528-planar (V4.1, 528 B/token, head_dim 512,
        page-planar)``."""
        return identity_label(self.identity())

    def as_dict(self) -> dict:
        """JSON-ready (``kvformats records --json``)."""
        return {"name": self.name, "version": self.version, "bytes_per_token": self.bytes_per_token,
                "head_dim": self.head_dim, "layout": self.layout, "summary": self.summary, "format": self.format,
                "params": dict(self.params), "profiles": list(self.profile_names()), "status": self.status,
                "derived": self.derived, "note": self.note, "sources": [s.as_dict() for s in self.sources]}


def identity_label(identity: dict) -> str:
    """An identity (``Record.identity()``, or one read from a file or a peer) as one line."""
    version = f"{identity.get('version')}, " if identity.get("version") else ""
    return (f"{identity.get('name')} ({version}{identity.get('bytes_per_token')} B/token, "
            f"head_dim {identity.get('head_dim')}, {identity.get('layout')})")


def identity_problem(identity) -> str | None:
    """None when ``identity`` has the shape of ``Record.identity()`` (the keys, strings and
    positive ints, a known layout kind); else what is wrong (files and peers are not trusted)."""
    if not isinstance(identity, dict):
        return f"a record identity must be a JSON object, got {type(identity).__name__}"
    if set(identity) != set(IDENTITY_KEYS):
        return f"a record identity has the keys {list(IDENTITY_KEYS)}, got {sorted(identity)}"
    for key in IDENTITY_KEYS:
        value = identity[key]
        if key in ("bytes_per_token", "head_dim"):
            if type(value) is not int or value < 0:  # noqa: E721 - not a bool, not a float
                return f"record identity field {key!r} must be a non-negative integer, got {value!r}"
        elif not isinstance(value, str):
            return f"record identity field {key!r} must be a string, got {value!r}"
    if identity["layout"] not in LAYOUT_KINDS:
        return f"record identity layout {identity['layout']!r} is not one of {', '.join(LAYOUT_KINDS)}"
    return None
