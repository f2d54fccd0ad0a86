"""``kvformats.inspect(cache, layout)``: a cache seen through its layout, in Python and notebooks.

    view = kvf.inspect(cache, layout)
    view                                  # in Jupyter: the report's page views, inline
    view.row_status()                     # int8 [pages, rows]: 0 zero, 1 written, 2 failing check
    view.scale_exponents(3)["scale"]      # float32 [rows, blocks] of page 3
    view.nan_map(3)["nope"]               # bool [rows, elements]

The tables are ``CacheTables``'; the views are the report's (``kvformats.report.cacheview``),
plain HTML with their style and script inline, so no notebook package is needed.
"""

from __future__ import annotations

import uuid

import torch

from kvformats.errors import InputError
from kvformats.layout import Layout
from kvformats.report.cachetables import CacheTables
from kvformats.report.selection import DEFAULT_MAX_PAGES


class Inspection(CacheTables):
    """A cache's tables as tensors (``CacheTables``) and its page views (``_repr_html_``)."""

    def html(self, pages: list[int] | None = None, max_pages: int = DEFAULT_MAX_PAGES) -> str:
        """An HTML fragment (style and script inline): identity, byte map, page overview and the
        views of the first ``max_pages`` pages, the pages with findings and ``pages``. Its
        element ids are its own, so that several outputs on one notebook page never collide."""
        # the drawing modules load on the first view: importing kvformats does not pay for them
        from kvformats.report import page_assets
        from kvformats.report.cacheview import cache_section, choose_pages

        if type(max_pages) is not int or max_pages < 0:  # noqa: E721 - not a bool
            raise InputError(f"max_pages must be a non-negative int, got {max_pages!r}")
        named = [self._page(p) for p in pages or ()]
        root = f"kvf-{uuid.uuid4().hex[:10]}"
        body = cache_section(self, 0, f"{root}-c0", choose_pages(self, named, max_pages, None))
        return page_assets.fragment(root, body)

    def _repr_html_(self) -> str:
        return self.html()


def inspect(cache: torch.Tensor, layout: Layout, name: str = "cache") -> Inspection:
    """See ``cache`` through ``layout``: an ``Inspection`` with its tables as tensors and its
    page views inline in Jupyter. InputTypeError / LayoutError when the cache does not fit the
    layout."""
    return Inspection(cache, layout, name)
