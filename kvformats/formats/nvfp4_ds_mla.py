"""nvfp4_ds_mla: the DeepSeek V3.2 MLA row as NVFP4 NoPE + FP8 RoPE, 352 bytes per token
(spec/formats/nvfp4_ds_mla.md; FlashMLA's ``NVFP4_FP8Rope`` layout, vllm-project/FlashMLA
``tests/quant.py``, SM100 kernels ``ModelType::V32_NVFP4_FP8ROPE``).

Row = one token-interleaved 352 B record: 256 B of e2m1 NoPE nibbles (512 dims, element 2k in
the low nibble), 64 B of float8_e4m3fn RoPE values (unscaled), then 32 B of float8_e4m3fn scale
factors, one per 16 NoPE values, stored **permuted**: the scale of NoPE block s is byte
``8 * (s & 3) + (s >> 2)`` of the scale record (the kernel's dequant threads each own the blocks
``4c + q``, c = 0..7, and fetch them in one 8-byte load). A page is ``page_size`` records back to
back; no page pad (FlashMLA's reference over-allocates one row per page: a page stride).

Profile ``flashmla`` (the only one): FlashMLA's ``_quant_tiles_e4m3_sf``: per 16-block
``t = max(fl32(amax / 6), 2^-9)``, ``sf = e4m3(t)`` (RNE, saturating at 448 as torch 2.13 casts),
then rounded up one code where ``sf < t`` (so ``amax / sf <= 6`` below 448); elements
``e2m1_rne(min(|x / sf|, 6))`` with the sign bit ``x / sf < 0``; RoPE ``e4m3(x)``.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import attrs
import torch

from kvformats.errors import LayoutError
from kvformats.formats._nope_rope import NopeRopeRows
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, ProfiledLayout, declare, profile_field

QUANT_BLOCK = 16
# The scale permutation: block s = SCALE_QUADS * c + q is stored at q * (blocks / SCALE_QUADS) + c
# (FlashMLA: 4 thread quarters q, 8 scale factors c each: byte 8 * (s & 3) + (s >> 2)).
SCALE_QUADS = 4
E4M3_MIN_SUBNORMAL = 2.0**-9  # the scale's floor (FlashMLA's clamp_min), e4m3's smallest value
E4M3_MAX_BYTE = 0x7E  # 448, the largest finite e4m3 code: the round-up never passes it
E2M1_NAN_CODE = 0x7  # what FlashMLA's torch.bucketize(NaN, mids, right=True) gives: past every midpoint
FLASHMLA_URL = ("https://github.com/vllm-project/FlashMLA/blob/6bc49418c5ead572ff0339191ddf3b155749e183/"
                "tests/quant.py")


@attrs.frozen(kw_only=True)
class RoundUpE4m3ScaleRule(nx.ScaleRule):
    """A block scale stored as a float8_e4m3fn byte, rounded up: ``t = max(fl32(amax /
    element_max), floor)`` (NaN stays NaN), byte ``b = e4m3_rne(min(t, scale_max))`` (torch
    2.13's cast: saturating at 448, +Inf too; a NaN gives 0x7F), then ``b + 1`` where ``e4m3(b) <
    t`` and ``b < 0x7E``: the least e4m3 value ``>= t`` up to 448. Elements are ``fl32(x / s)``
    (one correctly rounded division) in the element codec."""

    scale_dtype: str = "float8_e4m3fn"
    scale_max: float = nx.FP8_E4M3_MAX
    round_up: bool = True

    def scale_bytes(self, amax: torch.Tensor) -> torch.Tensor:
        """uint8 e4m3 scale bytes of block maxima ``amax [...]`` (float32, >= 0 or NaN)."""
        t = self._q(amax.to(torch.float32))  # NaN stays NaN through the floor
        b = nx.e4m3_encode(t) & 0x7F  # clamp to 448 (Inf too), RNE; NaN -> 0x7F whatever its sign
        if self.round_up:
            b = b + ((nx.e4m3_decode(b) < t) & (b < E4M3_MAX_BYTE)).to(torch.uint8)  # NaN compares false
        return b

    def scales_of_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """float32 scale values (what decode multiplies by) of block maxima ``amax [...]``."""
        return nx.e4m3_decode(self.scale_bytes(amax))


SCALE_RULE = RoundUpE4m3ScaleRule(element_max=nx.E2M1_MAX, floor=E4M3_MIN_SUBNORMAL, floor_on="scale",
                                  power_of_two=False)
PROFILES = declare(
    "nvfp4_ds_mla",
    Profile(name="flashmla", scale_rule=SCALE_RULE, e2m1_rounding="rne", e2m1_signed_zero=True,
            engine="FlashMLA tests/quant.py quantize_k_cache, NVFP4_FP8Rope layout (vllm-project/FlashMLA @6bc4941)",
            source=f"{FLASHMLA_URL} _quant_tiles_e4m3_sf, _cast_to_e2m1_codes: sf = e4m3(max(amax / 6, 2^-9)) "
                   "rounded up one code where below (not past 0x7E), x / sf, e2m1 round-half-even saturating at 6, "
                   "sign bit (x / sf < 0) (-0.0 gives 0x0, a tiny negative 0x8), a NaN gives nibble 0x7; "
                   "RoPE e4m3(x) unscaled, saturating (spec/formats/nvfp4_ds_mla.md)",
            error_bound="NoPE: |x_bf16 - x_hat| <= max(s, |x_bf16| - 6 s) per element, <= s/4 where |x_bf16| <= 2 s "
                        "(s = the block's stored e4m3 scale, the least e4m3 value >= max(amax/6, 2^-9) below 448, "
                        "so |x_bf16| - 6 s > 0 only for blocks saturated at s = 448); RoPE: |x_bf16 - x_hat| <= "
                        "max(|x_bf16|/16, 2^-10, |x_bf16| - 448)"),
)


@attrs.frozen(kw_only=True)
class Nvfp4DsMla(NopeRopeRows, ProfiledLayout, Layout):
    """``Nvfp4DsMla(head_dim=576, rope_dim=64, page_size=64, profile="flashmla")``: 352 B
    token-interleaved rows ``[256 B e2m1 NoPE | 64 x e4m3 RoPE | 32 x e4m3 scale, permuted]``,
    22528 B pages.

    ``encode(x [N, head_dim])`` rounds x to bf16; per 16-block of the NoPE dims ``sf`` = the
    least e4m3 value ``>= max(amax / 6, 2^-9)`` (448 at most), nibbles ``e2m1_rne(x / sf)``; the
    RoPE dims ``e4m3(x)``, unscaled. ``decode`` returns bf16 ``[N, head_dim]`` (``e2m1 value *
    sf``, and the RoPE e4m3 values, both exact). The scale record is stored permuted
    (``scale_positions``); ``block_scales(cache)`` reads it in block order.
    """

    PROFILES = PROFILES
    quant_block = QUANT_BLOCK
    quant_input_dtype = torch.bfloat16  # the NoPE blocks and the RoPE dims are cast from bf16
    SCALE_QUADS: ClassVar[int] = SCALE_QUADS
    # The permutation needs the NoPE blocks in groups of SCALE_QUADS (head_dim - rope_dim a
    # multiple of 64), so there is no one-block geometry (examples.one_block stays None).
    examples = Examples(
        params=(dict(head_dim=576, rope_dim=64), dict(head_dim=192, rope_dim=64), dict(head_dim=96, rope_dim=32),
                dict(head_dim=264, rope_dim=8)),
        small_params={"head_dim": 192, "rope_dim": 64, "page_size": 4})  # 8 blocks: the permutation still moves them

    head_dim: int = attrs.field(default=576, validator=positive)
    rope_dim: int = attrs.field(default=64, validator=positive)
    page_size: int = attrs.field(default=64, validator=positive)
    profile: str = profile_field()

    def _check_geometry(self) -> None:
        super()._check_geometry()  # NopeRopeRows: NoPE dims in whole blocks, an even rope_dim
        group = QUANT_BLOCK * SCALE_QUADS
        if self.nope_dim % group:
            raise LayoutError(f"{self.name} needs head_dim - rope_dim to be a positive multiple of {group} "
                              f"({SCALE_QUADS} scale groups of {QUANT_BLOCK}-value blocks), got head_dim="
                              f"{self.head_dim}, rope_dim={self.rope_dim}")

    # ----- the scale permutation -----------------------------------------------------------
    @functools.cached_property
    def scale_positions(self) -> tuple[int, ...]:
        """Entry s: the byte of the scale record holding NoPE block s's scale,
        ``(s % 4) * (num_blocks / 4) + s // 4`` (for 32 blocks ``8 * (s & 3) + (s >> 2)``)."""
        cols = self.num_blocks // SCALE_QUADS
        return tuple((s % SCALE_QUADS) * cols + s // SCALE_QUADS for s in range(self.num_blocks))

    def scale_order(self, region: str) -> tuple[int, ...] | None:
        """The scale region is stored permuted (``scale_positions``); Layout.scale_order."""
        return self.scale_positions if region == "scale" else None

    def permute_scales(self, scales: torch.Tensor) -> torch.Tensor:
        """Scales ``[..., num_blocks]`` in block order -> the stored order (a new tensor)."""
        out = torch.empty_like(scales)
        out[..., list(self.scale_positions)] = scales
        return out

    def unpermute_scales(self, stored: torch.Tensor) -> torch.Tensor:
        """Scales ``[..., num_blocks]`` in the stored order -> block order (a new tensor)."""
        return stored[..., list(self.scale_positions)]

    def block_scales(self, cache: torch.Tensor) -> torch.Tensor:
        """float8_e4m3fn ``[pages, page_size, num_blocks]``: every row's scales in NoPE block order
        (a copy; ``views(cache)["scale"]`` is the stored, permuted order, zero-copy)."""
        return self.unpermute_scales(self.views(cache)["scale"])

    def describe(self) -> str:
        return (super().describe() + f"\nscale order: block s at byte (s % 4) * {self.num_blocks // SCALE_QUADS} "
                f"+ s // 4 (permuted; block_scales() unpermutes)")

    # ----- declaration and codec -----------------------------------------------------------
    def _segments(self):
        cols = self.num_blocks // SCALE_QUADS
        return (Segment("token", (
            Field("nope", "float4_e2m1fn_x2", self.nope_dim, scale="scale", block=QUANT_BLOCK,
                  doc="NoPE dims: e2m1 nibbles of x / sf (round-half-even), element 2k in the low nibble"),
            Field("rope", "float8_e4m3fn", self.rope_dim, doc="RoPE dims as e4m3 (unscaled, saturating at 448)"),
            Field("scale", "float8_e4m3fn", self.num_blocks, role="scale",
                  doc=f"e4m3 scale factor sf per 16 NoPE values, rounded up; stored permuted: block s at byte "
                      f"(s % 4) * {cols} + s // 4"),
        )),)

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        n, nope, nb = x.shape[0], self.nope_dim, self.num_blocks
        xq = x.to(torch.bfloat16).float()
        blocks = xq[:, :nope].reshape(n, nb, QUANT_BLOCK)
        rule = self.scale_rule
        if not isinstance(rule, RoundUpE4m3ScaleRule):  # every profile of this format stores e4m3 scales
            raise LayoutError(f"{self.name} profile {self.profile!r} needs a RoundUpE4m3ScaleRule, "
                              f"got {type(rule).__name__}")
        sbytes = rule.scale_bytes(nx.absmax(blocks))
        y = blocks / nx.e4m3_decode(sbytes).unsqueeze(-1)
        mag = nx.e2m1_encode(y, "rne") & 0x7  # saturating at 6 (Inf too); NaN -> 0, fixed below
        mag = mag.masked_fill_(torch.isnan(y), E2M1_NAN_CODE)
        codes = mag | ((y < 0).to(torch.uint8) << 3)  # y < 0: -0.0 keeps 0x0, a NaN never has the sign
        out = torch.empty((n, self.row_bytes), dtype=torch.uint8, device=x.device)
        out[:, self.row_span("nope")] = nx.pack_nibbles(codes.reshape(n, nope))
        out[:, self.row_span("rope")] = nx.e4m3_encode(xq[:, nope:])
        out[:, self.row_span("scale")] = self.permute_scales(sbytes)
        return out

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        n, nope, nb = rows.shape[0], self.nope_dim, self.num_blocks
        sf = nx.e4m3_decode(self.unpermute_scales(rows[:, self.row_span("scale")]))
        values = nx.e2m1_decode(nx.unpack_nibbles(rows[:, self.row_span("nope")])).reshape(n, nb, QUANT_BLOCK)
        out = torch.empty((n, self.head_dim), dtype=torch.bfloat16, device=rows.device)
        # exact in float32 and in bf16: at most 5 significant bits, magnitudes >= 2^-10 or 0
        out[:, :nope] = (values * sf.unsqueeze(-1)).reshape(n, nope)
        out[:, nope:] = nx.e4m3_decode(rows[:, self.row_span("rope")])
        return out
