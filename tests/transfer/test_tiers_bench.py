"""The tiers benchmark (benchmarks/bench_tiers_cpu.py): its request geometry, one small
measurement, its table and chart, and the figures docs/tiers.md quotes from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import benchmarks.bench_tiers_cpu as bench
from kvformats.transfer.tiers_rows import request_slots

ROOT = Path(__file__).resolve().parents[2]


def test_every_request_row_has_its_own_slot_on_both_sides():
    for page_size in (64, 32):
        caches, rows = bench.stack(131072, 2, page_size, seed=0, fill=False)
        assert set(caches) == {"L0.swa", "L0.csa", "L0.index", "L0.csa_state", "L0.idx_state", "L1.swa", "L1.hca",
                               "L1.hca_state"}
        for name, (start, stop) in rows.items():
            slots = request_slots(name, caches[name], start, stop)  # raises on overlap or past the pool
            assert slots.numel() == stop - start


def test_one_small_measurement_and_its_table_and_chart(tmp_path):
    row = bench.measure(1024, 2, repeat=1, dst_page_size=32, directory=str(tmp_path))
    assert row["cold_bytes"] < row["bytes"] and row["file_bytes"] >= row["bytes"]
    assert all(v > 0 for v in row["ms"].values())
    assert len(bench.table([row, row]).splitlines()) == 4
    svg = bench.svg([row], "test machine")
    assert svg.startswith("<svg") and svg.count("<rect") == 2 * len(bench.SERIES)


def test_the_docs_quote_the_committed_figures():
    data = json.loads((ROOT / "docs" / "data" / "tiers_cpu.json").read_text())
    page = (ROOT / "docs" / "tiers.md").read_text()
    assert [r["tokens"] for r in data["rows"]] == [8192, 65536, 131072]
    assert bench.table(data["rows"]) in page and data["machine"] in page
    assert (ROOT / "docs" / "figures" / "tiers_cpu.svg").read_text() == bench.svg(data["rows"], data["machine"])
