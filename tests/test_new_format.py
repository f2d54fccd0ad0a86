"""A format declared here, in the test, and registered through the public registry: the demo, the
CLI (list, show, check, dump), the spec JSON, the generated docs, the hypothesis strategies, the
code distance and the converter handle it with no edit anywhere else, and its error bound comes
from its declaration (element types and scale blocks).

The format: one record per row of e4m3 values in blocks of 16 with a ue8m0 exponent each, a
bf16 tail kept as given, and two pad bytes; the V4 scale rule (amax floored at 1e-4).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvformats as kvf
from kvformats.caches.check import check
from kvformats.cli import build_parser, main
from kvformats.cli.demo import _ratio, element_bound
from kvformats.codec import registry
from kvformats.codec.convert import convert_rows
from kvformats.codec.slot_ops import register_reference_ops
from kvformats.errors import LayoutError
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.numerics import codes as nx
from kvformats.testing import strategies as kst
from kvformats.testing.tolerance import code_distance

NAME = "test_tiny_rows"
BLOCK = 16
REPO = Path(__file__).resolve().parents[1]


@attrs.frozen(kw_only=True)
class TinyRows(Layout):
    """``TinyRows(head_dim=48, tail=16, page_size=8)``: 68 B rows (32 e4m3, 16 bf16, 2 ue8m0, 2 pad)."""

    name = NAME
    scale_rule = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="absmax")
    quant_input_dtype = torch.bfloat16
    examples = Examples(params=(dict(head_dim=48, tail=16), dict(head_dim=40, tail=8), dict(head_dim=18, tail=2)),
                        page_size_range=(1, 8))

    head_dim: int = attrs.field(default=48, validator=positive)
    tail: int = attrs.field(default=16, validator=positive)
    page_size: int = attrs.field(default=8, validator=positive)

    def _check_geometry(self) -> None:
        if self.head_dim <= self.tail or (self.head_dim - self.tail) % BLOCK:
            raise LayoutError(f"{NAME} needs head_dim - tail to be a positive multiple of {BLOCK}")

    def _segments(self):
        nb = (self.head_dim - self.tail) // BLOCK
        return (Segment("row", (
            Field("values", "float8_e4m3fn", self.head_dim - self.tail, scale="scale", block=BLOCK),
            Field("tail", "bfloat16", self.tail),
            Field("scale", "float8_e8m0fnu", nb, role="scale"),
            Field("pad", "uint8", 2, role="pad"),
        )),)

    @property
    def decode_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        n, q = x.shape[0], self.head_dim - self.tail
        xq = x.to(torch.bfloat16)
        blocks = xq[:, :q].float().reshape(n, q // BLOCK, BLOCK)
        e = self.scale_rule.exponents(blocks)
        out = torch.zeros((n, self.row_bytes), dtype=torch.uint8, device=x.device)
        out[:, self.row_span("values")] = nx.e4m3_quantize_blocks(blocks, e).reshape(n, q)
        out[:, self.row_span("tail")] = xq[:, q:].contiguous().view(torch.uint8)
        out[:, self.row_span("scale")] = nx.ue8m0_encode(e)
        return out

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        n, q = rows.shape[0], self.head_dim - self.tail
        e = rows[:, self.row_span("scale")].to(torch.int32) - nx.UE8M0_BIAS
        values = nx.e4m3_decode_pow2(rows[:, self.row_span("values")].reshape(n, q // BLOCK, BLOCK), e)
        tail = rows[:, self.row_span("tail")].contiguous().view(torch.bfloat16)
        return torch.cat([values.reshape(n, q).to(torch.bfloat16), tail], dim=1)


@pytest.fixture
def tiny():
    """The format registered for one test, then removed (other tests list every format)."""
    registry.register_format(TinyRows)
    register_reference_ops(NAME)
    try:
        yield kvf.get_format(NAME)
    finally:
        registry.unregister_format(NAME)


def _rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-8, 8, (n, 1), generator=g).float())
    return x.to(torch.bfloat16)


def _filled(layout, n: int = 12):
    cache = layout.allocate(-(-n // layout.page_size) + 1)
    slots = torch.arange(n)
    x = _rows(n, layout.head_dim)
    layout.encode(x, cache, slots)
    return cache, slots, x


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_registration_is_public_and_undone(tiny):
    assert NAME in kvf.list_formats() and kvf.get_format(NAME, head_dim=40, tail=8).row_bytes == 32 + 16 + 2 + 2
    assert tiny.row_bytes == 68 and [r.name for r in tiny.regions] == ["values", "tail", "scale", "pad"]
    registry.unregister_format(NAME)
    assert NAME not in kvf.list_formats()
    with pytest.raises(LayoutError):
        registry.unregister_format(NAME)
    registry.register_format(TinyRows)  # for the fixture's own clean-up
    register_reference_ops(NAME)


def test_round_trip_within_the_declared_bound(tiny):
    cache, slots, x = _filled(tiny, 40)
    x32 = x.float()
    bound = element_bound(tiny, x32)
    q = tiny.head_dim - tiny.tail
    assert bool((bound[:, :q] > 0).all()) and bool((bound[:, q:] == 0).all())  # tail exact, values scaled
    err = (tiny.decode(cache, slots).float() - x32).abs()
    assert _ratio(err, bound) <= 1
    # the bound is the e4m3 one of the element table: max(|x|/16, 2^(e-10)) per block of 16
    e = tiny.scale_rule.exponents(x32[:, :q].reshape(40, -1, BLOCK)).float().unsqueeze(-1)
    want = torch.maximum(x32[:, :q].reshape(40, -1, BLOCK).abs() / 16, torch.exp2(e - 10)).reshape(40, q)
    assert torch.equal(bound[:, :q], want)


def test_demo_runs_it_within_its_bound(tiny, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "demo", "--rows", "32", "--device", "cpu")
    assert code == 0 and err == "", out + err
    assert f"{NAME}(head_dim=48, tail=16, page_size=8)" in out
    assert out.splitlines()[-1] == f"verdict: all {len(kvf.list_formats())} formats round-trip within their bounds"


def test_list_show_spec_and_docs_derive_it(tiny, capsys, tmp_path):
    code, out, _ = _run(capsys, "list")
    assert code == 0 and any(line.split()[:3] == [NAME, "68", str(8 * 68)] for line in out.splitlines())
    code, out, _ = _run(capsys, "show", NAME, "--param", "head_dim=40", "--param", "tail=8")
    assert code == 0 and "tail" in out and "float8_e8m0fnu" in out
    assert _run(capsys, "spec", "--write", "--dir", tmp_path)[0] == 0
    assert _run(capsys, "spec", "--check", "--dir", tmp_path)[0] == 0
    spec = json.loads((tmp_path / f"{NAME}.json").read_text())
    assert spec["row_bytes"] == 68 and spec["numerics"]["quant_block"] == BLOCK
    assert spec["numerics"]["element_type"] == "float8_e4m3fn" and spec["numerics"]["scale_dtype"] == "float8_e8m0fnu"
    assert spec["numerics"]["error_bound"].startswith("|x - x_hat| <= max(|x|/16, 2^(e-10))")
    from kvformats.spec.docgen import expected_docs

    docs = expected_docs(REPO, build_parser())
    assert f"| `tail` | bfloat16 | [16] |" in docs[f"reference/formats/{NAME}.md"]
    assert docs[f"diagrams/{NAME}.svg"].startswith("<svg")
    from kvformats.spec.format_lists import expected_lists

    lists = expected_lists(REPO)  # the index table, the site's nav and the spec's list gain it
    assert f"- {NAME}: reference/formats/{NAME}.md" in lists["mkdocs.yml"]
    assert (f"| [{NAME}](reference/formats/{NAME}.md) | 68 B | 544 B (8) | e4m3 values, bf16 tail, "
            f"ue8m0 scale per 16 |") in lists["docs/index.md"]
    assert f"* `{NAME}`: [formats/{NAME}.md](formats/{NAME}.md), 68 B rows" in lists["spec/README.md"]


def test_check_and_dump_read_a_cache_file_of_it(tiny, capsys, tmp_path):
    pytest.importorskip("safetensors")
    from kvformats.caches.files import save_caches

    cache, slots, _ = _filled(tiny)
    path = tmp_path / "tiny.safetensors"
    save_caches(path, {"tiny": (tiny, cache)})
    code, out, _ = _run(capsys, "check", path)
    assert code == 0 and "ok" in out.splitlines()[0]
    code, out, _ = _run(capsys, "dump", path, "--slot", 3)
    assert code == 0 and all(name in out for name in ("values", "tail", "scale", "pad"))
    code, out, _ = _run(capsys, "dump", path, "--page", 0, "--json")
    assert code == 0 and {line["region"] for line in json.loads(out)["lines"]} == {"values", "tail", "scale", "pad"}

    scale, pad, tail = (tiny.region(n) for n in ("scale", "pad", "tail"))
    cache[0, scale.offset + 1 * scale.row_stride] = 0xFF        # page 0 row 1: a NaN exponent
    cache[0, pad.offset + 2 * pad.row_stride + 1] = 0x01         # page 0 row 2: a pad byte set
    cache[1, 1 * tiny.row_bytes] = 0x7F                          # page 1 row 1: an e4m3 NaN code
    cache[1, tail.offset + 2 * tail.row_stride:][:2] = torch.tensor([0x80, 0x7F])  # row 2: bf16 +Inf
    save_caches(path, {"tiny": (tiny, cache)})
    code, out, _ = _run(capsys, "check", path, "--json")
    report = json.loads(out)["tensors"][0]
    assert code == 1 and not report["ok"]
    bad = {rule: r["first_pages"] for rule, r in report["rules"].items() if r["bad_pages"]}
    assert bad == {"ue8m0_not_ff": [0], "scale_range": [0], "pad_zero": [0], "e4m3_not_nan": [1],
                   "bfloat16_finite": [1]}


def test_code_distance_and_conversion_read_its_regions(tiny):
    rows = tiny.encode_rows(_rows(4, 48))
    d = code_distance(tiny, rows, rows.clone())
    assert d.within_one_code() and d.values == 4 * 48
    other = rows.clone()
    other[0, tiny.row_span("scale").start] ^= 1
    assert not code_distance(tiny, other, rows).exact_equal
    wide = kvf.get_format(NAME, page_size=4)
    assert torch.equal(convert_rows(tiny, rows, wide, exact=True), rows)
    assert check(tiny, tiny.allocate(2))["ok"]


def test_strategies_draw_its_declared_parameters_and_blocks(tiny):
    seen = set()

    @settings(max_examples=25, deadline=None)
    @given(kst.layouts(NAME), st.data())
    def round_trip(layout, data):
        seen.add((layout.head_dim, layout.tail))
        assert 1 <= layout.page_size <= 8
        x, kwargs = data.draw(kst.encode_args(layout, n=3))
        slots = data.draw(kst.slot_mappings(2 * layout.page_size, 3))
        cache = data.draw(kst.caches(layout, num_pages=2))  # sentinel bytes around the rows
        layout.encode(x, cache, slots, **kwargs)
        x32 = x.to(torch.bfloat16).float()
        err = (layout.decode(cache, slots).float() - x32).abs()[slots >= 0]
        assert _ratio(err, element_bound(layout, x32)[slots >= 0]) <= 1
        zeroed = layout.allocate(2)
        layout.encode(x, zeroed, slots, **kwargs)
        assert check(layout, zeroed)["ok"]

    round_trip()
    assert seen <= {(p["head_dim"], p["tail"]) for p in TinyRows.examples.params} and seen


def test_its_capabilities_are_read_from_the_declaration_and_the_registry(tiny):
    from kvformats.errors import InputError
    from tests.harness.capabilities import has

    assert registry.has_backend(NAME, "encode", "reference") and not registry.has_backend(NAME, "encode", "triton")
    assert has(NAME, "paged_reads") and not has(NAME, "published") and not has(NAME, "one_block")
    assert not has(NAME, "kernels", op="decode")
    assert has("fp8_ds_mla", "published") and has("fp8_ds_mla", "one_block") and has("fp8_ds_mla", "kernels")
    assert not has("compressor_state", "paged_reads")
    assert tiny.decode_dtypes == (torch.bfloat16,) and tiny.examples.small_params == {"page_size": 4}
    with pytest.raises(InputError, match="wings"):
        has(NAME, "wings")
    with pytest.raises(kvf.InputError, match="cuda"):
        registry.has_backend(NAME, "encode", "cuda")
