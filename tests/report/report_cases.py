"""Cache files for the report tests, each with something planted where the report must show it:
a NaN code, a zeroed page, a one-byte difference between two files, hostile metadata."""

from __future__ import annotations

import json
import re

import torch

import kvformats as kvf
from kvformats.caches.files import save_cache, save_caches
from tests.test_hardening_files import rewrite_metadata

PAGES, PAGE_SIZE = 48, 16
NAN_AT = (1, 3, 70)  # page, row, element of nope: block 70 // 64 = 1
ZERO_PAGE = 2
DIFF_AT = (37, 5, 2)  # page, row, scale byte changed in the other file: beyond the first pages shown
HOSTILE = ('<script>window.__pwned=1</script>', '<img src=x onerror="window.__pwned=1">')


def layout():
    return kvf.get_format("fp8_ds_mla", page_size=PAGE_SIZE)


def written_cache(lay, pages: int = PAGES, seed: int = 0) -> torch.Tensor:
    """Every row of every page written with random rows (of per-row magnitudes that differ)."""
    gen = torch.Generator().manual_seed(seed)
    cache = lay.allocate(pages)
    n = pages * lay.page_size
    x, kwargs, _ = lay.examples.encode_args(
        n, lambda shape: torch.randn(shape, generator=gen) * torch.rand(shape[0], 1, generator=gen) * 8, gen)
    lay.encode(x, cache, torch.arange(n), **kwargs)
    return cache


def byte_at(lay, region: str, page: int, row: int, byte: int) -> int:
    """Index into a cache's [pages, page_bytes] bytes of one byte of a region's row."""
    r = lay.region(region)
    return page * lay.page_bytes + r.offset + row * r.row_stride + byte


def planted(tmp_path):
    """(path of A, path of B, layout, cache A): A has a NaN code at NAN_AT and page ZERO_PAGE
    zeroed; B is A with one scale byte changed at DIFF_AT."""
    lay = layout()
    cache = written_cache(lay)
    flat = cache.view(-1)
    page, row, element = NAN_AT
    flat[byte_at(lay, "nope", page, row, element)] = 0x7F  # an e4m3 NaN code
    cache[ZERO_PAGE] = 0
    a, b = tmp_path / "engine_a.safetensors", tmp_path / "engine_b.safetensors"
    save_cache(a, lay, cache, name="layer0.mla")
    other = cache.clone()
    page, row, byte = DIFF_AT
    other.view(-1)[byte_at(lay, "scale", page, row, byte)] += 1  # the scale exponent off by one
    save_cache(b, lay, other, name="layer0.mla")
    return a, b, lay, cache


def hostile(tmp_path):
    """A readable cache file whose every string field holds markup: the file versions, the cache
    name, and an entry field the loader ignores."""
    lay = kvf.get_format("fp8_indexer", page_size=4)
    name = '<img src=x onerror="window.__pwned=1">'
    path = tmp_path / "clean.safetensors"
    save_caches(path, {name: (lay, written_cache(lay, 2))})

    def edit(meta):
        meta["library_version"], meta["spec_version"] = HOSTILE
        meta["tensors"][name]["note"] = "</script><script>window.__pwned=1</script>"

    return rewrite_metadata(path, tmp_path / "hostile.safetensors", edit)


def hostile_pages(tmp_path):
    """Every format, small, with pages that break every rule: written rows, a page of 0xFF bytes
    (NaN codes and scales, dirty pads) and a page of random bytes."""
    caches = {}
    for name in kvf.list_formats():
        lay = kvf.get_format(name, **type(kvf.get_format(name)).examples.small_params)
        cache = written_cache(lay, 3)
        raw = cache.view(torch.uint8).view(3, -1)
        raw[1] = 0xFF
        raw[2] = torch.randint(0, 256, raw[2].shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        caches[name] = (lay, cache)
    path = tmp_path / "hostile_pages.safetensors"
    save_caches(path, caches)
    return path


_DEMO: dict = {}


def demo_report(tmp_path_factory):
    """(cache file, report) of the issue's newcomer, made once per test process:
    ``kvformats demo --save x.safetensors && kvformats report x.safetensors -o r.html``."""
    from kvformats.cli import main

    if "paths" not in _DEMO:
        folder = tmp_path_factory.mktemp("demo")
        demo, out = folder / "x.safetensors", folder / "r.html"
        assert main(["demo", "--rows", "64", "--device", "cpu", "--save", str(demo)]) == 0
        assert main(["report", str(demo), "-o", str(out), "--max-pages", "1"]) == 0
        _DEMO["paths"] = demo, out
    return _DEMO["paths"]


def embedded(html: str) -> list[dict]:
    """The JSON each cache section embeds, parsed."""
    return [json.loads(m) for m in re.findall(r'<script type="application/json" class="kvf-data">(.*?)</script>',
                                              html, re.S)]


def section(html: str, element_id: str) -> str:
    """The markup of the element with ``element_id`` (a page or cache section), up to the next one."""
    start = html.index(f'id="{element_id}"')
    nxt = html.find('<section id="', start + 1)
    return html[start:nxt if nxt > 0 else len(html)]
