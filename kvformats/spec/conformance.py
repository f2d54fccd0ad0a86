"""The cross-engine conformance matrix (docs/conformance.md): one row per (format, profile), one
column per engine whose code writes or reads the format, each cell saying whether that engine's
captured bytes are this profile's. Generated, never hand-edited.

Evidence. "Golden" vectors under ``spec/vectors`` (and ``spec/vectors/interop``) are derived from
the published facts (spec/engines.md): "verified" when ``run_vector`` reproduces them. Captured
vectors under ``spec/vectors/captured/<engine>/`` hold what an engine's own code wrote or read
(``tools/capture/from_<engine>.py`` from a source checkout, ``from_<engine>_release.py`` from a
released wheel). Every captured vector of an engine and a format is run under every profile of
that format, so a cell says

* "byte-equal on N vectors": all of them reproduce under this profile (e4m3 data bytes with
  the NaN codes 0x7F and 0xFF taken as equal, spec/nan-policy.md §1.3: ``run_vector(...,
  nan_codes_equal=True)``);
* "departs on k of N (declared: ...)": vectors captured for this profile that kvformats does not
  reproduce, each declared in ``DEPARTURES`` with the reason (tests/test_captured_vectors.py holds
  them to it, strictly);
* "departs on k of N (its vectors follow profile ...)": the engine's vectors were captured for
  another profile of the format and this profile's rule gives other bytes on them;
* "not captured (why)": no code of the engine ran for the format (``NOT_CAPTURED``).

    text = conformance_page(repo)                      # markdown
    (kvformats.spec.docgen writes and checks docs/conformance.md with ``kvformats docs --write/--check``)
"""

from __future__ import annotations

from pathlib import Path

from kvformats.numerics.profiles import profile_table, profile_tables
from kvformats.spec.vectors import load_vector, run_vector

PAGE = "conformance.md"

# the matrix's engine columns: folder under spec/vectors/captured -> column title
ENGINES = {"tokenspeed": "tokenspeed", "vllm": "vLLM", "sglang": "SGLang",
           "flashmla": "FlashMLA (upstream, forks)", "deepgemm": "DeepGEMM"}

# Captured vectors kvformats does not reproduce under their own profile, and why.
DEPARTURES = {
    "tokenspeed_fp8_indexer_loop_fp32": (
        "tokenspeed's per-token write_deepseek_v4_indexer_fp8_cache takes the scale in Python double "
        "(math.log2): at amax one float32 ulp above 448*2^k it picks 2^(k+1); its batch writer "
        "_write_deepseek_v4_indexer_fp8_cache_capturable (float32 torch.log2 rounds to k) and kvformats "
        "pick 2^k"),
    "deepgemm_mxfp4_indexer_fp32": (
        "DeepGEMM's ceil_to_ue8m0(amax / 6) rounds up on any mantissa bit of the float32 quotient: at "
        "amax one float32 ulp above 6*2^k it picks 2^(k+1); kvformats' deepgemm-ref takes "
        "2^ceil(log2(amax / 6)) in float32, where log2 rounds to k (bf16 inputs cannot reach the case)"),
    "deepgemm_mxfp4_decode_zero_scale": (
        "DeepGEMM's unpack_ue8m0_from_int shifts the byte into a float32 exponent field, so ue8m0 byte 0 "
        "reads as 0.0; kvformats reads 2^-127"),
    "deepgemm_mxfp4_decode_ff_scale": (
        "DeepGEMM's unpack_ue8m0_from_int reads ue8m0 byte 0xFF as +Inf (0x7F800000); kvformats reads NaN"),
    "tokenspeed_fp8_ds_mla_read_triton_bytes": (
        "tokenspeed's Triton deepseek_v4_dequantize_and_gather_k_cache computes the scale with tl.exp2, "
        "which the GPU evaluates with a flush to zero: scale byte 0x00 (2^-127, a float32 subnormal) reads "
        "as 0, so those blocks decode to zeros; kvformats' tokenspeed profile reads 2^-127 exactly, as "
        "tokenspeed's torch reader does (spec/nan-policy.md §5). Every differing block of the capture has "
        "scale byte 0x00"),
    "deepgemm_mxfp4_decode_negative_zero": (
        "DeepGEMM's _dequantize_from_fp4_e2m1 decodes nibble 0x8 (e2m1 -0) as +0.0; kvformats as -0.0"),
}

_V41 = ("fp8_ds_mla_v41", "fp4_ds_mla_v41", "fp8_ds_mla_v41_interleaved", "fp4_ds_mla_v41_interleaved")
_FLASHMLA_V41 = ("not captured: FlashMLA's V4.1 quantizer (tests/quant.py quantize_k_cache of the fork "
                 "vllm-project/FlashMLA @02137a4, tools/capture/from_flashmla_v41.py) writes only page-planar "
                 "blocks (V41_FP8Sparse, V41_FP4: the fp8_ds_mla_v41 and fp4_ds_mla_v41 rows)")
