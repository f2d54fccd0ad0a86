"""Numerics profiles: the same nominal format as another engine writes it (spec/engines.md §5).

A profile is declared data, not a code path: a ``Profile`` names the ``ScaleRule`` to use, the
e2m1 rounding, the sign of zero, and whose bytes it reproduces. Each quantized format declares
the profiles it supports in a ``ProfileTable``; a layout takes ``profile="..."`` like any other
parameter (``Fp8DsMla(profile="flashmla-ref")``), the reference codec reads
``layout.numerics`` and nothing else, and the spec JSON carries the profile's rules.

Profiles by name (which formats support each: ``supported_profiles()``; prose: spec/profiles.md):

* ``tokenspeed``  default of the V4 formats: today's bytes, unchanged.
* ``vllm``        vLLM's writers: V4 584 B rows and the FP8 indexer as tokenspeed; the MXFP4
                  indexer rounds e2m1 half-to-even (PTX ``cvt.rn.satfinite``) with an amax floor
                  of 6·2^-126; the V3.2 656 B row stores arbitrary fp32 scales max(amax/448, FLT_MIN).
* ``deepgemm-ref`` DeepGEMM's torch references: FP8 indexer scale amax/448 (amax >= 1e-4, not a
                  power of two); FP4 ``ceil_ue8m0(amax/6)``, ties toward smaller magnitude.
* ``flashmla-ref`` FlashMLA's ``tests/quant.py``: 2^ceil(log2(max(amax/448, 1e-4))) (floor on the
                  scale), for the 584 B MODEL1 row and the 656 B V3.2 row (default of the latter).
* ``ocp``         OCP MX v1.0 for the MXFP4 indexer: e = floor(log2 amax) - 2, elements RNE and
                  saturating, sign of zero kept.
* ``flashmla``    FlashMLA's ``tests/quant.py`` V4.1 writer (upstream deepseek-ai/FlashMLA and
                  vllm-project/FlashMLA): fp8 2^ceil(log2(max(amax/448, 1e-4))); fp4 e4m3(clamp(amax/6,
                  2^-9, 448)); a NaN or Inf in a block makes its scale non-finite and the block's
                  elements are x / scale (``poison_nonfinite``). Default of the interleaved V4.1
                  records and of nvfp4_ds_mla (the vllm-project/FlashMLA fork's 352 B reference).

The V4.1 page-planar pair's default, ``tokenspeed``, is tokenspeed-kernel 0.1.4's released writer.

The Triton encode kernels honour every profile of fp8_ds_mla (584 B and V3.2 656 B rows),
fp8_indexer, mxfp4_indexer and the four V4.1 formats (the kernel package declares them with
``registry.register_kernel_profiles``); a profile no kernel declares runs on the reference
(``backend="auto"``) or raises BackendUnavailableError (``backend="triton"``). Reads (decode,
the paged ops) multiply each element by the stored scale, whatever rule chose it; they depend on
the profile only through ``ue8m0_ff``, how a ue8m0 byte 0xFF reads (tokenspeed: +Inf, as its
readers compute 2^(s - 127) in float32; ocp and the others: NaN), which every backend honours.
"""

from __future__ import annotations

import attrs

from kvformats.errors import LayoutError
from kvformats.numerics.codes import E2M1_ROUNDINGS, UE8M0_FF_READINGS, ScaleRule

PROFILE_NAMES = ("tokenspeed", "vllm", "deepgemm-ref", "flashmla-ref", "flashmla", "ocp")
# Profiles that existed once and were replaced: name -> what to say (a LayoutError names it).
# Cache files written with a retired profile load with its successor's (reads multiply by the
# stored scales, so they give the values the file was written with): format -> {old: new}.
SUCCESSORS = {"fp8_ds_mla_v41": {"kvformats": "tokenspeed"}, "fp4_ds_mla_v41": {"kvformats": "tokenspeed"}}
RETIRED_PROFILES = {"kvformats": "the V4.1 rule kvformats chose before any writer was published; the "
                                 "V4.1 formats follow the published writers: profile 'tokenspeed' (same bytes for "
                                 "fp8_ds_mla_v41; fp4_ds_mla_v41 now floors its scale at 2^-9, not 2^-6) or "
                                 "'flashmla' (CHANGELOG.md)"}
FLT_MIN = 2.0**-126  # float32's smallest normal, vLLM's scale floor for the V3.2 row


