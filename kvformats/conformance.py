"""The cross-engine conformance table (docs/conformance.md): which profile reproduces which
engine's bytes on which golden vectors. Generated, never hand-edited.

Two kinds of evidence, one column each. "derived from facts": a golden vector of that
(format, profile) exists under ``spec/vectors`` (or ``spec/vectors/interop``), derived from the
published facts (spec/engines.md), and ``run_vector`` reproduces it now ("verified"; otherwise
"not verified"). "captured from engine code": vectors under ``spec/vectors/captured/<engine>/``
hold the output of the engine's own code run by ``tools/capture/from_<engine>.py``; the cell
names the upstream repository and commit, how many reproduce, and the ids that do not (the
departures, explained in tests/test_captured_vectors.py). Where no engine code ran, the cell
says why (``NOT_CAPTURED``).

    text = conformance_page(repo)                      # markdown
    (kvformats.docgen writes and checks docs/conformance.md with ``kvformats docs --write/--check``)
"""

from __future__ import annotations

from pathlib import Path

from kvformats.profiles import profile_table, supported_profiles
from kvformats.vectors import load_vector, run_vector

PAGE = "conformance.md"

# Why a (format, profile) has no captured vector, or what its captured vectors leave out.
NOT_CAPTURED = {
    ("fp8_ds_mla", "vllm"): "pending the GPU run: vLLM's writer quantize_and_insert_k_cache is a Triton kernel, "
                            "loaded alone with stubbed imports by `tools/capture/from_vllm.py` (vllm 0.34.0 pins "
                            "torch 2.14 and ships CUDA extensions, so `import vllm` fails here; its V4 CPU path "
                            "calls compiled C++ ops)",
    ("fp8_ds_mla_v32", "vllm"): "cannot run here: concat_and_cache_ds_mla is a CUDA kernel with no Python path",
    ("fp8_indexer", "vllm"): "cannot run here: indexer_k_quant_and_cache is a CUDA kernel with no Python path",
    ("mxfp4_indexer", "vllm"): "not captured: vLLM writes MXFP4 only in its fused compress Triton kernels (PTX "
                               "cvt.rn.satfinite.e2m1x2, GPU only), which the capture scripts do not drive",
    ("mxfp4_indexer", "ocp"): "no engine code: OCP MX v1.0 is a specification",
}
CAPTURE_NOTES = {
    ("mxfp4_indexer", "tokenspeed"): "readers only: the writer is Triton, pending the GPU run "
                                     "of `tools/capture/from_tokenspeed.py --part gpu`",
    ("fp8_ds_mla", "tokenspeed"): "torch writer and readers; the Triton reader is pending the GPU run",
}


def _vectors(repo: Path) -> list[dict]:
    root = Path(repo) / "spec" / "vectors"
    paths = sorted(root.glob("*.json")) + sorted((root / "interop").glob("*.json"))
    return [dict(load_vector(p), _path=str(p.relative_to(repo))) for p in paths]


def _captured(repo: Path) -> list[dict]:
    return [load_vector(p) for p in sorted((Path(repo) / "spec" / "vectors" / "captured").glob("*/*.json"))]


def _key(vec: dict) -> tuple[str, str]:
    table = profile_table(vec["format"])
    return vec["format"], vec["params"].get("profile", table.default if table else "")


def _reproduces(vec: dict) -> bool:
    return all(c.ok for c in run_vector({k: x for k, x in vec.items() if k != "_path"}))


def _captured_cell(vecs: list[dict], key: tuple[str, str]) -> str:
    if not vecs:
        return NOT_CAPTURED.get(key, "not captured")
    sources = sorted({f"{v['captured']['repo']}@{v['captured']['commit'][:9]}" for v in vecs})
    bad = [v["id"] for v in vecs if not _reproduces(v)]
    ok = len(vecs) - len(bad)
    cell = f"captured, {', '.join(sources)}: {ok} of {len(vecs)} reproduce"
    if bad:
        cell += "; differ: " + ", ".join(f"`{b}`" for b in bad)
    if key in CAPTURE_NOTES:
        cell += f" ({CAPTURE_NOTES[key]})"
    return cell


def conformance_rows(repo: Path) -> list[dict]:
    """One dict per (format, profile): engine, vector ids, and whether each reproduces."""
    by_key: dict[tuple[str, str], list[dict]] = {}
    for vec in _vectors(repo):
        by_key.setdefault(_key(vec), []).append(vec)
    captured: dict[tuple[str, str], list[dict]] = {}
    for vec in _captured(repo):
        captured.setdefault(_key(vec), []).append(vec)
    rows = []
    for fmt, names in supported_profiles().items():
        for name in names:
            prof = profile_table(fmt).get(name)
            vecs = by_key.get((fmt, name), [])
            ok = [v["id"] for v in vecs if _reproduces(v)]
            failed = [v["id"] for v in vecs if v["id"] not in ok]
            status = "verified" if ok and not failed else ("FAILING" if failed else "not verified")
            rows.append({"format": fmt, "profile": name, "engine": prof.engine, "vectors": ok + failed,
                         "status": status, "source": prof.source,
                         "captured": _captured_cell(captured.get((fmt, name), []), (fmt, name))})
    return rows


def conformance_page(repo: Path) -> str:
    """Markdown of the conformance table."""
    lines = ["# Conformance: which profile reproduces which engine's bytes\n",
             "*Generated by `kvformats.conformance` from the golden vectors; do not edit by hand.*\n",
             "Two kinds of evidence. **Derived from facts**: \"verified\" means golden vectors of this "
             "format and profile exist and kvformats reproduces them byte for byte; those vectors are "
             "derived independently from the engines' published layout and numerics facts "
             "(`spec/engines.md`), so they show that kvformats implements those facts. **Captured from "
             "engine code**: vectors under `spec/vectors/captured/<engine>/` hold what the engine's own "
             "code wrote or read when run by `tools/capture/from_<engine>.py` (repository and commit "
             "named; CPU unless the vector's `captured.device` says otherwise), so they show that a given "
             "engine build writes and reads these bytes. A captured vector kvformats does not reproduce is "
             "kept and listed (\"differ\"); `tests/test_captured_vectors.py` gives each one's reason. "
             "Profiles and their rules: `spec/profiles.md`.\n",
             "| format | profile | engine | derived from facts | vectors | captured from engine code (commit) "
             "| rules from |", "|---|---|---|---|---|---|---|"]
    for r in conformance_rows(repo):
        vecs = ", ".join(f"`{v}`" for v in r["vectors"]) or "—"
        lines.append(f"| `{r['format']}` | {r['profile']} | {r['engine']} | {r['status']} | {vecs} | "
                     f"{r['captured']} | {r['source']} |")
    lines.append("\n`compressor_state` is not quantized and has no profiles (its vectors `C` check exact storage).")
    return "\n".join(lines) + "\n"