# (format, engine) -> why no code of the engine ran for the format
NOT_CAPTURED = {
    ("fp8_ds_mla_v32", "vllm"): "not captured: concat_and_cache_ds_mla is a CUDA kernel with no Python path",
    ("fp8_indexer", "vllm"): "not captured: indexer_k_quant_and_cache is a CUDA kernel with no Python path",
    ("mxfp4_indexer", "vllm"): ("not captured: vLLM writes MXFP4 only in its fused compress Triton kernels, which the "
                                "capture scripts do not drive (tests/harness/released.py could: it emulates their "
                                "PTX cvt.rn.satfinite.e2m1x2.f32)"),
    **{(fmt, "vllm"): "not captured: vLLM 0.33.0 stores V4.1 records token-interleaved (spec/engines.md §7.2)"
       for fmt in ("fp8_ds_mla_v41", "fp4_ds_mla_v41")},
    ("fp8_ds_mla_v41_interleaved", "tokenspeed"): ("not captured: tokenspeed-kernel 0.1.4 stores V4.1 records "
                                                   "page-planar (spec/engines.md §7.1)"),
    ("fp4_ds_mla_v41_interleaved", "tokenspeed"): ("not captured: tokenspeed-kernel 0.1.4 stores V4.1 records "
                                                   "page-planar (spec/engines.md §7.1)"),
    ("fp8_ds_mla_v41_interleaved", "sglang"): (
        "not captured: SGLang's V41_NEW (interleaved) pages are written only by its CUDA kernels; its torch "
        "reference writes them by interleaving V41 pages (interleave_pages), the bytes of the fp8_ds_mla_v41 row"),
    ("fp4_ds_mla_v41_interleaved", "sglang"): (
        "not captured: SGLang's V41_FP4_NEW (interleaved) pages are written only by its CUDA kernels; its torch "
        "reference interleaves V41_FP4 pages, the bytes of the fp4_ds_mla_v41 row"),
    **{(fmt, "flashmla"): _FLASHMLA_V41 for fmt in _V41 if fmt.endswith("_interleaved")},
    **{(fmt, "deepgemm"): "not captured: DeepGEMM writes no V4.1 cache" for fmt in _V41},
}
ENGINE_DEFAULT = {
    "tokenspeed": "not captured: no tokenspeed code for this format was run",
    "vllm": "not captured: no vLLM code for this format was run",
    "sglang": "not captured: no SGLang code for this format was run (its V4.1 writers: spec/engines.md §7.3)",
    "flashmla": "not captured: no FlashMLA code for this format was run",
    "deepgemm": "not captured: no DeepGEMM code for this format was run",
}


def _vectors(repo: Path) -> list[dict]:
    root = Path(repo) / "spec" / "vectors"
    paths = sorted(root.glob("*.json")) + sorted((root / "interop").glob("*.json"))
    return [dict(load_vector(p), _path=str(p.relative_to(repo))) for p in paths]


def captured_vectors(repo: Path) -> list[dict]:
    """Every captured vector, with ``_engine`` (its folder) added."""
    root = Path(repo) / "spec" / "vectors" / "captured"
    return [dict(load_vector(p), _engine=p.parent.name) for p in sorted(root.glob("*/*.json"))]


def _profile(vec: dict) -> str:
    table = profile_table(vec["format"])
    return vec["params"].get("profile", table.default if table else "")


def _reproduces(vec: dict, profile: str | None = None, *, nan_codes_equal: bool = False) -> bool:
    vec = {k: x for k, x in vec.items() if not k.startswith("_")}
    if profile is not None:
        vec["params"] = dict(vec["params"], profile=profile)
    return all(c.ok for c in run_vector(vec, nan_codes_equal=nan_codes_equal))


def source_of(vec: dict) -> str:
    """Where a captured vector's code came from: ``package version`` or ``repo@commit``."""
    cap = vec["captured"]
    if "package" in cap:
        return f"{cap['package']} {cap['version']}"
    return f"{cap['repo']}@{cap['commit'][:9]}"


def matrix_cell(vecs: list[dict], fmt: str, profile: str, engine: str) -> dict:
    """One cell: ``status`` ("equal", "departs", "not captured", "FAILING"), ``text`` and the ids."""
    if not vecs:
        why = NOT_CAPTURED.get((fmt, engine), ENGINE_DEFAULT.get(engine, "not captured"))
        return {"status": "not captured", "text": why, "why": why.removeprefix("not captured: "), "equal": [],
                "departs": []}
    # an engine may write either e4m3 NaN code, 0x7F or 0xFF (spec/nan-policy.md §1.3)
    equal = [v["id"] for v in vecs if _reproduces(v, profile, nan_codes_equal=True)]
    departs = [v for v in vecs if v["id"] not in equal]
    declared = [v["id"] for v in departs if _profile(v) == profile and v["id"] in DEPARTURES]
    failing = [v["id"] for v in departs if _profile(v) == profile and v["id"] not in DEPARTURES]
    other = [v for v in departs if _profile(v) != profile]
    n = len(vecs)
    noun = "vector" if n == 1 else "vectors"
    parts = [f"byte-equal on {len(equal)} of {n} {noun}" if departs else f"byte-equal on {n} {noun}"] if equal else []
    if declared:
        parts.append(f"departs on {len(declared)} of {n} (declared: " + ", ".join(f"`{i}`" for i in declared) + ")")
    if other:
        follow = sorted({_profile(v) for v in other})
        parts.append(f"departs on {len(other)} of {n} (captured for profile {', '.join(follow)})")
    if failing:
        parts.append(f"FAILING on {', '.join(f'`{i}`' for i in failing)} (undeclared)")
    status = "FAILING" if failing else ("departs" if departs else "equal")
    return {"status": status, "text": "; ".join(parts), "equal": equal, "departs": [v["id"] for v in departs]}


