"""The whole suite on a format declared here, in one file and nothing else: the module below is
written to a temporary folder, named to pytest in ``KVFORMATS_EXTRA_FORMATS`` (tests/conftest.py
registers it before any test module is collected), and every test parametrized over the formats
is run for it in a subprocess. None may fail; many must run; and each one skipped must name the
declared capability the format lacks (``tests.harness.capabilities``): it has no Triton
kernels and no committed spec files, and it names no one-block geometry.

This is what docs/howto/add-a-format.md walks through.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from tests.harness.capabilities import CAPABILITIES

REPO = Path(__file__).resolve().parents[1]
NAME = "scratch_rows"

# The one file a new format is: its declaration and its codec (the how-to's example).
FORMAT_MODULE = '''
import attrs
import torch

from kvformats.errors import LayoutError
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.numerics import codes as nx

BLOCK = 16


@attrs.frozen(kw_only=True)
class ScratchRows(Layout):
    """e4m3 values in blocks of 16, a ue8m0 exponent per block, a bf16 tail and 2 pad bytes."""

    name = "scratch_rows"
    scale_rule = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="absmax")
    quant_input_dtype = torch.bfloat16  # the tail is stored in bf16: encode rounds its input to it
    examples = Examples(params=(dict(head_dim=48, tail=16), dict(head_dim=40, tail=8)))  # what the suite runs

    head_dim: int = attrs.field(default=48, validator=positive)
    tail: int = attrs.field(default=16, validator=positive)
    page_size: int = attrs.field(default=8, validator=positive)

    def _check_geometry(self):
        if self.head_dim <= self.tail or (self.head_dim - self.tail) % BLOCK:
            raise LayoutError(f"scratch_rows needs head_dim - tail to be a positive multiple of {BLOCK}")

    def _segments(self):
        q = self.head_dim - self.tail
        return (Segment("row", (
            Field("values", "float8_e4m3fn", q, scale="scale", block=BLOCK),
            Field("tail", "bfloat16", self.tail),
            Field("scale", "float8_e8m0fnu", q // BLOCK, role="scale"),
            Field("pad", "uint8", 2, role="pad"),
        )),)

    def encode_rows(self, x):
        n, q, x = x.shape[0], self.head_dim - self.tail, x.to(torch.bfloat16)
        blocks = x[:, :q].float().reshape(n, q // BLOCK, BLOCK)
        e = self.scale_rule.exponents(blocks)
        out = torch.zeros((n, self.row_bytes), dtype=torch.uint8, device=x.device)
        out[:, self.row_span("values")] = nx.e4m3_quantize_blocks(blocks, e).reshape(n, q)
        out[:, self.row_span("tail")] = x[:, q:].contiguous().view(torch.uint8)
        out[:, self.row_span("scale")] = nx.ue8m0_encode(e)
        return out

    def decode_rows(self, rows):
        n, q = rows.shape[0], self.head_dim - self.tail
        e = rows[:, self.row_span("scale")].to(torch.int32) - nx.UE8M0_BIAS
        values = nx.e4m3_decode_pow2(rows[:, self.row_span("values")].reshape(n, q // BLOCK, BLOCK), e)
        tail = rows[:, self.row_span("tail")].contiguous().view(torch.bfloat16).float()
        return torch.cat([values.reshape(n, q), tail], dim=1)
'''

# Test files whose format-parametrized tests must have run the format (not only skipped it).
COVERED_FILES = ("test_properties.py", "test_invalid_args.py", "test_io.py", "test_inspect.py",
                 "test_hardening_codec.py", "test_spec.py", "test_paged.py", "test_deferred.py")


def _run_suite(tmp_path: Path) -> tuple[subprocess.CompletedProcess, ET.Element]:
    (tmp_path / "scratch_format.py").write_text(FORMAT_MODULE)
    report = tmp_path / "report.xml"
    env = dict(os.environ, KVFORMATS_EXTRA_FORMATS="scratch_format:ScratchRows", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join(filter(None, (str(tmp_path), str(REPO), os.environ.get("PYTHONPATH")))))
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-k", NAME, f"--junitxml={report}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc, ET.parse(report).getroot()


def test_the_suite_covers_a_format_declared_in_one_file(tmp_path):
    proc, root = _run_suite(tmp_path)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    cases = [c for c in root.iter("testcase") if f"[{NAME}" in c.get("name", "") or f"{NAME}-" in c.get("name", "")
             or f"-{NAME}" in c.get("name", "")]
    outcome = {id(c): next((child.tag for child in c if child.tag in ("failure", "error", "skipped")), "passed")
               for c in cases}
    assert not [c.get("name") for c in cases if outcome[id(c)] in ("failure", "error")], tail
    ran = Counter(c.get("classname", "").split(".")[-1] + ".py" for c in cases if outcome[id(c)] == "passed")
    assert sum(ran.values()) >= 80, ran  # 82 when this was written: a drop means generic tests stopped covering it
    assert not [f for f in COVERED_FILES if not ran[f]], ran
    reasons = [next(child for child in c if child.tag == "skipped").get("message", "")
               for c in cases if outcome[id(c)] == "skipped"]
    unnamed = [r for r in reasons if not any(f"capability '{cap}'" in r for cap in CAPABILITIES)]
    assert reasons and not unnamed, unnamed
    assert {cap for cap in CAPABILITIES if any(f"capability '{cap}'" in r for r in reasons)} \
        == {"kernels", "published", "one_block"}
