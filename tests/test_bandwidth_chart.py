"""tools/bandwidth_chart.py: bars and table from a kernels benchmark JSON (no GPU needed)."""

from __future__ import annotations

import xml.dom.minidom

from scripts import load_script

chart = load_script("tools/bandwidth_chart.py")


def _doc():
    import benchmarks.bench_kernels_gpu as bench

    lines = ["date 2026-12-04  device X", "copy bandwidth 4200 GB/s", "",
             "| format | op | rows | slots | eager µs | graph µs | GB/s | % copy BW |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |",
             "| fp8_ds_mla | encode | 64 | prefill | 9.0 | 1.40 | 50 | 1 |",
             "| fp8_ds_mla | encode | 64 | random | 9.0 | 1.50 | 45 | 1 |",
             "| fp8_ds_mla | encode | 131072 | prefill | 30.0 | 28.0 | 3650 | 87 |", "",
             "| format | paged op | rows | eager µs | graph µs | GB/s | % copy BW |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
             "| fp8_indexer | dequantize_gather 1x131072 | 131072 | 44.6 | 28.4 | 2971 | 70 |",
             "| fp8_indexer | dequantize_gather 8x16384 | 131072 | 44.6 | 28.4 | 2971 | 71 |",
             "| fp8_indexer | gather_paged 8x16384 | failed: OutOfMemory |"]
    return {"head": lines[:2], "rows": bench.table_records(lines)}


def test_bars_keep_prefill_codecs_and_single_request_paged_rows():
    assert chart.bars(_doc()) == [("fp8_ds_mla encode", 64, 1.0), ("fp8_ds_mla encode", 131072, 87.0),
                                  ("fp8_indexer dequantize_gather", 131072, 70.0)]


def test_svg_parses_and_table_has_a_row_per_op():
    dom = xml.dom.minidom.parseString(chart.svg(_doc()))
    assert len(dom.getElementsByTagName("rect")) == 3 + 2  # bars + legend (two sizes)
    md = chart.markdown(_doc())
    assert "| fp8_ds_mla encode | 1 % | 87 % |" in md and "| fp8_indexer dequantize_gather | — | 70 % |" in md
