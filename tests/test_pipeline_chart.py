"""tools/pipeline_chart.py: table rows and SVG from a benchmark JSON (no GPU needed)."""

from __future__ import annotations

import xml.dom.minidom

from scripts import load_script

pc = load_script("tools/pipeline_chart.py")

PH = dict.fromkeys(pc.PHASES, 0.5)
DOC = {"device": "dev", "torch": "t", "topk": 512, "index_format": "fp8_indexer", "date": "2026-12-04",
       "results": [{"label": "decode batch 64 @ 8k", "eager_ms": 4.5, "graph_ms": 3.25, "phases_ms": PH},
                   {"label": "prefill 128k", "error": "out of memory: tried"}]}


def test_markdown_rows_and_error():
    md = pc.markdown_table(DOC)
    assert "| decode batch 64 @ 8k | 4.50 | 3.25 |" in md
    assert "not run: out of memory: tried" in md


def test_svg_parses_and_has_one_rect_per_phase():
    svg = pc.svg_chart(DOC)
    dom = xml.dom.minidom.parseString(svg)
    assert len(dom.getElementsByTagName("rect")) == 2 * len(pc.PHASES)  # bar segments + legend


def test_update_doc_replaces_between_markers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(f"a\n{pc.BEGIN}\nold\n{pc.END}\nb\n")
    pc.update_doc(page, "NEW")
    assert page.read_text() == f"a\n{pc.BEGIN}\nNEW\n{pc.END}\nb\n"


def test_quality_chart_table_and_svg():
    qc = load_script("tools/quality_chart.py")

    rep = {"rows": [{"run": "a", "swa": 0.05, "csa": 0.2, "hca": 0.01, "layer": 0.05, "recall": 0.9},
                    {"run": "b", "swa": None, "csa": None, "hca": None, "layer": None, "recall": 0.5}]}
    assert "| b | — | — | — | — | 0.5000 |" in qc.markdown_table(rep)
    dom = xml.dom.minidom.parseString(qc.svg_chart(rep))
    assert len(dom.getElementsByTagName("rect")) == 4 + 2
