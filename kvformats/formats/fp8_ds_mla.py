"""fp8_ds_mla: DeepSeek V4 attention rows (SWA and compressed KV caches).

Row = 576 B token record (448 float8_e4m3fn NoPE values scaled per 64-block, then 64 bf16 RoPE
values) + 8 B scale record (7 ue8m0 exponents, 1 zero pad byte). Token records of a page come
first, then its scale records; pages round up to a multiple of the token record (spec/upstream.md §2).
"""

from __future__ import annotations

import attrs
import torch

from kvformats.formats._nope_rope import NopeRopeRows
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, ProfiledLayout, declare, profile_field

QUANT_BLOCK = 64
SCALE_RULE = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="absmax")
PROFILES = declare(
    "fp8_ds_mla",
    Profile(name="tokenspeed", scale_rule=SCALE_RULE, ue8m0_ff="inf",
            engine="tokenspeed V4 writers (python, Triton, CUDA)",
            source="spec/upstream.md §2.2; spec/engines.md §5 'vLLM / tokenspeed V4 584 B'; "
                   "reads: spec/nan-policy.md §4"),
    Profile(name="vllm", scale_rule=SCALE_RULE, engine="vLLM V4 fused compress/insert writers (584 B)",
            source="spec/engines.md §5 'vLLM / tokenspeed V4 584 B': same rule as tokenspeed, so the same bytes"),
    Profile(name="flashmla-ref",
            scale_rule=nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="scale"),
            engine="FlashMLA tests/quant.py quantize_k_cache, MODEL1 layout",
            source="spec/engines.md §2 FlashMLA, §5 'FlashMLA ref, MODEL1 584 B': 2^ceil(log2(max(amax/448, 1e-4)))"),
)


@attrs.frozen(kw_only=True)
class Fp8DsMla(NopeRopeRows, ProfiledLayout, Layout):
    """``Fp8DsMla(head_dim=512, rope_dim=64, page_size=64)``: 584 B rows; a page is padded to a
    multiple of the 576 B token record (37440 B for 64 rows, 1728 B for 2).

    ``encode(x [N, head_dim])`` rounds x to bf16, quantizes the NoPE dims per 64-block with a
    power-of-two scale and stores the RoPE tail as given (already rotated) in bf16.
    ``decode`` returns bf16 ``[N, head_dim]``. ``profile``: tokenspeed (default), vllm (same
    bytes) or flashmla-ref (floor 1e-4 on the scale amax/448 instead of on the absmax).
    """

    page_alignment = "token"
    PROFILES = PROFILES
    quant_block = QUANT_BLOCK
    quant_input_dtype = torch.bfloat16  # NoPE values are rounded to bf16 before quantizing
    examples = Examples(
        params=(dict(head_dim=512, rope_dim=64), dict(head_dim=192, rope_dim=64), dict(head_dim=128, rope_dim=64),
                dict(head_dim=96, rope_dim=32), dict(head_dim=66, rope_dim=2)),
        value_idempotent=True,
        one_block=dict(head_dim=128, rope_dim=64),
        # the spec's worked example also shows the HCA page of 2 rows and a narrower head
        worked=(({}, 70), ({"page_size": 2}, 3), ({"head_dim": 192}, 70)))

    head_dim: int = attrs.field(default=512, validator=positive)
    rope_dim: int = attrs.field(default=64, validator=positive)
    page_size: int = attrs.field(default=64, validator=positive)
    profile: str = profile_field()

    def _segments(self):
        return (
            Segment("token", (
                Field("nope", "float8_e4m3fn", self.nope_dim, doc="NoPE dims, scaled by 2^-e per 64-block",
                      scale="scale", block=QUANT_BLOCK),
                Field("rope", "bfloat16", self.rope_dim, doc="RoPE dims as given (already rotated)"),
            )),
            Segment("scales", (
                Field("scale", "float8_e8m0fnu", self.num_blocks, role="scale", doc="e + 127 per NoPE block"),
                Field("scale_pad", "uint8", 1, role="pad", doc="always 0"),
            )),
        )

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        n, nope, nb = x.shape[0], self.nope_dim, self.num_blocks
        xq = x.to(torch.bfloat16)
        # One float32 copy of the NoPE dims, scaled and clamped in place: the same products,
        # clamp and RNE cast as e4m3_quantize_blocks, without its temporaries.
        blocks = xq[:, :nope].reshape(n, nb, QUANT_BLOCK).float()
        e = self.scale_rule._exponents_of_amax(nx.absmax(blocks))
        blocks.mul_(nx.pow2(-e).unsqueeze(-1)).clamp_(-nx.FP8_E4M3_MAX, nx.FP8_E4M3_MAX)
        out = torch.empty((n, self.row_bytes), dtype=torch.uint8, device=x.device)
        out[:, self.row_span("nope")].view(torch.float8_e4m3fn).view(n, nb, QUANT_BLOCK).copy_(blocks)
        out[:, self.row_span("rope")] = xq[:, nope:].contiguous().view(torch.uint8)
        out[:, self.row_span("scale")] = nx.ue8m0_encode(e)
        out[:, self.row_span("scale_pad")] = 0
        return out

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        n, nope, nb = rows.shape[0], self.nope_dim, self.num_blocks
        s = rows[:, self.row_span("scale")]
        codes = rows[:, self.row_span("nope")].reshape(n, nb, QUANT_BLOCK)
        # s = 0xFF gives e = 128: e4m3_decode_pow2 multiplies by 2^128 = +Inf (the "inf" reading)
        values = nx.e4m3_decode_pow2(codes, s.to(torch.int32) - nx.UE8M0_BIAS)
        if self.numerics.ue8m0_ff == "nan":
            # a ue8m0 NaN scales every element of its block to NaN (a mask, not a host read)
            values = values.masked_fill((s == 0xFF).unsqueeze(-1), float("nan"))
        out = torch.empty((n, self.head_dim), dtype=torch.bfloat16, device=rows.device)
        out[:, :nope] = values.view(n, nope)
        out.view(torch.uint8)[:, 2 * nope:] = rows[:, self.row_span("rope")]
        return out
