"""The transfer benchmark's request geometry, chart and table (no engine needed), and the byte
budget docs/transfer.md states from it."""

from __future__ import annotations

from pathlib import Path

import benchmarks.bench_transfer_cpu as bench

DOC = (Path(__file__).resolve().parents[2] / "docs" / "transfer.md").read_text(encoding="utf-8")


def layer_bytes(tokens: int, layer: int) -> int:
    return sum(layout.page_bytes * pages for layout, pages in bench.request_caches(tokens, layer).values())


def test_the_budget_on_the_docs_page_is_the_benchmarks_geometry():
    csa, hca = layer_bytes(131072, 0), layer_bytes(131072, 1)
    assert (csa, hca) == (22_127_744, 1_460_352)
    assert f"**{csa:,}**" in DOC and f"**{hca:,}**" in DOC
    assert f"{(31 * csa + 30 * hca) / 1e6:.1f} MB per request" in DOC


def test_stack_pages_are_distinct_and_inside_each_pool():
    caches, pages = bench.stack(8192, 2, seed=0)
    for name, ids in pages.items():
        assert ids.unique().numel() == ids.numel() and int(ids.max()) < caches[name][1].shape[0]


def test_chart_and_table_show_every_row():
    rows = [{"engine": e, "tokens": t, "layers": 4, "bytes": 5_000_000, "segments_before": 10, "segments": 9,
             "segments_in_order": 2, "GB/s plan": 1.5, "GB/s contiguous": 3.0, "GB/s in-process copy": 9.0}
            for e in ("nixl", "mooncake") for t in (8192, 131072)]
    svg = bench.svg(rows)
    assert svg.startswith("<svg") and svg.count("<rect") == 3 + 3 * len(rows)
    assert "mooncake 128k" in svg
    assert len(bench.table(rows).splitlines()) == 2 + len(rows)


def test_checksum_cost_rows_cover_every_cache_kind_and_the_request():
    rows = bench.measure_checksums(1024, 2, repeat=1)
    assert [r["cache"] for r in rows] == ["swa", "csa", "index", "csa_state", "idx_state", "hca", "hca_state",
                                          "request"]
    assert rows[-1]["bytes"] == sum(r["bytes"] for r in rows[:-1]) and all(r["mixed_ms"] > 0 for r in rows)
    assert len(bench.checksum_table(rows).splitlines()) == 2 + len(rows)


def test_the_baseline_is_the_old_linear_sums():
    """linear_checksums restates the checksum issue 44 replaced: a swap of two equal-sum blocks
    leaves it unchanged (why it was replaced), a single changed byte does not."""
    import torch

    layout = bench.INDEX
    cache = layout.allocate(1)
    u8 = layout.byte_pages(cache)[0]
    u8[0, :8] = torch.tensor([1, 2, 3, 4, 4, 3, 2, 1], dtype=torch.uint8)
    rows, page = torch.tensor([[0, 64]]), torch.tensor([0])
    base = bench.linear_checksums(layout, cache, page, rows)
    u8[0, :8] = torch.tensor([4, 3, 2, 1, 1, 2, 3, 4], dtype=torch.uint8)  # the two 4-byte blocks swapped
    assert torch.equal(bench.linear_checksums(layout, cache, page, rows), base)
    u8[0, 0] += 1
    assert not torch.equal(bench.linear_checksums(layout, cache, page, rows), base)
