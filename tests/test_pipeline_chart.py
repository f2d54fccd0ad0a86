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


def test_ops_table_sums_the_side_by_side_ops_of_each_phase():
    doc = {"index_format": "fp8_indexer",
           "results": [{"kind": "decode", "batch": 64, "label": "decode batch 64 @ 8k", "phases_ms": PH},
                       {"kind": "prefill", "tokens": 65536, "chunk": 8192, "label": "prefill 64k", "phases_ms": PH}]}

    def case(op, rows, kvf, ts):
        return {"op": op, "size": f"decode {rows} tokens", "rows": rows * 8, "decode": True,
                "modes": {"graph20": {"kvf": kvf, "ts": ts}}}

    sbs = {"results": [case("save_state_csa", 64, 1.0, 2.0), case("save_state_hca", 64, 0.5, 1.5),
                       case("csa_compress_insert", 64, 5.0, 6.0), case("hca_compress_insert", 64, 9.0, 90.0),
                       case("indexer_fp8_compress_insert", 64, 3.0, 100.0),
                       case("indexer_mxfp4_compress_insert", 64, 1.0, 1.0)]}
    table = pc.ops_table(doc, sbs)
    assert "| decode batch 64 @ 8k | save_state | 500.0 | 1.5 | 3.5 |" in table
    assert "| decode batch 64 @ 8k | compress | 500.0 | 17.0 | 196.0 |" in table  # the fp8 indexer's op
    assert "swa_insert" not in table and "prefill" not in table  # no side-by-side figure; several chunks


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
