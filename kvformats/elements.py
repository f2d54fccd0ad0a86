"""Element types: every fact about a region's element dtype, in one table.

A region declares its dtype by the ml_dtypes / torch name; everything that reads or writes
elements (the layout's byte counts and typed views, inspect's decoded values, the validator's
rules, the spec's rounding and bound text, the demo's error bound, the code distance) reads the
entry here, so a format built from these types needs no table of its own anywhere else.

``bound_rel``, ``bound_abs`` and ``max``: an element quantized against a block scale ``s`` is off
by at most ``max(bound_rel |x|, bound_abs s, |x| - max s)`` (the last term: the part of ``x``
beyond the largest code, clipped; never positive for a scale rule that rounds up). e4m3: half
an ulp of a normal code (3 mantissa bits: ``|x|/16``) or half the subnormal step (2^-9 s); e2m1:
half the widest gap of the grid {0, .5, 1, 1.5, 2, 3, 4, 6} s, i.e. ``s``.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch

from kvformats import numerics as nx


def _view_as(dtype: torch.dtype) -> Callable:
    return lambda raw, ue8m0_ff: raw.contiguous().view(dtype).float()


@attrs.frozen
class ElementType:
    """One element dtype. ``unit_bytes`` / ``per_unit``: a stored unit's bytes and the elements
    it packs (an e2m1 byte holds two, element 2k in the low nibble); ``bits``: bits of one
    element's code; ``short``: the name rules and messages use; ``decode(raw, ue8m0_ff)``: uint8
    ``[..., nbytes]`` -> float32 ``[..., count]`` (unscaled; ue8m0 byte 0xFF read as ``ue8m0_ff``).

    Codes: ``sign_magnitude`` (top bit the sign: value order is ``tolerance.ordinal``);
    ``nan_mask`` / ``nan_code`` (a code c is NaN iff ``c & nan_mask == nan_code``; the e4m3 and
    ue8m0 NaN encodings, never written from finite input; ``nan_rule`` names the validator's rule
    against them); ``negative_zero`` (a code some writers never emit); ``ieee`` (IEEE Inf/NaN
    encodings, ``mantissa_bits`` wide fraction: finite values are checked with isfinite);
    ``exponent_bias``: a code that is a biased power-of-two exponent alone (ue8m0).

    Quantized element types add ``max`` (the largest finite magnitude), ``smallest_normal``,
    ``bound_rel`` / ``bound_abs`` (the module's bound), and the spec's text: ``rounding`` (the
    element rule; ``rne_rounding`` under a profile that rounds e2m1 half to even), ``error_bound``; ``scale_storage``: how a block scale stored in this type reads.
    """

    name: str
    unit_bytes: int
    bits: int
    short: str
    decode: Callable = attrs.field(eq=False, repr=False)
    per_unit: int = 1
    sign_magnitude: bool = False
    nan_mask: int = 0
    nan_code: int | None = None
    nan_rule: str = ""
    negative_zero: int | None = None
    ieee: bool = False
    mantissa_bits: int = 0
    exponent_bias: int = 0
    max: float = 0.0
    smallest_normal: float = 0.0
    bound_rel: float = 0.0
    bound_abs: float = 0.0
    rounding: str = ""
    rne_rounding: str = ""
    error_bound: str = ""
    scale_storage: str = ""

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of a typed view of a region of this type (one element per stored unit)."""
        return getattr(torch, self.name)

    @property
    def elements_per_byte(self) -> float:
        return self.per_unit / self.unit_bytes

    @property
    def quantized(self) -> bool:
        """Whether values of this type are codes on a grid scaled per block (a bound applies)."""
        return self.max > 0

    def nbytes(self, count: int) -> int:
        """Bytes of ``count`` elements."""
        return count // self.per_unit * self.unit_bytes

    def codes(self, raw: torch.Tensor) -> torch.Tensor:
        """int64 ``[..., count]`` element codes of uint8 region bytes ``[..., nbytes]``: units are
        little-endian, the elements of a packed byte low bits first."""
        raw = raw.to(torch.int64)
        if self.per_unit > 1:
            shifts = torch.arange(0, 8, self.bits, device=raw.device)
            return ((raw.unsqueeze(-1) >> shifts) & ((1 << self.bits) - 1)).flatten(-2)
        units = raw.unflatten(-1, (-1, self.unit_bytes))
        shifts = torch.arange(0, 8 * self.unit_bytes, 8, device=raw.device)
        return (units << shifts).sum(-1)

    def is_nan_code(self, codes: torch.Tensor) -> torch.Tensor:
        return (codes & self.nan_mask) == self.nan_code

    def bound(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The module's per-element bound of ``x [..., block]`` quantized against ``scale [..., 1]``."""
        a = x.abs()
        return torch.maximum(torch.maximum(a * self.bound_rel, scale * self.bound_abs), a - self.max * scale)

    def positive_codes(self) -> torch.Tensor:
        """float64 magnitudes of every finite non-negative code, ascending."""
        codes = torch.arange(0, 1 << (self.bits - 1), dtype=torch.uint8)
        if self.nan_code is not None:
            codes = codes[~self.is_nan_code(codes)]
        # a code in the low bits of a unit is its first element; the unit's other elements are 0
        units = torch.zeros((codes.numel(), self.unit_bytes), dtype=torch.uint8)
        units[:, 0] = codes
        return self.decode(units, "nan")[:, 0].double()


def _e2m1_decode(raw, ue8m0_ff):
    return nx.e2m1_decode(nx.unpack_nibbles(raw))


E2M1_THRESHOLD_RULE = ("e2m1 thresholds on a = min(|y|, 6): a <= 0.25 -> 0, <= 0.75 -> 0.5, <= 1.25 -> 1, "
                       "<= 1.75 -> 1.5, <= 2.5 -> 2, <= 3.5 -> 3, <= 5 -> 4, else 6; ties toward smaller "
                       "magnitude; sign only on a non-zero code; element 2k in the low nibble")
E2M1_RNE_RULE = ("e2m1 round-half-even on a = min(|y|, 6): midpoints 0.25, 1.25, 2.5, 5 go down, "
                 "0.75, 1.75, 3.5 go up (to the even code); saturating at 6; element 2k in the low nibble")

# Rules and bounds as spec/upstream.md §2.2, §3.2, §4.3 and §11 state them (e = block exponent).
ELEMENTS: dict[str, ElementType] = {e.name: e for e in (
    ElementType("float8_e4m3fn", 1, 8, "e4m3", lambda raw, ue8m0_ff: nx.e4m3_decode(raw), sign_magnitude=True,
                nan_mask=0x7F, nan_code=0x7F, nan_rule="e4m3_not_nan", max=nx.FP8_E4M3_MAX, smallest_normal=2.0**-6,
                bound_rel=2.0**-4, bound_abs=2.0**-10,
                rounding="round-to-nearest-even after clamp to +-448",
                error_bound="|x - x_hat| <= max(|x|/16, 2^(e-10)) per element, x = the value quantized",
                scale_storage="float8_e4m3fn byte: the scale's value s (positive; 0x7F = NaN)"),
    ElementType("float8_e8m0fnu", 1, 8, "ue8m0", lambda raw, ue8m0_ff: nx.ue8m0_decode(raw, ue8m0_ff),
                nan_mask=0xFF, nan_code=0xFF, nan_rule="ue8m0_not_ff", exponent_bias=nx.UE8M0_BIAS,
                scale_storage="ue8m0 byte s = clamp(e + 127, 0, 255); scale = 2^(s - 127)"),
    ElementType("float4_e2m1fn_x2", 1, 4, "e2m1", _e2m1_decode, per_unit=2, sign_magnitude=True,
                negative_zero=0x8, max=nx.E2M1_MAX, smallest_normal=1.0, bound_abs=1.0,
                rounding=E2M1_THRESHOLD_RULE, rne_rounding=E2M1_RNE_RULE,
                error_bound="|x - x_hat| <= 2^e per element (<= 2^(e-2) where |x| <= 2^(e+1), "
                            "<= 2^(e-1) where |x| <= 2^(e+2)), x = float32 input"),
    ElementType("bfloat16", 2, 16, "bf16", _view_as(torch.bfloat16), sign_magnitude=True, ieee=True,
                mantissa_bits=7),
    ElementType("float16", 2, 16, "f16", _view_as(torch.float16), sign_magnitude=True, ieee=True,
                mantissa_bits=10),
    ElementType("float32", 4, 32, "f32", _view_as(torch.float32), sign_magnitude=True, ieee=True,
                mantissa_bits=23,
                scale_storage="float32 little-endian multiplier 2^e (an exact power of two)"),
    ElementType("uint8", 1, 8, "u8", lambda raw, ue8m0_ff: raw.float()),
    ElementType("int32", 4, 32, "i32", _view_as(torch.int32)),
    ElementType("int64", 8, 64, "i64", _view_as(torch.int64)),
)}


def element(name: str) -> ElementType:
    return ELEMENTS[name]
