"""The plumbing of tools/tokenspeed_own_tests.py (which runs tokenspeed's own test file against the
drop-in) on synthetic files: no tokenspeed file is needed."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_tokenspeed_own_tests", ROOT / "tools" / "tokenspeed_own_tests.py")
runner = sys.modules.setdefault("_tokenspeed_own_tests", importlib.util.module_from_spec(_spec))
if not hasattr(runner, "run_test_file"):
    _spec.loader.exec_module(runner)  # (dataclasses look their module up in sys.modules)

TEST_FILE = '''
import os, sys, unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ci_system.ci_register import register_cuda_ci

register_cuda_ci(est_time=1, suite="runtime-1gpu")

import kvformats.compat.tokenspeed as drop_in
from tokenspeed.runtime.layers.attention import deepseek_v4_ops as ops_module
from tokenspeed.runtime.layers.attention.deepseek_v4_ops import fused_qnorm_rope_kv_insert
from tokenspeed.runtime.models.fake_model import helper
from tokenspeed_kernel._triton import tl, triton


class Plumbing(unittest.TestCase):
    def test_alias(self):
        self.assertIs(sys.modules["tokenspeed.runtime.layers.attention.deepseek_v4_ops"], drop_in)
        self.assertIs(ops_module, drop_in)
        self.assertIs(fused_qnorm_rope_kv_insert, drop_in.fused_qnorm_rope_kv_insert)

    def test_lifted_from_a_module_that_cannot_import(self):
        self.assertEqual(helper(3), 7)

    def test_stock_triton(self):
        import triton as stock
        self.assertIs(triton, stock)

    def test_declared_difference(self):
        raise ValueError("declared")

    def test_undeclared_failure(self):
        self.assertEqual(1, 2)

    @unittest.skip("its own skip")
    def test_skipped(self):
        pass
'''

# a synthetic module of the "tokenspeed" tree: its import fails (a missing dependency), and the name
# the test asks for is lifted with what it uses (a constant, another function, an import)
FAKE_MODEL = '''
from __future__ import annotations

import math

from tokenspeed.runtime.not_extracted import heavy  # fails, as the real model module does

OFFSET = 1


def _double(x: SomeUnboundAnnotation) -> int:
    return int(math.floor(2 * x))


def helper(x):
    value = _double(x)
    return value + OFFSET


def unrelated():
    return heavy
'''


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    test = src / "test" / "runtime" / "test_plumbing.py"
    test.parent.mkdir(parents=True)
    test.write_text(textwrap.dedent(TEST_FILE))
    model = src / "python" / "tokenspeed" / "runtime" / "models" / "fake_model.py"
    model.parent.mkdir(parents=True)
    model.write_text(textwrap.dedent(FAKE_MODEL))
    return src, test


def test_runner_aliases_lifts_and_reports(tmp_path, monkeypatch):
    src, test = _tree(tmp_path)
    monkeypatch.setattr(runner, "LIFTABLE", (*runner.LIFTABLE, "tokenspeed.runtime.models.fake_model"))
    differences = {"test_declared_difference": runner.Difference("synthetic", runner.re.compile(r"declared"))}
    modules_before, meta_before, path_before = set(sys.modules), list(sys.meta_path), list(sys.path)

    outcomes, provenance = runner.run_test_file(test, src, differences=differences)

    status = {o.test.rpartition(".")[2]: o for o in outcomes}
    assert {k: o.status for k, o in status.items()} == {
        "test_alias": "passed", "test_lifted_from_a_module_that_cannot_import": "passed",
        "test_stock_triton": "passed", "test_declared_difference": "difference",
        "test_undeclared_failure": "failed", "test_skipped": "skipped"}
    assert status["test_undeclared_failure"].reason.startswith("AssertionError: 1 != 2 (test line ")
    assert provenance["tokenspeed.runtime.layers.attention.deepseek_v4_ops"].startswith("sys.modules alias")
    assert "ci_system.ci_register" in provenance  # the no-op stub: no ci_register.py in this tree
    assert "lifted: OFFSET, _double, helper, math" in provenance["tokenspeed.runtime.models.fake_model"]
    text, code = runner.report(outcomes, provenance, "synthetic")
    assert code == 1 and "1 passed" not in text and "3 passed, 1 difference, 1 skipped, 1 failed, 0 error" in text
    # nothing of the run stays behind: the finder, the alias, the tokenspeed modules, sys.path
    assert sys.meta_path == meta_before and sys.path == path_before
    assert not {m for m in set(sys.modules) - modules_before if m.split(".")[0] in runner.PACKAGE_ROOTS}


def test_runner_exit_status_ignores_only_declared_differences(tmp_path, monkeypatch):
    src, test = _tree(tmp_path)
    monkeypatch.setattr(runner, "LIFTABLE", (*runner.LIFTABLE, "tokenspeed.runtime.models.fake_model"))
    outcomes, provenance = runner.run_test_file(test, src, pattern="alias|stock|skipped", differences={})
    assert [o.status for o in outcomes] == ["passed", "skipped", "passed"]
    assert runner.report(outcomes, provenance, "synthetic")[1] == 0