def conformance_rows(repo: Path) -> list[dict]:
    """One dict per (format, profile): engine, golden vector ids and status, and ``cells``
    (engine folder -> ``matrix_cell``)."""
    golden: dict[tuple[str, str], list[dict]] = {}
    for vec in _vectors(repo):
        golden.setdefault((vec["format"], _profile(vec)), []).append(vec)
    captured: dict[tuple[str, str], list[dict]] = {}
    for vec in captured_vectors(repo):
        captured.setdefault((vec["_engine"], vec["format"]), []).append(vec)
    rows = []
    for fmt, table in profile_tables().items():
        for name in table.names:
            prof = table.get(name)
            vecs = golden.get((fmt, name), [])
            ok = [v["id"] for v in vecs if _reproduces(v)]
            failed = [v["id"] for v in vecs if v["id"] not in ok]
            status = "verified" if ok and not failed else ("FAILING" if failed else "not verified")
            cells = {e: matrix_cell(captured.get((e, fmt), []), fmt, name, e) for e in ENGINES}
            rows.append({"format": fmt, "profile": name, "engine": prof.engine, "vectors": ok + failed,
                         "status": status, "source": prof.source, "cells": cells})
    return rows


def conformance_page(repo: Path) -> str:
    """Markdown of the conformance matrix, the captured code, the declared departures and the
    profiles' sources."""
    rows = conformance_rows(repo)
    lines = ["# Conformance: which profile reproduces which engine's bytes\n",
             "*Generated by `kvformats.spec.conformance` from the golden and captured vectors; do not edit by "
             "hand (`python -m kvformats docs --write`).*\n",
             "One row per format and numerics profile, one column per engine. **Golden**: vectors derived "
             "independently from the engines' published layout and numerics facts (`spec/engines.md`); "
             "\"verified\" means kvformats reproduces them byte for byte. **Engine columns**: vectors under "
             "`spec/vectors/captured/<engine>/` hold what the engine's own code wrote or read (see \"Captured "
             "code\" below); each is run under every profile of its format. \"byte-equal on N vectors\": "
             "kvformats under this profile reproduces all of them, whole caches included (the e4m3 NaN codes "
             "0x7F and 0xFF count as equal in e4m3 value bytes, `spec/nan-policy.md` §1.3); \"departs "
             "(declared)\": captured for this profile, not reproduced, the reason under \"Declared "
             "departures\"; \"departs (its vectors follow profile ...)\": captured for another profile whose rule "
             "this one does not share; \"not captured (n)\": no code of that engine ran for the format, reason n under "
             "\"Why not captured\". "
             "Profiles and their rules: `spec/profiles.md`; the V4.1 writers: `spec/engines.md` \"V4.1 "
             "writers\".\n",
             "| format | profile | golden | " + " | ".join(ENGINES.values()) + " |",
             "|---|---|---|" + "---|" * len(ENGINES)]
    notes: list[str] = []  # the reasons of "not captured" cells, numbered once each

    def cell(c: dict) -> str:
        if c["status"] != "not captured":
            return c["text"]
        if c["why"] not in notes:
            notes.append(c["why"])
        return f"not captured ({notes.index(c['why']) + 1})"

    for r in rows:
        golden = r["status"] + (" (" + ", ".join(f"`{v}`" for v in r["vectors"]) + ")" if r["vectors"] else "")
        cells = " | ".join(cell(r["cells"][e]) for e in ENGINES)
        lines.append(f"| `{r['format']}` | {r['profile']} | {golden} | {cells} |")
    lines += ["\n## Why not captured\n"] + [f"{i}. {why}." for i, why in enumerate(notes, 1)]
    lines += ["\n## Captured code\n",
              "| engine | vector | format, profile | code that ran | device |", "|---|---|---|---|---|"]
    for vec in captured_vectors(repo):
        cap = vec["captured"]
        lines.append(f"| {ENGINES.get(vec['_engine'], vec['_engine'])} | `{vec['id']}` | `{vec['format']}`, "
                     f"{_profile(vec)} | {source_of(vec)} `{cap['file']}` {cap['function']} | {cap['device']} |")
    lines += ["\n## Declared departures\n"]
    for vid, why in DEPARTURES.items():
        lines.append(f"- `{vid}`: {why}.")
    lines += ["\n## Profiles\n", "| format | profile | engine the profile follows | rules from |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['format']}` | {r['profile']} | {r['engine']} | {r['source']} |")
    lines.append("\n`compressor_state` is not quantized and has no profiles (its vectors `C` check exact storage).")
    return "\n".join(lines) + "\n"
