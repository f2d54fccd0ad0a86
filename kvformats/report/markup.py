"""HTML text from values: every string is escaped here, once, so that names and metadata read
from a file (which may hold ``<script>`` or ``onerror=``) are shown as text and never run."""

from __future__ import annotations

import html
import json

# JSON inside <script type="application/json">: "</script>" or "<!--" in a string would end or
# change the element, so the characters that start markup are written as JSON escapes (JSON.parse
# reads them back); U+2028 and U+2029 as well, which older JavaScript parsers took as line ends.
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def esc(value) -> str:
    """``value`` as text safe in HTML content and in quoted attribute values."""
    return html.escape(str(value), quote=True)


def attrs(**values) -> str:
    """`` key="value"`` pairs, escaped; a trailing underscore is dropped (``class_``), other
    underscores become dashes (``data_row`` -> ``data-row``); None values are left out."""
    parts = []
    for key, value in values.items():
        if value is None:
            continue
        name = key.rstrip("_").replace("_", "-")
        parts.append(f' {name}="{esc(value)}"')
    return "".join(parts)


def tag(name: str, content: str = "", **values) -> str:
    """``<name attrs>content</name>``; ``content`` is markup already (escape text with ``esc``)."""
    return f"<{name}{attrs(**values)}>{content}</{name}>"


def json_for_script(obj) -> str:
    """``obj`` as JSON that can sit inside a <script> element and cannot end it."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, sort_keys=True)
    for char, escape in _JSON_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def table(header: list[str], rows: list[list[str]], class_: str = "kvf-table") -> str:
    """A table of markup cells (escape text cells with ``esc`` first)."""
    head = "".join(tag("th", esc(h)) for h in header)
    body = "".join(tag("tr", "".join(tag("td", c) for c in row)) for row in rows)
    return tag("table", tag("thead", tag("tr", head)) + tag("tbody", body), class_=class_)


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
