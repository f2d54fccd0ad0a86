"""fp8_indexer: DeepSeek V4 CSA indexer keys in FP8 (spec/upstream.md §3).

Page = ``page_size`` value records (head_dim float8_e4m3fn bytes) then ``page_size`` scale
records (one little-endian float32 power-of-two multiplier per 128 dims).
"""

from __future__ import annotations

import attrs
import torch

from kvformats.formats._blocks import IndexerRows
from kvformats.formats._bytes import float_bytes
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, declare

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
            source="spec/engines.md §2 DeepGEMM, §5 'DeepGEMM FP8 indexer ref': scale max(amax, 1e-4)/448, "
                   "arbitrary fp32",
            error_bound="|x - x_hat| <= max(|x|/16, s*2^-10) + 2^-23*max(|x|, |x_hat|) per element (s = the "
                        "float32 scale; the last term covers the float32 division and product)"),
)


@attrs.frozen(kw_only=True)
class Fp8Indexer(IndexerRows):
    """``Fp8Indexer(head_dim=128, page_size=64)``: 132 B rows, 8448 B pages.

    ``encode(x [N, head_dim])`` takes x as float32 (bf16/fp16 upcast exactly); per 128-block
    ``scale = 2^ceil(log2(max(amax / 448, 1e-10)))``, bytes = e4m3(x / scale).
    ``decode`` returns float32 ``[N, head_dim]``. head_dim 128 is the size tokenspeed uses;
    larger multiples of 128 get one scale per 128 dims. ``profile``: tokenspeed (default), vllm
    (absmax floor 1e-4) or deepgemm-ref (arbitrary float32 scale max(amax, 1e-4) / 448, x / scale).
    """

    PROFILES = PROFILES
    QUANT_BLOCK = QUANT_BLOCK
    examples = attrs.evolve(IndexerRows.examples, params=(dict(head_dim=128), dict(head_dim=256)),
                            one_block=dict(head_dim=QUANT_BLOCK))
    VALUES = ("float8_e4m3fn", "x / scale")
    SCALES = ("float32", "power-of-two multiplier per 128 dims")

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        codes, scale = nx.e4m3_quantize_by_rule(self._blocks(x), self.scale_rule)
        return self._rows(codes, float_bytes(scale, x.shape[0]))

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        scales = rows[:, self.row_span("scale")].contiguous().view(torch.float32)
        return self._scaled(nx.e4m3_decode(rows[:, self.row_span("values")]), scales)
