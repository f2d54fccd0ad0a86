"""The frame around a report's sections: a whole HTML document (``kvformats report``) or a
fragment for a notebook output (``Inspection._repr_html_``), each with the stylesheet and the
script inline.

The document carries a Content-Security-Policy: no network at all (``default-src 'none'``), and
only the report's own script may run (``script-src`` names its SHA-256), so even a string that
escaped escaping could not run script or fetch anything.
"""

from __future__ import annotations

import base64
import hashlib

from kvformats.report.markup import esc
from kvformats.report.script import JS
from kvformats.report.style import CSS


def script_hash() -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(JS.encode("utf-8")).digest()).decode("ascii")


def document(title: str, body: str) -> str:
    policy = f"default-src 'none'; style-src 'unsafe-inline'; script-src '{script_hash()}'; img-src data:"
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n"
            f'<body>\n<main class="kvf" id="kvf-report">\n{body}\n</main>\n<script>{JS}</script>\n</body>\n</html>\n')


def fragment(root: str, body: str) -> str:
    return f'<div class="kvf" id="{esc(root)}"><style>{CSS}</style>{body}<script>{JS}</script></div>'
