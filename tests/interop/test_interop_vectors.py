"""Golden vectors of spec/vectors/interop (V3.2 656 B rows and the non-default profiles):
reproduced through the public API, regenerated identically by their kvformats-free generator,
and meaningful (each profile's bytes differ from the format's default profile)."""

import importlib.util
import sys
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.spec.vectors import load_vector, run_vector

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "spec" / "vectors" / "interop"
PATHS = sorted(DIR.glob("*.json"))


def _generator():
    sys.path.insert(0, str(DIR.parent))
    spec = importlib.util.spec_from_file_location("kvf_interop_generate", DIR / "generate_interop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_vector_reproduced(path):
    bad = [f"{c.name}: {c.actual[:80]} != {c.expected[:80]}" for c in run_vector(load_vector(path)) if not c.ok]
    assert bad == []


def test_committed_vectors_match_the_generator():
    gen = _generator()
    built = gen.build_all()
    assert sorted(built) == sorted(p.name for p in PATHS)
    for name, vec in built.items():
        assert gen.g.render(vec) == (DIR / name).read_text(), f"{name} is stale: run generate_interop.py"


def test_generator_is_independent_of_kvformats():
    source = (DIR / "generate_interop.py").read_text()
    assert "import kvformats" not in source and "from kvformats" not in source


def test_v32_vectors_cover_both_profiles_and_the_published_offsets():
    vecs = {load_vector(p)["id"]: load_vector(p) for p in PATHS}
    assert {"v32_flashmla_ref", "v32_vllm"} <= set(vecs)
    for vid in ("v32_flashmla_ref", "v32_vllm"):
        v = vecs[vid]
        assert v["format"] == "fp8_ds_mla_v32" and len(bytes.fromhex(v["expected"]["rows"][0])) == 656
        offs = {o["region"]: o["offset"] for o in v["expected"]["slot_offsets"]}
        assert offs == {"nope": 45920, "scale": 46432, "rope": 46448}  # 512 B values, 16 B scales, 128 B rope
    a = bytes.fromhex(vecs["v32_flashmla_ref"]["expected"]["rows"][0])
    b = bytes.fromhex(vecs["v32_vllm"]["expected"]["rows"][0])
    assert a[528:] == b[528:] and a[512:528] != b[512:528]


NON_DEFAULT = [p for p in PATHS if load_vector(p)["params"]["profile"] != kvf.get_format(load_vector(p)["format"]).profile]


@pytest.mark.parametrize("path", NON_DEFAULT, ids=[p.stem for p in NON_DEFAULT])
def test_profile_vectors_differ_from_the_default_profile(path):
    """A profile vector whose bytes the default profile also writes would demonstrate nothing."""
    vec = load_vector(path)
    default = kvf.get_format(vec["format"]).profile
    alt = dict(vec, params=dict(vec["params"], profile=default))
    assert any(not c.ok for c in run_vector(alt) if c.name.startswith("gathered row"))
