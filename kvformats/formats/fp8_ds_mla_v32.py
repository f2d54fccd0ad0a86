"""fp8_ds_mla_v32: the DeepSeek V3.2 MLA row of 656 bytes (FlashMLA's ``V32_FP8Sparse``).

Row = one token-interleaved 656 B record: 512 float8_e4m3fn NoPE values (the kv_lora_rank
latent, scaled per 128-tile), four little-endian float32 scales (one per tile: the multiplier
decode applies), then 64 bf16 RoPE values (spec/engines.md §2 FlashMLA and vLLM: "512 B values, 16 B
scales, 128 B rope"; FlashMLA ``get_meta() -> (d=576, d_nope=512, d_rope=64, tile=128,
num_tiles=4)``). There is no scale segment at the page tail and no page pad: a page is
``page_size`` records back to back.

Profiles (spec/engines.md §5): ``flashmla-ref`` (default; FlashMLA's reference quantizer: scale
``2^ceil(log2(max(amax / 448, 1e-4)))``, exact power of two, values ``x * 2^-e``) and ``vllm``
(``concat_and_cache_ds_mla``: arbitrary float32 scale ``max(amax / 448, FLT_MIN)``, values
``x / scale``). Both round the input to bf16 first and store the RoPE tail verbatim in bf16.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.formats._bytes import float_bytes
from kvformats.formats._nope_rope import NopeRopeRows
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, positive
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import FLT_MIN, Profile, ProfiledLayout, declare, profile_field

QUANT_BLOCK = 128
PROFILES = declare(
    "fp8_ds_mla_v32",
    Profile(name="flashmla-ref",
            scale_rule=nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="scale"),
            engine="FlashMLA tests/quant.py quantize_k_cache, V32_FP8Sparse layout",
            source="spec/engines.md §2 FlashMLA, §5 'FlashMLA ref, V3.2 656 B': 2^ceil(log2(max(amax/448, 1e-4))), "
                   "fp32 power of two",
            error_bound="|x_bf16 - x_hat| <= max(|x_bf16|/16, 2^(e-10)) per NoPE element (2^e = the tile's "
                        "scale); RoPE dims exact"),
    Profile(name="vllm",
            scale_rule=nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=FLT_MIN, floor_on="scale",
                                    power_of_two=False),
            engine="vLLM concat_and_cache_ds_mla (CUDA; e4m3fn, not the gfx942 fnuz variant)",
            source="spec/engines.md §2 vLLM 'V3.2 writer', §5 'vLLM concat_and_cache_ds_mla 656 B': max(amax/448, "
                   "FLT_MIN), arbitrary fp32",
            error_bound="|x_bf16 - x_hat| <= max(|x_bf16|/16, s*2^-10) + 2^-8*max(|x_bf16|, |x_hat|) per NoPE "
                        "element (s = the tile's float32 scale; the last term is decode's bf16 rounding of "
                        "e4m3 * s); RoPE dims exact"),
)


@attrs.frozen(kw_only=True)
class Fp8DsMlaV32(NopeRopeRows, ProfiledLayout, Layout):
    """``Fp8DsMlaV32(head_dim=576, rope_dim=64, page_size=64, profile="flashmla-ref")``: 656 B
    token-interleaved rows ``[512 e4m3 | 4 x fp32 scale | 64 x bf16 rope]``, 41984 B pages.

    ``encode(x [N, head_dim])`` rounds x to bf16, quantizes the NoPE dims per 128-tile and stores
    the RoPE tail as given in bf16. ``decode`` returns bf16 ``[N, head_dim]``
    (``bf16(e4m3 value * scale)``, the product in float32).
    """

    PROFILES = PROFILES
    quant_block = QUANT_BLOCK
    quant_input_dtype = torch.bfloat16
    examples = Examples(one_block=dict(head_dim=192, rope_dim=64))

    head_dim: int = attrs.field(default=576, validator=positive)
    rope_dim: int = attrs.field(default=64, validator=positive)
    page_size: int = attrs.field(default=64, validator=positive)
    profile: str = profile_field()

    def _segments(self):
        return (Segment("token", (
            Field("nope", "float8_e4m3fn", self.nope_dim, doc="NoPE dims divided by their tile's scale",
                  scale="scale", block=QUANT_BLOCK),
            Field("scale", "float32", self.num_blocks, role="scale", doc="float32 multiplier per 128-tile"),
            Field("rope", "bfloat16", self.rope_dim, doc="RoPE dims as given (already rotated)"),
        )),)

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        n, nope, nb = x.shape[0], self.nope_dim, self.num_blocks
        xq = x.to(torch.bfloat16)
        blocks = xq[:, :nope].float().reshape(n, nb, QUANT_BLOCK)
        codes, scale = nx.e4m3_quantize_by_rule(blocks, self.scale_rule)
        out = torch.empty((n, self.row_bytes), dtype=torch.uint8, device=x.device)
        out[:, self.row_span("nope")] = codes.reshape(n, nope)
        out[:, self.row_span("scale")] = float_bytes(scale, n)
        out[:, self.row_span("rope")] = xq[:, nope:].contiguous().view(torch.uint8)
        return out

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        n, nope, nb = rows.shape[0], self.nope_dim, self.num_blocks
        scale = rows[:, self.row_span("scale")].contiguous().view(torch.float32)
        values = nx.e4m3_decode(rows[:, self.row_span("nope")]).reshape(n, nb, QUANT_BLOCK) * scale.unsqueeze(-1)
        out = torch.empty((n, self.head_dim), dtype=torch.bfloat16, device=rows.device)
        out[:, :nope] = values.reshape(n, nope)
        out.view(torch.uint8)[:, 2 * nope:] = rows[:, self.row_span("rope")]
        return out
