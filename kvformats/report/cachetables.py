"""The tables of one cache, as tensors: what a report draws, for people who want to compute.

Every table is computed by ``kvformats.report.tables``; the whole-cache ones (row status, page
overview) stream the cache in chunks once and are kept. ``kvformats.inspect`` returns an
``Inspection``, which is this and its HTML views.
"""

from __future__ import annotations

import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.layout import Layout
from kvformats.report import tables
from kvformats.validation import check_cache

class CacheTables:
    """The tables of one cache of ``layout``, as tensors."""

    def __init__(self, cache: torch.Tensor, layout: Layout, name: str = "cache") -> None:
        if not isinstance(layout, Layout):
            raise InputTypeError(f"layout must be a kvformats Layout, got {describe(layout)}")
        check_cache(layout, cache)
        if not isinstance(name, str):
            raise InputTypeError(f"name must be a str, got {describe(name)}")
        self.layout, self.cache, self.name = layout, cache, name
        self._status: torch.Tensor | None = None
        self._page_rules: dict[str, torch.Tensor] = {}
        self._check: dict | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.name!r}: {self.layout.name}, {self.pages} pages>"

    @property
    def pages(self) -> int:
        return int(self.cache.shape[0])

    def _page(self, page) -> int:
        if type(page) is not int:  # noqa: E721 - not a bool, not a float
            raise InputTypeError(f"page must be an int, got {describe(page)}")
        if not 0 <= page < self.pages:
            raise InputError(f"page {page} is out of range: the cache has {self.pages} pages")
        return page

    # ----- whole cache -------------------------------------------------------------------------
    def _summary(self) -> torch.Tensor:
        """Row status of every page. ``check`` runs first and says where to look: the written
        rows are read everywhere, the rules row by row only on the pages it found breaking one
        (on every page when it found too many to list them all), so a clean file of several GB
        costs one ``check`` and one read."""
        if self._status is None:
            from kvformats.caches.check import MAX_LISTED_PAGES

            chunk = tables.page_chunk(self.layout)
            written = [tables.written_rows(self.layout, self.cache, slice(s, s + chunk))
                       for s in range(0, self.pages, chunk)]
            status = torch.cat(written).to(torch.int8).cpu() if written else \
                torch.zeros((0, self.layout.page_size), dtype=torch.int8)
            report = self.check()
            listed = sorted({p["page"] for p in report["bad_pages"]})
            if report["ok"]:
                spans: list[slice] = []
            elif len(listed) < MAX_LISTED_PAGES:  # check listed every bad page
                spans = [slice(p, p + 1) for p in listed]
            else:
                spans = [slice(s, min(s + chunk, self.pages)) for s in range(0, self.pages, chunk)]
            rules: dict[str, torch.Tensor] = {}
            for span in spans:
                found, by_page = tables.row_status(self.layout, self.cache, span)
                status[span] = found.cpu()
                for name, bad in by_page.items():
                    rules.setdefault(name, torch.zeros(self.pages, dtype=torch.bool))[span] = bad.cpu()
            self._status, self._page_rules = status, rules
        return self._status

    def row_status(self) -> torch.Tensor:
        """int8 ``[pages, rows]``: 0 every byte zero (never written), 1 written, 2 breaks a
        ``check`` rule."""
        return self._summary().clone()

    def page_status(self, page: int) -> torch.Tensor:
        """int8 ``[rows]``: ``row_status`` of one page."""
        return self._summary()[self._page(page)].clone()

    def page_overview(self) -> dict[str, torch.Tensor]:
        """Per page (int64 ``[pages]``): rows ``written`` (not every byte zero), ``zero``
        (``written + zero`` is the page size) and ``failing`` (breaking a ``check`` rule: written
        rows, since a row of zeros breaks none); bool ``page_failing``: the page breaks a rule of
        its own (a dirty page pad)."""
        status = self._summary()
        page_failing = torch.zeros(self.pages, dtype=torch.bool)
        for bad in self._page_rules.values():
            page_failing |= bad.cpu()
        return {"zero": (status == tables.ZERO).sum(-1), "written": (status != tables.ZERO).sum(-1),
                "failing": (status == tables.FAILING).sum(-1), "page_failing": page_failing}

    def page_rules(self) -> dict[str, torch.Tensor]:
        """``"region:rule"`` -> bool ``[pages]``, for the rules of per-page regions (the page pad)."""
        self._summary()
        return {name: bad.clone() for name, bad in self._page_rules.items()}

    def pages_with_findings(self) -> list[int]:
        """Pages holding a row that breaks a ``check`` rule, or breaking one themselves."""
        overview = self.page_overview()
        return ((overview["failing"] > 0) | overview["page_failing"]).nonzero().flatten().tolist()

    def check(self) -> dict:
        """``kvformats check``'s report of the cache (``kvformats.caches.check.check``)."""
        if self._check is None:
            from kvformats.caches.check import check

            self._check = check(self.layout, self.cache)
        return self._check

    # ----- one page ----------------------------------------------------------------------------
    def findings(self, page: int) -> dict[str, torch.Tensor]:
        """``"region:rule"`` -> bool ``[rows]``: the page's rows breaking each row rule of ``check``."""
        p = self._page(page)
        by_row, _ = tables.findings(self.layout, self.cache, slice(p, p + 1))
        return {name: bad[0] for name, bad in by_row.items()}

    def page_findings(self, page: int) -> list[str]:
        """The per-page rules (``"page_pad:pad_zero"``) the page breaks."""
        p = self._page(page)
        _, by_page = tables.findings(self.layout, self.cache, slice(p, p + 1))
        return [name for name, bad in by_page.items() if bool(bad[0])]

    def values(self, page: int) -> dict[str, torch.Tensor]:
        """Data region -> float32 ``[rows, elements]``: decoded (scaled) values."""
        return tables.values(self.layout, self.cache, self._page(page))

    def nan_map(self, page: int) -> dict[str, torch.Tensor]:
        """Data region -> bool ``[rows, elements]``: decoded values that are NaN (a NaN code, or
        a NaN scale over its block)."""
        return {name: v.isnan() for name, v in self.values(page).items()}

    def inf_map(self, page: int) -> dict[str, torch.Tensor]:
        """Data region -> bool ``[rows, elements]``: decoded values that are infinite."""
        return {name: v.isinf() for name, v in self.values(page).items()}

    def saturated_map(self, page: int) -> dict[str, torch.Tensor]:
        """Data region -> bool ``[rows, elements]``: elements at their grid's largest code."""
        return tables.saturated(self.layout, self.cache, self._page(page))

    def scale_exponents(self, page: int) -> dict[str, torch.Tensor]:
        """Scale region -> float32 ``[rows, blocks]``: floor(log2 |scale|) per block (-inf: zero)."""
        return tables.scale_exponents(self.layout, self.cache, self._page(page))

    def code_histogram(self, page: int) -> dict[str, torch.Tensor]:
        """Data region -> int64 ``[bins]``: codes held by the page's written rows (wider than 8
        bits: their top byte)."""
        p = self._page(page)
        return tables.code_histogram(self.layout, self.cache, p, self._summary()[p] != tables.ZERO)
