"""Element types: every fact about a region's element dtype, in one table.

A region declares its dtype by the ml_dtypes / torch name; everything that reads or writes
elements (the layout's byte counts and typed views, inspect's decoded values, the validator's
rules, the spec's rounding and bound text, the demo's error bound, the code distance) reads the
entry here, so a format built from these types needs no table of its own anywhere else.

The bound of a quantized type (``Grid.bound = (rel, abs)``, ``Grid.max``): an element quantized
against a block scale ``s`` is off by at most ``max(rel |x|, abs s, |x| - max s)`` (the last
term: the part of ``x`` beyond the largest code, clipped; never positive for a scale rule that
rounds up). e4m3: half an ulp of a normal code (3 mantissa bits: ``|x|/16``) or half the
subnormal step (2^-9 s); e2m1: half the widest gap of the grid {0, .5, 1, 1.5, 2, 3, 4, 6} s,
i.e. ``s``.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch

from kvformats.errors import InputError
from kvformats.numerics import codes as nx


@attrs.frozen
class NanCode:
    """Codes c with ``c & mask == code`` are NaN: never written from finite input; ``rule`` names
    the validator's rule against them."""

    mask: int
    code: int
    rule: str


@attrs.frozen
class Grid:
    """A quantized type's grid: its largest finite magnitude and smallest normal one, the bound of
    the module docstring as ``(rel, abs)``, and the spec's text: the element ``rounding`` rule
    (``rne_rounding``: under a profile that rounds e2m1 half to even) and ``error_bound``."""

    max: float
    smallest_normal: float
    bound: tuple[float, float]
    rounding: str
    error_bound: str
    rne_rounding: str = ""


@attrs.frozen
class ElementType:
    """One element dtype. A stored unit of ``unit_bytes`` holds elements of ``bits`` each (an
    e2m1 byte holds two, element 2k in the low nibble); ``short`` is the name rules and messages
    use; ``decode(raw, ue8m0_ff)``: uint8 ``[..., nbytes]`` -> unscaled float32 ``[..., count]``,
    a ue8m0 byte 0xFF read as ``ue8m0_ff`` says.

    ``sign_magnitude``: the top bit of a code is its sign (value order: ``tolerance.ordinal``).
    ``nan``: the NaN codes, if any; ``negative_zero``: a code some writers never emit.
    ``mantissa_bits``: an IEEE float with Inf/NaN encodings and a fraction this wide (0: not one);
    ``exponent_bias``: the code is a biased power-of-two exponent alone (ue8m0). ``grid``: the
    facts of a quantized type; ``scale_storage``: the spec's text for a block scale of this type.
    """

    name: str
    unit_bytes: int
    bits: int
    short: str
    decode: Callable = attrs.field(eq=False, repr=False)
    sign_magnitude: bool = False
    nan: NanCode | None = None
    negative_zero: int | None = None
    mantissa_bits: int = 0
    exponent_bias: int = 0
    grid: Grid | None = None
    scale_storage: str = ""

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of a typed view of a region of this type (one element per stored unit)."""
        return getattr(torch, self.name)

    @property
    def per_unit(self) -> int:
        """Elements in one stored unit."""
        return 8 * self.unit_bytes // self.bits

    @property
    def elements_per_byte(self) -> float:
        return self.per_unit / self.unit_bytes

    @property
    def ieee(self) -> bool:
        return self.mantissa_bits > 0

    @property
    def quantized(self) -> bool:
        """Whether values of this type are codes on a grid scaled per block (a bound applies)."""
        return self.grid is not None

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
        if self.nan is None:  # a type without NaN codes: none of its codes is one
            return torch.zeros_like(codes, dtype=torch.bool)
        return (codes & self.nan.mask) == self.nan.code

    def bound(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The module's per-element bound of ``x [..., block]`` quantized against ``scale [..., 1]``."""
        if self.grid is None:
            raise InputError(f"{self.name} is not a quantized element type: it has no error bound")
        a, (rel, absolute) = x.abs(), self.grid.bound
        return torch.maximum(torch.maximum(a * rel, scale * absolute), a - self.grid.max * scale)

    def positive_codes(self) -> torch.Tensor:
        """float64 magnitudes of every finite non-negative code, ascending."""
        codes = torch.arange(0, 1 << (self.bits - 1), dtype=torch.uint8)
        if self.nan is not None:
            codes = codes[~self.is_nan_code(codes)]
        # a code in the low bits of a unit is its first element; the unit's other elements are 0
        units = torch.zeros((codes.numel(), self.unit_bytes), dtype=torch.uint8)
        units[:, 0] = codes
        return self.decode(units, "nan")[:, 0].double()


def _view_as(dtype: torch.dtype) -> Callable:
    return lambda raw, ue8m0_ff: raw.contiguous().view(dtype).float()


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
                nan=NanCode(0x7F, 0x7F, "e4m3_not_nan"),
                grid=Grid(nx.FP8_E4M3_MAX, 2.0**-6, (2.0**-4, 2.0**-10),
                          rounding="round-to-nearest-even after clamp to +-448",
                          error_bound="|x - x_hat| <= max(|x|/16, 2^(e-10)) per element, x = the value quantized"),
                scale_storage="float8_e4m3fn byte: the scale's value s (positive; 0x7F = NaN)"),
    ElementType("float8_e8m0fnu", 1, 8, "ue8m0", lambda raw, ue8m0_ff: nx.ue8m0_decode(raw, ue8m0_ff),
                nan=NanCode(0xFF, 0xFF, "ue8m0_not_ff"), exponent_bias=nx.UE8M0_BIAS,
                scale_storage="ue8m0 byte s = clamp(e + 127, 0, 255); scale = 2^(s - 127)"),
    ElementType("float4_e2m1fn_x2", 1, 4, "e2m1", _e2m1_decode, sign_magnitude=True, negative_zero=0x8,
                grid=Grid(nx.E2M1_MAX, 1.0, (0.0, 1.0), rounding=E2M1_THRESHOLD_RULE, rne_rounding=E2M1_RNE_RULE,
                          error_bound="|x - x_hat| <= 2^e per element (<= 2^(e-2) where |x| <= 2^(e+1), "
                                      "<= 2^(e-1) where |x| <= 2^(e+2)), x = float32 input")),
    ElementType("bfloat16", 2, 16, "bf16", _view_as(torch.bfloat16), sign_magnitude=True, mantissa_bits=7),
    ElementType("float16", 2, 16, "f16", _view_as(torch.float16), sign_magnitude=True, mantissa_bits=10),
    ElementType("float32", 4, 32, "f32", _view_as(torch.float32), sign_magnitude=True, mantissa_bits=23,
                scale_storage="float32 little-endian multiplier 2^e (an exact power of two)"),
    ElementType("uint8", 1, 8, "u8", lambda raw, ue8m0_ff: raw.float()),
    ElementType("int32", 4, 32, "i32", _view_as(torch.int32)),
    ElementType("int64", 8, 64, "i64", _view_as(torch.int64)),
)}
