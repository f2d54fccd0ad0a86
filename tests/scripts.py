"""Load a script of tools/ as a module, for the tests that test that script: from
its file, without putting its folder on sys.path. Scripts are not a library; what tests and
tools share lives in tests/harness/ (imported as tests.harness). (benchmarks/ is a package: its tests import it.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str):
    """The module of ``ROOT / relpath``, loaded once per process under its file's stem (so a
    script that imports another by name, e.g. compile_check's ``import sanitize_driver``, gets
    the same module)."""
    path = ROOT / relpath
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
    return module
