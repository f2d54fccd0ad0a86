"""The drop-ins ``kvformats.compat.tokenspeed_kernel.dsv4`` and ``.dsv41`` take every call form of
tokenspeed-kernel 0.1.4's cache-side functions, as spec/tokenspeed-signatures.json records them
(``kernel_forms``, read from the released wheel with ``ast`` by tools/tokenspeed_signatures.py):
same names, same parameters, kinds and defaults, every positional and keyword call binding each
argument to the parameter of its name. Runs offline (the table is in the repository); the tests
beside it compare the same names against the wheel itself."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

from tests.compat.tokenspeed_forms import KINDS, check_forms

SIGS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "tokenspeed-signatures.json").read_text())
RELEASE = SIGS["kernel_forms"]["0.1.4"]
# the wheel's module -> the drop-in module that mirrors it (dsv4's package and its .triton module
# share one drop-in, as tokenspeed's runtime imports from both)
DROP_INS = {"dsv4": "dsv4", "dsv4.triton": "dsv4", "dsv41": "dsv41"}
CASES = [(m, n) for m, mod in RELEASE["modules"].items() for n in sorted(mod["functions"])]


def _drop_in(module: str):
    return importlib.import_module(f"kvformats.compat.tokenspeed_kernel.{DROP_INS[module]}")


def test_the_table_is_the_release_and_names_every_cache_side_function():
    assert (RELEASE["package"], RELEASE["version"]) == ("tokenspeed-kernel", "0.1.4")
    assert len(CASES) == 31 and RELEASE["out_of_scope"] == ["triton_dsv4_prefill"]
    for module in RELEASE["modules"]:
        names = set(RELEASE["modules"][module]["functions"])
        assert names <= set(_drop_in(module).__all__), sorted(names - set(_drop_in(module).__all__))


@pytest.mark.parametrize("module,name", CASES)
def test_signature_is_the_released_one(module, name):
    params = RELEASE["modules"][module]["functions"][name]["params"]
    sig = inspect.signature(getattr(_drop_in(module), name))
    want = [(p["name"], KINDS[p["kind"]], p.get("default", inspect.Parameter.empty)) for p in params]
    assert [(p.name, p.kind, p.default) for p in sig.parameters.values()] == want
    check_forms(name, sig, params)
