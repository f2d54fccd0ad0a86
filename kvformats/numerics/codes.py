"""Element codecs and scale rules: pure torch, vectorized, any device.

Everything here is bit-exact and device independent: exponents come from integer bit
operations on float32 values, never from a libm ``log2`` whose last-ulp behaviour differs
between CPU and GPU builds. The results equal tokenspeed's float32 arithmetic
``ceil(log2(amax / max))`` evaluated with a correctly rounded ``log2``.
"""

from __future__ import annotations

import math

import attrs
import torch

from kvformats.errors import InputError

FP8_E4M3_MAX = 448.0
E2M1_MAX = 6.0
UE8M0_BIAS = 127

# Magnitudes of the eight e2m1 codes, and the thresholds of the tokenspeed encoder: a magnitude
# equal to a threshold takes the smaller code (ties toward the smaller magnitude).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _f32(x: float) -> float:
    """The float32 value nearest to x, as a Python float (how torch rounds a scalar constant)."""
    return torch.tensor(x, dtype=torch.float32).item()


def pow2(k: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2**k`` for integer k: subnormal below -126, 0 below -149, inf above 127."""
    k = k.to(torch.int32)
    normal = ((k.clamp(-126, 128) + 127) << 23).view(torch.float32)
    sub = (torch.ones_like(k) << (k.clamp(-149, -127) + 149)).view(torch.float32)
    out = torch.where(k >= -126, normal, sub)
    return torch.where(k < -149, torch.zeros_like(out), out)


def _round_down_limits() -> list[int]:
    """For each unbiased exponent m of q (index m + 127), how many mantissa fields j make
    ``fl32(log2(q))`` round to exactly m, i.e. ``ceil`` gives m rather than m + 1.

    log2(2^m (1 + j 2^-23)) = m + log2(1 + j 2^-23); it rounds to m iff log2(1 + j 2^-23) is
    below half the float32 gap from m toward +inf, i.e. j < (2^half - 1) * 2^23.
    """
    limits = []
    for m in range(-127, 129):
        if m == 0:
            gap = 2.0**-149
        else:
            t = math.floor(math.log2(abs(m)))
            lower_binade = m < 0 and abs(m) == 2**t  # moving toward +inf shrinks |m| into [2^(t-1), 2^t)
            gap = 2.0 ** (t - 24 if lower_binade else t - 23)
        bound = math.expm1((gap / 2) * math.log(2.0)) * 2.0**23
        limits.append(max(1, math.ceil(bound)))
    return limits


_LIMITS = _round_down_limits()
_LIMIT_TABLES: dict[torch.device, torch.Tensor] = {}


def _limit_table(device: torch.device) -> torch.Tensor:
    table = _LIMIT_TABLES.get(device)
    if table is None:
        table = torch.tensor(_LIMITS, dtype=torch.int32, device=device)
        _LIMIT_TABLES[device] = table
    return table


def ceil_log2(q: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(q))`` as float32 arithmetic gives it, for positive float32 q -> int32.

    Equal to the exact ceiling except just above a power of two, where float32 ``log2`` rounds
    down onto the integer (e.g. q = 2^10 (1 + 2^-23) gives 10, not 11). Subnormal q are
    rescaled first; +inf gives 128 and NaN 129 (callers clamp).
    """
    q = q.to(torch.float32)
    tiny = q < 2.0**-126
    q = torch.where(tiny, q * 2.0**64, q)
    bits = q.view(torch.int32)
    m = ((bits >> 23) & 0xFF) - 127
    j = bits & 0x7FFFFF
    limit = _limit_table(q.device)[(m + 127).clamp(0, 255).long()]
    e = m + (j >= limit).to(torch.int32)
    return torch.where(tiny, e - 64, e)


EXPONENT_MODES = ("ceil", "floor_minus_emax")


@attrs.frozen(kw_only=True)
class ScaleRule:
    """How a block's scale is chosen.

    ``exponent_mode="ceil"`` (every default rule; kernels read these fields):
      ``floor_on="absmax"``: A = max(amax, floor), e = ceil(log2(A / element_max)).
      ``floor_on="scale"``:  e = ceil(log2(max(amax / element_max, floor))).
    ``exponent_mode="floor_minus_emax"`` (OCP MX v1.0): e = floor(log2(max(amax, floor))) -
      element_emax, exact (no float32 log2); amax = 0 with floor 0 gives exponent_min.
    All in float32 (floor and element_max rounded to float32 first), then clamped to
    [exponent_min, exponent_max].

    ``power_of_two=False`` (vLLM's V3.2 writer, DeepGEMM's FP8 indexer reference): the scale is
    not rounded at all: ``s = q`` (the float32 ``q`` above, floored as ``floor_on`` says), stored
    as an arbitrary float32 and applied by float32 division ``x / s``; ``exponents`` then
    raises and ``scales`` is the entry point.
    """

    element_max: float
    floor: float
    floor_on: str = attrs.field(validator=attrs.validators.in_(("absmax", "scale")))
    exponent_min: int = -127
    exponent_max: int = 128
    exponent_mode: str = attrs.field(default="ceil", validator=attrs.validators.in_(EXPONENT_MODES))
    element_emax: int = 0  # emax of the element type, used by "floor_minus_emax" (e2m1: 2, e4m3: 8)
    power_of_two: bool = True

    def exponents(self, blocks: torch.Tensor) -> torch.Tensor:
        """Exponents of ``blocks [..., block]`` (float32) reduced over the last dim -> int32 [...]."""
        return self._exponents_of_amax(absmax(blocks))

    def _q(self, amax: torch.Tensor) -> torch.Tensor:
        # Divide by a tensor, not a Python number: on CUDA, torch turns division by a host scalar
        # into a product with its float32 reciprocal, which differs from the correctly rounded
        # quotient (the definition, and what every kernel computes) in the last bit.
        # (made by a fill kernel: a copy from a host tensor is refused inside CUDA-graph capture)
        element_max = torch.full((), _f32(self.element_max), dtype=torch.float32, device=amax.device)
        if self.floor_on == "absmax":
            return amax.clamp_min(_f32(self.floor)) / element_max
        return (amax / element_max).clamp_min(_f32(self.floor))

    def _exponents_of_amax(self, amax: torch.Tensor) -> torch.Tensor:
        if not self.power_of_two:
            raise InputError("this scale rule stores arbitrary float32 scales; use scales_of_amax()")
        if self.exponent_mode == "floor_minus_emax":
            e = floor_log2(amax.clamp_min(_f32(self.floor))) - self.element_emax
            return e.clamp(self.exponent_min, self.exponent_max)
        return ceil_log2(self._q(amax)).clamp(self.exponent_min, self.exponent_max)

    def scales_of_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """float32 scales (the multiplier decode applies) for block maxima ``amax [...]``."""
        if self.power_of_two:
            return pow2(self._exponents_of_amax(amax))
        return self._q(amax.to(torch.float32))

    def as_dict(self) -> dict:
        return attrs.asdict(self)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """Exact ``floor(log2(a))`` of float32 ``a >= 0`` -> int32 (bit operations; subnormals
    included); 0 gives -1000 (callers clamp), +inf 128."""
    a = a.to(torch.float32)
    tiny = a < 2.0**-126
    scaled = torch.where(tiny, a * 2.0**64, a)
    m = ((scaled.view(torch.int32) >> 23) & 0xFF) - 127
    m = torch.where(tiny, m - 64, m)
    return torch.where(a == 0, torch.full_like(m, -1000), m)


def absmax(blocks: torch.Tensor) -> torch.Tensor:
    """``blocks.abs().amax(-1)`` without the ``abs`` temporary: ``max(amax, -amin)``.

    Equal for every input that matters: NaN propagates through both; a block of signed zeros
    may give -0.0 instead of 0.0, which every floor (1e-4 absmax, 1e-10 scale) replaces.
    """
    return torch.maximum(blocks.amax(dim=-1), blocks.amin(dim=-1).neg_())


def e4m3_decode_pow2(b: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``e4m3_decode(b) * pow2(e)[..., None]`` (``b`` uint8 ``[..., k]``, ``e`` int ``[...]``)
    -> float32 ``[..., k]``, bit for bit, without torch's slow scalar float8 conversion.

    Every e4m3fn value v (subnormals included) is a normal float16 2^-8 v whose bits are the
    byte's sign at bit 15 and its low 7 bits at bits 13..7. So ``h * 2^(e+8)`` is the same exact
    product as ``v * 2^e`` and rounds once to the same float32, provided 2^(e+8) is a finite
    float32 and pow2(e) is not flushed to 0 (-149 <= e <= 119) and the byte is not NaN (0x7F,
    0xFF). Blocks outside that take the direct expression.
    """
    e = e.to(torch.int32)
    h = b.view(torch.int8).to(torch.int16)  # sign-extends: bits 15 and 14 copy the sign
    h.bitwise_left_shift_(7).bitwise_and_(-0x4001)  # keep bit 15, clear bit 14
    out = h.view(torch.float16).to(torch.float32)
    if out.numel() == 0:
        return out
    # A NaN byte lands on +-1.875, every other code on |v| 2^-8 <= 1.75: two cheap reductions
    # tell whether any block needs the per-block test.
    bad = (e < -149) | (e > 119)
    if bool(out.amax() >= 1.875) or bool(out.amin() <= -1.875):
        bad |= ((b & 0x7F) == 0x7F).any(dim=-1)
    out.mul_(pow2(e + 8).unsqueeze(-1))
    if bool(bad.any()):
        out[bad] = e4m3_decode(b[bad]) * pow2(e[bad]).unsqueeze(-1)
    return out


def e4m3_encode(y: torch.Tensor) -> torch.Tensor:
    """float32 -> float8_e4m3fn bytes: clamp to ±448, then round to nearest even. uint8, same shape."""
    y = y.to(torch.float32).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return y.to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bytes (uint8) -> float32 (0x7F / 0xFF are NaN)."""
    return b.view(torch.float8_e4m3fn).to(torch.float32)


E2M1_ROUNDINGS = ("threshold", "rne")
# Thresholds where the smaller neighbour has an odd code (0.5, 1.5, 3): round-half-even goes up.
_E2M1_TIES_UP = (0.75, 1.75, 3.5)


def e2m1_encode(y: torch.Tensor, rounding: str = "threshold", signed_zero: bool = False) -> torch.Tensor:
    """float32 -> e2m1 nibble codes (uint8 0..15).

    ``rounding="threshold"`` (tokenspeed, DeepGEMM's reference): magnitudes saturate at 6; exact
    midpoints take the smaller magnitude (0.25 -> 0, 0.75 -> 0.5, 1.75 -> 1.5, 3.5 -> 3, 5 -> 4).
    ``rounding="rne"`` (PTX ``cvt.rn.satfinite``, OCP, ml_dtypes): midpoints go to the even code
    (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating at 6.
    ``signed_zero=False``: the sign bit is set only for a non-zero code of a negative value, so
    -0.0 and tiny negatives give 0x0; ``True``: the sign bit copies the input's (0x8 possible).
    """
    if rounding not in E2M1_ROUNDINGS:
        raise InputError(f"rounding must be one of {E2M1_ROUNDINGS}, got {rounding!r}")
    y = y.to(torch.float32)
    a = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for t in E2M1_THRESHOLDS:
        code += a > t
    if rounding == "rne":
        for t in _E2M1_TIES_UP:
            code += a == t
    sign = torch.signbit(y) if signed_zero else (y < 0) & (code != 0)
    return code | (sign.to(torch.uint8) << 3)


def e2m1_decode(n: torch.Tensor) -> torch.Tensor:
    """e2m1 nibble codes (uint8, low 4 bits used) -> float32."""
    # arithmetic rather than a table copied from the host (refused inside CUDA-graph capture):
    # codes 0, 1 are 0 and 0.5; code 2e + m (e >= 1) is (1 + m / 2) * 2^(e - 1), all exact
    c = (n & 7).to(torch.int32)
    e, m = c >> 1, (c & 1).to(torch.float32)
    mag = torch.where(e == 0, m * 0.5, (1 + m * 0.5) * torch.exp2((e - 1).to(torch.float32)))
    return torch.where((n & 8) != 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2k] nibble codes -> [..., k] bytes; element 2k in the low nibble."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., k] bytes -> [..., 2k] nibble codes; the low nibble comes first."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def ue8m0_encode(e: torch.Tensor) -> torch.Tensor:
    """Integer exponents -> ue8m0 bytes ``clamp(e + 127, 0, 255)``."""
    return (e.to(torch.int32) + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)


# How a ue8m0 byte 0xFF reads (a numerics profile's ``ue8m0_ff``): "nan" as float8_e8m0fnu and
# OCP MX define it; "inf" as the float32 arithmetic 2^(255 - 127) gives it, which is how
# tokenspeed's readers compute the scale (spec/nan-policy.md §4).
UE8M0_FF_READINGS = ("nan", "inf")


def ue8m0_decode(s: torch.Tensor, ff: str = "nan") -> torch.Tensor:
    """ue8m0 bytes -> float32 ``2**(s - 127)``; 0xFF is NaN (``ff="nan"``, as float8_e8m0fnu
    defines it) or +Inf (``ff="inf"``: 2^128 overflows float32)."""
    if ff not in UE8M0_FF_READINGS:
        raise InputError(f"ff must be one of {UE8M0_FF_READINGS}, got {ff!r}")
    v = pow2(s.to(torch.int32) - UE8M0_BIAS)  # pow2(128) is +Inf
    if ff == "inf":
        return v
    return torch.where(s == 0xFF, torch.full_like(v, float("nan")), v)


def e4m3_quantize_blocks(blocks: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``blocks [..., b]`` float32 scaled by 2^-e (``e [...]``) -> e4m3 bytes [..., b]."""
    y = (blocks * pow2(-e).unsqueeze(-1)).to(torch.float32)  # a fresh tensor: clamp it in place
    return y.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_quantize_divided(blocks: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """FlashMLA's element rule (a profile's ``poison_nonfinite``): ``blocks [..., b]`` float32
    divided by their block's scale as a float, ``2^e`` (``e`` int ``[...]``; 2^128 is +Inf) or NaN
    where the block maximum is NaN -> e4m3 bytes [..., b]. Equal to ``e4m3_quantize_blocks`` on
    finite blocks; a NaN or Inf block codes as x / NaN or x / Inf (NaN codes and signed zeros)."""
    scale = torch.where(torch.isnan(absmax(blocks)), torch.full_like(e, float("nan"), dtype=torch.float32),
                        pow2(e))
    y = blocks.to(torch.float32) / scale.unsqueeze(-1)
    return y.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e2m1_quantize_blocks(blocks: torch.Tensor, e: torch.Tensor, rounding: str = "threshold",
                         signed_zero: bool = False) -> torch.Tensor:
    """``blocks [..., b]`` float32 scaled by 2^-e -> e2m1 nibble codes [..., b]."""
    return e2m1_encode(blocks * pow2(-e).unsqueeze(-1), rounding, signed_zero)


def e4m3_quantize_by_rule(blocks: torch.Tensor, rule: ScaleRule) -> tuple[torch.Tensor, torch.Tensor]:
    """``blocks [..., b]`` float32 -> (e4m3 bytes [..., b], float32 scales [...]) by ``rule``:
    a power-of-two scale (``x * 2^-e``) or an arbitrary float32 one (``x / scale``)."""
    if rule.power_of_two:
        e = rule.exponents(blocks)
        return e4m3_quantize_blocks(blocks, e), pow2(e)
    scale = rule.scales_of_amax(absmax(blocks))
    return e4m3_quantize_by_scale(blocks, scale), scale


def e4m3_quantize_by_scale(blocks: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``blocks [..., b]`` float32 divided by arbitrary float32 ``scale [...]`` (one correctly
    rounded float32 division), clamped to ±448, RNE -> e4m3 bytes [..., b]."""
    y = (blocks.to(torch.float32) / scale.to(torch.float32).unsqueeze(-1))
    return y.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
