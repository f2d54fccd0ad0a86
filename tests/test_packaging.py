"""Install instructions and packaging metadata (issue 35 items 15, 17, 19): what the README's
install command brings, the extras, the license and the pytest options."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_readme_says_what_the_install_command_brings():
    """PyPI's torch on Linux is the CUDA build: the README must not promise the CPU build, and
    must say how to get it."""
    for page in (ROOT / "README.md", ROOT / "docs" / "tutorial.md"):
        text = page.read_text()
        assert "CPU build of torch" not in text, page
        assert CPU_INDEX in text and "CUDA" in text, page


def _run(code: str, *flags: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_strategies_have_a_small_extra():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["strategies"]] == ["hypothesis"]
    assert any("strategies" in r for r in extras["test"] if r.startswith("kvformats["))


def test_one_triton_floor():
    """[test] installs Triton through [triton], so the two cannot disagree; 3.6 is the release the
    kernels' workarounds are written for."""
    extras = _pyproject()["project"]["optional-dependencies"]
    tritons = [(name, r) for name, reqs in extras.items() for r in reqs if r.startswith("triton")]
    assert tritons == [("triton", "triton>=3.6; sys_platform == 'linux'")]
    assert any("triton" in r for r in extras["test"] if r.startswith("kvformats["))


def test_license_file_and_spdx_expression():
    project = _pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "setuptools>=77" in _pyproject()["build-system"]["requires"][0]  # SPDX strings need 77
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "the kvformats authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\"" in text


# The warnings the suite silences, each by message, category and the module that warns: the
# interpreter's float arithmetic in numpy (and numpy's reductions under it), and torch's own use of
# a function torch deprecates.
SILENCED = {("RuntimeWarning", "triton.runtime.interpreter"), ("RuntimeWarning", "numpy._core.fromnumeric"),
            ("DeprecationWarning", "torch.jit._script")}


def test_pytest_output_options():
    """Failures and errors summarized, skips not listed per test; only the warnings of SILENCED
    silenced, each by message, category and module, nothing else."""
    options = _pyproject()["tool"]["pytest"]["ini_options"]
    assert "-ra" not in options["addopts"].split() and "-rfE" in options["addopts"].split()
    for entry in options["filterwarnings"]:
        action, message, category, module = entry.split(":")
        assert action == "ignore" and message and (category, module) in SILENCED


def test_skip_summary_is_one_short_line_per_reason(request):
    conftest = next(p for p in request.config.pluginmanager.get_plugins()
                    if getattr(p, "__file__", "") == str(ROOT / "tests" / "conftest.py"))

    class Report:
        def __init__(self, reason):
            self.longrepr = ("f.py", 1, f"Skipped: {reason}")

    class Reporter:
        stats = {"skipped": [Report("needs a CUDA device")] * 3 + [Report("x" * 300)]}
        lines: list[str] = []

        def write_sep(self, sep, title):
            self.lines.append(title)

        def write_line(self, line):
            self.lines.append(line)

    reporter = Reporter()
    conftest.pytest_terminal_summary(reporter)
    assert reporter.lines[0] == "4 skipped, by reason"
    assert reporter.lines[1].split() == ["3", "needs", "a", "CUDA", "device"]
    assert len(reporter.lines) == 3 and all(len(line) <= 100 for line in reporter.lines)


def test_a_base_install_imports_without_torchs_numpy_warning():
    """Without numpy (a base install: torch, attrs), torch warns "Failed to initialize NumPy" as it
    is imported; import kvformats keeps that out of every command."""
    done = _run("import sys; sys.modules['numpy'] = None; import kvformats; print(kvformats.__name__)",
                "-W", "error::UserWarning")
    assert done.returncode == 0 and "Failed to initialize NumPy" not in done.stderr, done.stderr[-500:]


def test_dir_lists_the_api_not_import_names():
    import kvformats

    names = dir(kvformats)
    assert set(kvformats.__all__) <= set(names)
    assert not {"kvformats", "torch", "warnings"} & set(names)
    assert "codec" in names  # subpackages stay reachable by completion


def test_old_fsck_path_warns_and_is_the_check_module():
    done = _run("import kvformats.fsck", "-W", "error::DeprecationWarning")
    assert done.returncode != 0 and "kvformats.fsck moved to kvformats.caches.check" in done.stderr
    done = _run("import warnings; warnings.simplefilter('ignore'); import kvformats.fsck as old, "
                "kvformats.caches.check as new; print(old is new)")
    assert done.stdout.strip() == "True", done.stderr[-500:]
