"""Machine-readable format specs: one canonical JSON document per layout, derived from the layout
object alone (parameters, segments, regions, scale rule), plus a drift check against the
committed ``spec/formats/<name>.json`` files.

    text = spec_text(kvf.get_format("fp8_ds_mla"))   # canonical JSON, sorted keys, trailing newline
    fingerprint(layout)                               # sha256 hex of its byte definition (no prose)
    write_specs(Path("spec/formats"))                 # regenerate every registered format
    check_specs(Path("spec/formats"))                 # [] when the committed files are current

The CLI (``kvformats spec --write|--check``) calls ``write_specs`` / ``check_specs``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import attrs

from kvformats.codec.registry import get_format, list_formats
from kvformats.errors import OutputError
from kvformats.numerics.elements import E2M1_RNE_RULE, ELEMENTS  # noqa: F401 - E2M1_RNE_RULE re-exported
from kvformats.spec.examples import check_examples, write_examples
from kvformats.version import SPEC_VERSION

ADDRESSING = ("page = slot // page_size; row = slot % page_size; byte of a region's row = "
              "page * page_stride + offset + row * row_stride (page_stride = cache.stride(0), "
              ">= page_bytes allowed); slot < 0 = no row")
EXAMPLE_SLOT = 70

# The element types' rounding rules, scale storage and bounds (kvformats.numerics.elements), by name.
ELEMENT_RULES = {name: e.grid.rounding for name, e in ELEMENTS.items() if e.grid is not None}
SCALE_STORAGE = {name: e.scale_storage for name, e in ELEMENTS.items() if e.scale_storage}
ERROR_BOUNDS = {name: e.grid.error_bound for name, e in ELEMENTS.items() if e.grid is not None}


def _region_dict(region) -> dict:
    d = attrs.asdict(region)
    d["shape"] = list(d["shape"])
    return d


def _quantized_regions(layout):
    """(element data region, scale region) of a block-scaled layout; None where absent."""
    data = next((r for r in layout.data_regions if r.element.quantized), None)
    scales = [r for r in layout.regions if r.role == "scale"]
    named = getattr(data, "scale", "")  # regions that name their scale region say which one
    scale = next((r for r in scales if r.name == named), scales[0] if scales else None)
    return data, scale


def _quant_block(data, scale) -> int:
    declared = getattr(data, "block", 0)
    if declared:
        return declared
    return data.count // scale.count


def _input_rounding(layout) -> str:
    """What encode rounds its input to before the element codec (spec/upstream.md §2.2 step 1),
    as the layout declares it (``quant_input_dtype``)."""
    dtype = str(layout.quant_input_dtype).removeprefix("torch.")
    if dtype == "float32":
        return "none (exact upcast to float32)"
    return f"{dtype} (round-to-nearest-even) before the absmax and the scaling"


def _element_rounding(data, profile) -> str:
    grid = data.element.grid
    if grid.rne_rounding and profile is not None and profile.e2m1_rounding == "rne":
        sign = "sign bit copies the input's (negative zero 0x8 possible)" if profile.e2m1_signed_zero \
            else "sign only on a non-zero code"
        return f"{grid.rne_rounding}; {sign}"
    return grid.rounding


def _exponent_rule(rule: dict) -> str:
    m, f = rule["element_max"], rule["floor"]
    q = f"max(amax, {f}) / {m}" if rule["floor_on"] == "absmax" else f"max(amax / {m}, {f})"
    if rule.get("scale_dtype") == "float8_e4m3fn":  # numerics.ScaleRule subclasses that store e4m3 scales
        up = (", then rounded up: the byte + 1 where its value is below the clamped quotient and the byte is "
              "below 0x7E (s = the least e4m3 value >= max(fl32(amax / {m}), {f}), {s} at most)").format(
                  m=m, f=f, s=rule["scale_max"]) if rule.get("round_up") else ""
        q = f"amax * fl32(1 / {m})" if rule.get("reciprocal") else f"amax / {m}"  # vLLM's product
        return (f"no exponent: scale s = e4m3_rne(clamp(fl32({q}), {f}, {rule['scale_max']})), sign "
                f"bit cleared (a NaN amax gives 0x7F){up}; elements are fl32(x / s) (one correctly rounded "
                f"division)")
    if not rule.get("power_of_two", True):
        return (f"no exponent: scale s = fl32({q}) stored as an arbitrary float32; elements are "
                f"fl32(x / s) (one correctly rounded division), clamped to +-{m}")
    if rule.get("exponent_mode", "ceil") == "floor_minus_emax":
        return (f"e = clamp(floor(log2(max(amax, {f}))) - {rule['element_emax']}, {rule['exponent_min']}, "
                f"{rule['exponent_max']}), exact (OCP MX v1.0); amax = 0 gives {rule['exponent_min']}; "
                f"elements y = x * 2^-e saturate at +-{m}")
    return (f"e = clamp(ceil(fl32(log2(q))), {rule['exponent_min']}, {rule['exponent_max']}) with "
            f"q = fl32({q}); fl32 = float32 rounding (correctly rounded division and log2), so q a "
            f"few ulps above 2^k (k != 0) gives e = k, not k + 1")


def numerics_spec(layout) -> dict:
    """The numerics section: block size, element codec, scale rule and storage, error bound."""
    data, scale = _quantized_regions(layout)
    rule = getattr(layout, "scale_rule", None)
    if rule is None or data is None or scale is None:
        return {"quantized": False, "scale_rule": None,
                "note": f"{layout.name} has no scale rule: values are stored as exact float32 copies",
                "error_bound": "exact: decode returns the stored float32 values bit for bit"}
    rule_dict = rule.as_dict()
    profile = getattr(layout, "numerics", None)
    storage = scale.element.scale_storage
    if not rule.power_of_two and scale.element.ieee:
        storage = f"{scale.dtype} little-endian multiplier (arbitrary, not rounded to a power of two)"
    extra = {}
    if profile is not None:
        extra = {"profile": profile.as_dict(), "profiles": list(layout.PROFILES.names)}
    return {
        **extra,
        "quantized": True,
        "quant_block": _quant_block(data, scale),
        "element_type": data.dtype,
        "element_rounding": _element_rounding(data, profile),
        "input_rounding": _input_rounding(layout),
        "scale_rule": rule_dict,
        "scale_exponent": _exponent_rule(rule_dict),
        "scale_storage": storage,
        "scale_dtype": scale.dtype,
        "error_bound": (profile.error_bound if profile is not None and profile.error_bound
                        else data.element.grid.error_bound),
    }


def format_spec(layout) -> dict:
    """A JSON-ready description of ``layout``, derived from the layout object only."""
    offsets = layout.segment_offsets
    return {
        "name": layout.name,
        "spec_version": SPEC_VERSION,
        "params": dict(layout.params),
        "row_bytes": layout.row_bytes,
        "page_bytes": layout.page_bytes,
        "min_page_bytes": layout.min_page_bytes,
        "page_alignment": layout.page_alignment,
        "container_dtype": str(layout.container_dtype).removeprefix("torch."),
        "addressing": ADDRESSING,
        "segments": [{"name": s.name, "offset": offsets[s.name], "record_bytes": s.record_bytes,
                      "fields": [f.name for f in s.fields]} for s in layout.segments],
        "regions": [_region_dict(r) for r in layout.regions],
        "example_offsets": {"slot": EXAMPLE_SLOT, "page_stride": layout.page_bytes,
                            "offsets": layout.slot_offsets(EXAMPLE_SLOT)},
        "numerics": numerics_spec(layout),
    }


def spec_text(layout) -> str:
    """Canonical JSON text of ``format_spec(layout)``: 2-space indent, sorted keys, final newline."""
    return json.dumps(format_spec(layout), indent=2, sort_keys=True) + "\n"


# Prose of the spec: what explains the bytes, not what defines them (citations, docs, a version
# label, rules spelled out in words from data kept below). A cache file's fingerprint leaves it
# out, so a changed citation does not make files of the same bytes unloadable.
_PROSE = ("addressing", "spec_version", "example_offsets")
_REGION_PROSE = ("doc",)
_NUMERICS_PROSE = ("note", "error_bound", "element_rounding", "input_rounding", "scale_exponent", "scale_storage",
                   "profiles")
_PROFILE_PROSE = ("engine", "source", "error_bound")


def byte_definition(spec: dict) -> dict:
    """``format_spec``'s dict without its prose: the parameters, geometry, segments, regions and
    numerics (element and scale types, scale rule, profile rules) that define a cache's bytes.
    ``input_rounding`` becomes ``quant_input_dtype``, the dtype its words are made from."""
    out = {k: v for k, v in spec.items() if k not in _PROSE}
    out["regions"] = [{k: v for k, v in r.items() if k not in _REGION_PROSE} for r in spec["regions"]]
    numerics = spec["numerics"]
    out["numerics"] = {k: v for k, v in numerics.items() if k not in _NUMERICS_PROSE}
    if "input_rounding" in numerics:  # "bfloat16 (round-to-nearest-even) ..." or "none (exact upcast to float32)"
        words = numerics["input_rounding"]
        out["numerics"]["quant_input_dtype"] = "float32" if words.startswith("none") else words.split()[0]
    if "profile" in numerics:
        out["numerics"]["profile"] = {k: v for k, v in numerics["profile"].items() if k not in _PROFILE_PROSE}
    return out


def fingerprint(layout) -> str:
    """sha256 hex digest of ``layout``'s byte definition (``byte_definition``): equal iff the
    described bytes are equal; prose of the spec does not change it."""
    return _digest(byte_definition(format_spec(layout)))


def spec_digest(layout) -> str:
    """sha256 hex digest of ``spec_text(layout)``, prose included: what files written before
    fingerprints left the prose out carry (still accepted, ``accepted_fingerprints``)."""
    return _digest(format_spec(layout))


# The spec-text digests of former committed spec/formats/<name>.json files (default parameters)
# whose byte definition is today's: files of kvformats 0.1.0 written while those texts were
# current carry them (the citation changes of 36abca0 and cb170ec orphaned them). Each was read
# from the repository's history and its byte definition compared with today's; a profile
# without ``ue8m0_ff`` read a 0xFF scale byte as float8_e8m0fnu's NaN, today's "nan" (the
# tokenspeed profiles of fp8_ds_mla and mxfp4_indexer read it as +Inf since 745a523: their
# files from before are not the same definition and stay refused).
FORMER_SPEC_DIGESTS: dict[str, frozenset[str]] = {
    # the V4.1 pair with the retired profile "kvformats" (numerics.profiles.SUCCESSORS): same regions,
    # fp8 the same bytes as tokenspeed, fp4 scales floored at 2^-6 (read exactly by any profile)
    "fp8_ds_mla_v41": frozenset({"8cab575040340a2aa3665dca52201c9006d36b3b06e75956b9798f5a80cfe6dc"}),  # 6425adc
    "fp4_ds_mla_v41": frozenset({"9dee770ba5f67c1582b43417a60388385666ff6875fdf8e0e2769380a2b76bd2"}),  # 6425adc
    "fp8_indexer": frozenset({
        "e46a57e88493f6c13806d5c0027cb3785d34452b5a834ce16d86d40c3e239eac",  # aa57739
        "6d9268ae6a3308d173dfe42a35b6df7496ff9886c2e269650b70c74dfd6bade5",  # 36abca0
        "9be31a4186072ff31155750da959a70a0d10fa6fb33b82e6f6b26eef272a8030",  # cb170ec
    }),
    "fp8_ds_mla_v32": frozenset({
        "c2e6ab7d10b1a12763897030bd8ad7b14555cda34ff919064de0f1689a66dac4",  # aa57739
        "9b6b36de0cfd8b29be3139d319a0cde0efba475e0913d255b0c9a49e0de48209",  # 36abca0
        "3340fe370bc13438fc04b76c03dd802a00f5ce740f53c2ddcc80e600aed80da4",  # cb170ec
    }),
}


def accepted_fingerprints(layout) -> set[str]:
    """The fingerprints a cache file of ``layout`` may carry: today's; the spec-text digest
    earlier versions wrote (today's text, and the former texts of ``FORMER_SPEC_DIGESTS`` for a
    layout of default parameters); and each of those for the same bytes described under the
    region names the format had before (``former_region_names``, new name -> old), so that
    renaming a region or rewording the prose does not orphan files written before."""
    specs = [format_spec(layout)]
    for new, old in getattr(layout, "former_region_names", {}).items():
        specs.append(_rename_region(format_spec(layout), new, old))
    accepted = {_digest(spec) for spec in specs} | {_digest(byte_definition(spec)) for spec in specs}
    if layout == get_format(layout.name):
        accepted |= FORMER_SPEC_DIGESTS.get(layout.name, frozenset())
    return accepted


def _digest(spec: dict) -> str:
    return hashlib.sha256((json.dumps(spec, indent=2, sort_keys=True) + "\n").encode("utf-8")).hexdigest()


def _rename_region(spec: dict, new: str, old: str) -> dict:
    """``spec`` with region ``new`` called ``old`` wherever the spec names a region."""
    for region in spec["regions"]:
        region["name"] = old if region["name"] == new else region["name"]
        region["scale"] = old if region["scale"] == new else region["scale"]
    for segment in spec["segments"]:
        segment["fields"] = [old if f == new else f for f in segment["fields"]]
    offsets = spec["example_offsets"]["offsets"]
    spec["example_offsets"]["offsets"] = {old if k == new else k: v for k, v in offsets.items()}
    return spec


def _expected_texts() -> dict[str, str]:
    return {name: spec_text(get_format(name)) for name in list_formats()}


def write_specs(root: Path = Path("spec/formats")) -> list[Path]:
    """Write ``<root>/<name>.json`` for the default layout of every registered format, and
    refresh the generated worked example in each ``<root>/<name>.md`` (kvformats.spec.examples).

    Returns the paths written. Files of formats no longer registered are left alone
    (``check_specs`` reports them). OutputError (naming the path) if the directory cannot be
    made or a file cannot be written."""
    root = Path(root)
    texts = _expected_texts()
    written = []
    if root.exists() and not root.is_dir():
        raise OutputError(f"cannot write the spec files: {root} is not a directory")
    path = root
    try:
        root.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            path = root / f"{name}.json"
            path.write_text(text, encoding="utf-8")
            written.append(path)
        written += write_examples(root)
    except OSError as err:
        raise OutputError(f"cannot write {getattr(err, 'filename', None) or path}: {err.strerror or err}") from None
    return written


def check_specs(root: Path = Path("spec/formats")) -> list[str]:
    """Human-readable drift problems between ``root`` and the registered formats; [] if none."""
    root = Path(root)
    problems = []
    expected = _expected_texts()
    for name, text in expected.items():
        path = root / f"{name}.json"
        if not path.is_file():
            problems.append(f"missing {path}: run `kvformats spec --write`")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"stale {path}: it differs from the {name} layout "
                            f"(fingerprint {fingerprint(get_format(name))[:12]}); run `kvformats spec --write`")
    if root.is_dir():
        for path in sorted(root.glob("*.json")):
            if path.stem not in expected:
                problems.append(f"extra {path}: no registered format is named {path.stem!r}")
    return problems + check_examples(root)