@attrs.frozen(kw_only=True)
class Profile:
    """One engine's numerics for one format.

    ``scale_rule``: how block scales are chosen (and whether they are powers of two).
    ``e2m1_rounding``: "threshold" (ties toward the smaller magnitude) or "rne"; e2m1 formats only.
    ``e2m1_signed_zero``: whether a negative value that rounds to zero keeps its sign (nibble 0x8);
    e4m3 always keeps it (torch/ml_dtypes/PTX casts agree).
    ``ue8m0_ff``: how decode reads a ue8m0 scale byte 0xFF (formats with ue8m0 scales): "nan"
    (float8_e8m0fnu, OCP MX) or "inf" (2^128 in float32, as the engine's readers compute it),
    so non-zero codes read ±Inf and zero codes NaN (0 * Inf); spec/nan-policy.md §4.
    ``engine``: whose bytes this reproduces; ``source``: where the rules come from;
    ``error_bound``: the per-element bound where it differs from the element type's default.
    """

    name: str = attrs.field(validator=attrs.validators.in_(PROFILE_NAMES))
    scale_rule: ScaleRule
    e2m1_rounding: str = attrs.field(default="threshold", validator=attrs.validators.in_(E2M1_ROUNDINGS))
    e2m1_signed_zero: bool = False
    ue8m0_ff: str = attrs.field(default="nan", validator=attrs.validators.in_(UE8M0_FF_READINGS))
    engine: str = ""
    source: str = ""
    error_bound: str = ""  # overrides the element type's bound (spec README §5) where it differs
    # FlashMLA's writers divide each element by its block's scale as a float, and a NaN or Inf in
    # the block makes that scale NaN (fp4) or NaN / +Inf (fp8, 2^ceil(log2(inf))): the whole
    # block then codes as x / scale (NaN codes, zeros). False: the clamp exponent rule of
    # spec/nan-policy.md §2 (every element coded at the clamped scale).
    poison_nonfinite: bool = False
    # FlashMLA's e2m1 encoder takes the sign bit of x / s as it is, NaN included, and on its
    # reference's CPU a NaN element's quotient keeps that element's NaN: its nibble is then 0x8
    # for a NaN with the sign bit set (after the input's rounding to bf16), 0x0 otherwise.
    # False: every NaN element's nibble is 0x0 (spec/nan-policy.md §2).
    e2m1_nan_sign: bool = False

    def as_dict(self) -> dict:
        """JSON-ready rules (the spec's ``numerics.profile``)."""
        return {"name": self.name, "scale_rule": self.scale_rule.as_dict(), "e2m1_rounding": self.e2m1_rounding,
                "e2m1_signed_zero": self.e2m1_signed_zero, "ue8m0_ff": self.ue8m0_ff, "engine": self.engine,
                "source": self.source,
                # only where set: the spec JSON (and so the file fingerprints) of the profiles
                # that never had the field stay as they were
                **({"poison_nonfinite": True} if self.poison_nonfinite else {}),
                **({"e2m1_nan_sign": True} if self.e2m1_nan_sign else {})}


@attrs.frozen
class ProfileTable:
    """The profiles one format supports; the first is its default."""

    fmt: str
    profiles: tuple[Profile, ...]

    @property
    def default(self) -> str:
        return self.profiles[0].name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)

    def get(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        if name in RETIRED_PROFILES:
            raise LayoutError(f"profile {name!r} of {self.fmt} was retired: {RETIRED_PROFILES[name]}; "
                              f"{self.fmt} supports: {', '.join(self.names)}")
        if name in PROFILE_NAMES:
            raise LayoutError(f"profile {name!r} does not apply to {self.fmt} (no engine writes {self.fmt} "
                              f"with it); {self.fmt} supports: {', '.join(self.names)}")
        raise LayoutError(f"unknown profile {name!r} for {self.fmt}; {self.fmt} supports: {', '.join(self.names)} "
                          f"(all profiles: {', '.join(PROFILE_NAMES)})")


_TABLES: dict[str, ProfileTable] = {}


def declare(fmt: str, *profiles: Profile) -> ProfileTable:
    """Declare the profiles of format ``fmt`` (the first is the default) and remember them."""
    table = ProfileTable(fmt, tuple(profiles))
    _TABLES[fmt] = table
    return table


def supported_profiles() -> dict[str, tuple[str, ...]]:
    """Format name -> the profiles it supports (default first), for every quantized format."""
    return {fmt: t.names for fmt, t in profile_tables().items()}


def profile_tables() -> dict[str, ProfileTable]:
    """Format name -> its profile table, for every quantized format, by name."""
    return dict(sorted(_TABLES.items()))


def profile_table(fmt: str) -> ProfileTable | None:
    return _TABLES.get(fmt)


def profile_field():
    """The ``profile`` attrs field of a layout whose class has a ``PROFILES`` table: defaults to
    the table's default; an unsupported name raises LayoutError naming the alternatives."""

    def check(instance, attribute, value):
        table = instance.PROFILES
        if not isinstance(value, str):
            raise LayoutError(f"profile must be a string (one of {', '.join(table.names)}), got {value!r}")
        table.get(value)

    return attrs.field(default=attrs.Factory(lambda self: self.PROFILES.default, takes_self=True), validator=check)


class ProfiledRule:
    """Descriptor for ``Layout.scale_rule``: on the class, the default profile's rule (what the
    kernels are built for); on an instance, the rule of the layout's profile."""

    def __init__(self, table: ProfileTable):
        self.table = table

    def __get__(self, obj, owner=None) -> ScaleRule:
        if obj is None:
            return self.table.profiles[0].scale_rule
        return self.table.get(obj.profile).scale_rule


class ProfiledLayout:
    """Mixin for quantized layouts with a ``profile`` field (``profile_field``) and a class-level
    ``PROFILES`` table. A class that sets ``PROFILES`` takes its format name and its
    ``scale_rule`` from it (the name is declared once, in ``declare``)."""

    __slots__ = ()
    PROFILES: ProfileTable
    profile: str  # the attrs field each subclass declares (profile_field)
    scale_rule: ScaleRule  # the profile's rule (ProfiledRule, set below)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "PROFILES" in cls.__dict__:
            cls.name = cls.PROFILES.fmt
            cls.scale_rule = ProfiledRule(cls.PROFILES)

    @property
    def numerics(self) -> Profile:
        """The layout's numerics profile."""
        return self.PROFILES.get(self.profile)

    @property
    def default_profile(self) -> bool:
        """Whether the layout uses its format's default profile."""
        return self.profile == self.PROFILES.default
