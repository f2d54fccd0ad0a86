"""``kvformats spec`` and ``kvformats docs`` outside a kvformats checkout: one line, exit 2,
nothing written (issue 35, item 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvformats.cli import main
from kvformats.spec.checkout import is_checkout

ROOT = Path(__file__).resolve().parents[1]
SPEC_MSG = "kvformats: error: not a kvformats checkout; run from the repository root or pass --dir\n"
DOCS_MSG = "kvformats: error: not a kvformats checkout; run from the repository root or pass --root\n"


def run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("argv,msg", [(["spec", "--check"], SPEC_MSG), (["spec", "--write"], SPEC_MSG),
                                      (["docs", "--check"], DOCS_MSG), (["docs", "--write"], DOCS_MSG)])
def test_outside_a_checkout_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch, argv, msg):
    monkeypatch.chdir(tmp_path)
    assert run(capsys, *argv) == (2, "", msg)
    assert list(tmp_path.iterdir()) == []


def test_another_projects_tree_is_not_a_checkout(capsys, tmp_path, monkeypatch):
    (tmp_path / "spec").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "kvformats-plugin"\n')
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "spec", "--check") == (2, "", SPEC_MSG)
    code, out, err = run(capsys, "docs", "--write", "--root", str(tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1 and "not a kvformats checkout" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pyproject.toml", "spec"]
    assert list((tmp_path / "spec").iterdir()) == []


def test_the_repository_is_a_checkout(capsys, monkeypatch, published_only):
    assert is_checkout(ROOT)
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys, "spec", "--check")
    assert code == 0 and err == "" and out.endswith("every spec is up to date\n")


def test_an_explicit_spec_dir_still_works_anywhere(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "spec", "--write", "--dir", "out")[0] == 0
    assert run(capsys, "spec", "--check", "--dir", "out")[0] == 0
    code, out, err = run(capsys, "spec", "--check", "--dir", "nowhere")
    assert (code, out, err) == (2, "", "kvformats: error: --dir nowhere: no such directory\n")
