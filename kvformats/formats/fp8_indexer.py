"""fp8_indexer: DeepSeek V4 CSA indexer keys in FP8 (spec/upstream.md §3).

Page = ``page_size`` value records (head_dim float8_e4m3fn bytes) then ``page_size`` scale
records (one little-endian float32 power-of-two multiplier per 128 dims).
"""

from __future__ import annotations

import attrs
import torch

from kvformats.formats._blocks import BlockScaledRows
from kvformats.formats._bytes import float_bytes
from kvformats.layout import Layout, positive
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, ProfiledLayout, ProfiledRule, declare, profile_field

QUANT_BLOCK = 128
SCALE_RULE = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-10, floor_on="scale")
PROFILES = declare(
    "fp8_indexer",
    Profile(name="tokenspeed", scale_rule=SCALE_RULE, engine="tokenspeed FP8 indexer torch writers",
            source="spec/upstream.md §3.2; spec/engines.md §5 'tokenspeed FP8 indexer torch writers'"),
    Profile(name="vllm", scale_rule=nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="absmax"),
            engine="vLLM indexer_k_quant_and_cache with scale_fmt='ue8m0' (the V4 FP8 indexer)",
            source="spec/engines.md §2 vLLM, §5 'vLLM indexer_k_quant_and_cache': amax >= 1e-4, amax/448 rounded "
                   "up to a power of two"),
    Profile(name="deepgemm-ref",
            scale_rule=nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="absmax",
                                    power_of_two=False),
            engine="DeepGEMM FP8 indexer test reference (and vLLM indexer_k_quant_and_cache without ue8m0)",
            source="spec/engines.md §2 DeepGEMM, §5 'DeepGEMM FP8 indexer ref': scale max(amax, 1e-4)/448, arbitrary fp32",
            error_bound="|x - x_hat| <= max(|x|/16, s*2^-10) + 2^-23*max(|x|, |x_hat|) per element (s = the "
                        "float32 scale; the last term covers the float32 division and product)"),
)


@attrs.frozen(kw_only=True)
class Fp8Indexer(BlockScaledRows, ProfiledLayout, Layout):
    """``Fp8Indexer(head_dim=128, page_size=64)``: 132 B rows, 8448 B pages.

    ``encode(x [N, head_dim])`` takes x as float32 (bf16/fp16 upcast exactly); per 128-block
    ``scale = 2^ceil(log2(max(amax / 448, 1e-10)))``, bytes = e4m3(x / scale).
    ``decode`` returns float32 ``[N, head_dim]``. head_dim 128 is the size tokenspeed uses;
    larger multiples of 128 get one scale per 128 dims. ``profile``: tokenspeed (default), vllm
    (absmax floor 1e-4) or deepgemm-ref (arbitrary float32 scale max(amax, 1e-4) / 448, x / scale).
    """

    name = "fp8_indexer"
    PROFILES = PROFILES
    scale_rule = ProfiledRule(PROFILES)
    example_params = (dict(head_dim=128), dict(head_dim=256))
    value_idempotent = True

    head_dim: int = attrs.field(default=128, validator=positive)
    page_size: int = attrs.field(default=64, validator=positive)
    profile: str = profile_field(PROFILES)

    QUANT_BLOCK = QUANT_BLOCK
    DATA_SEGMENT = "values"
    VALUES = ("float8_e4m3fn", "x / scale")
    SCALES = ("float32", "power-of-two multiplier per 128 dims")

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        blocks = self._blocks(x)
        values, scales = self.row_span("values"), self.row_span("scale")
        out = torch.empty((n, self.row_bytes), dtype=torch.uint8, device=x.device)
        rule = self.scale_rule
        if rule.power_of_two:
            e = rule.exponents(blocks)
            out[:, values] = nx.e4m3_quantize_blocks(blocks, e).reshape(n, self.head_dim)
            scale = nx.pow2(e)
        else:
            scale = rule.scales_of_amax(nx.absmax(blocks))
            out[:, values] = nx.e4m3_quantize_by_scale(blocks, scale).reshape(n, self.head_dim)
        out[:, scales] = float_bytes(scale, n)
        return out

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        n, d, nb = rows.shape[0], self.head_dim, self.num_blocks
        scales = rows[:, self.row_span("scale")].contiguous().view(torch.float32)
        values = nx.e4m3_decode(rows[:, self.row_span("values")]).reshape(n, nb, self.QUANT_BLOCK)
        return (values * scales.unsqueeze(-1)).reshape(n, d)
