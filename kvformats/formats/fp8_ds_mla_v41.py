"""fp8_ds_mla_v41: the DeepSeek V4.1 attention record of 528 bytes per token, in its two layouts
(spec/formats/fp8_ds_mla_v41.md, fp8_ds_mla_v41_interleaved.md).

A token is a 512 B data record (all 512 head dims as float8_e4m3fn: the 64 RoPE dims are
quantized too) and a 16 B scale record (one ue8m0 byte per 32 values).

* ``fp8_ds_mla_v41`` (page-planar): a page holds its ``page_size`` data records, then its
  ``page_size`` scale records; no page pad. tokenspeed-kernel 0.1.4's paged ``swa`` field and the
  FlashMLA forks (vllm-project/FlashMLA @02137a4, sgl-project/FlashMLA @259ea0c) store it so.
  Default profile ``tokenspeed``.
* ``fp8_ds_mla_v41_interleaved`` (token-interleaved): each token's data record, then its own
  scale record. Upstream FlashMLA's kernels (``kv_cache_format.h`` @2e5429f) and vLLM 0.33.0
  store it so. Default profile ``flashmla``.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.formats._blocks import TokenInterleaved, V41Rows
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, declare

QUANT_BLOCK = 32
TOKENSPEED_URL = "https://pypi.org/project/tokenspeed-kernel/0.1.4/"
FLASHMLA_FORK_URL = ("https://github.com/vllm-project/FlashMLA/blob/02137a43fbd0c2ef6a386ea4c841e9bd067e3823/"
                     "tests/quant.py")
# tokenspeed's and vLLM's rule (the V4 584 B row's, spec/upstream.md §2.2): amax floored at
# 1e-4, times 1/448, exponent ceil(log2) of that; per 32 values.
TOKENSPEED_RULE = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="absmax")
# FlashMLA's rule: the 1e-4 floor is on the scale amax / 448, not on amax.
FLASHMLA_RULE = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-4, floor_on="scale")
TOKENSPEED = Profile(
    name="tokenspeed", scale_rule=TOKENSPEED_RULE,
    engine="tokenspeed-kernel 0.1.4 tokenspeed_kernel/ops/attention/dsv41/triton.py _pack_kernel (format 'swa')",
    source=f"{TOKENSPEED_URL}: 2^ceil(log2(max(amax, 1e-4) * (1/448))) per 32 values, x / scale, e4m3 RNE "
           "saturating; finite input (spec/formats/fp8_ds_mla_v41.md)")
FLASHMLA = Profile(
    name="flashmla", scale_rule=FLASHMLA_RULE, poison_nonfinite=True,
    engine="FlashMLA tests/quant.py quantize_k_cache (V41_FP8Sparse; upstream and the vllm-project fork)",
    source=f"{FLASHMLA_FORK_URL}: 2^ceil(log2(max(amax / 448, 1e-4))), x / scale; a NaN or Inf block "
           "stores scale 0xFF and x / scale (spec/formats/fp8_ds_mla_v41.md)")
VLLM = Profile(
    name="vllm", scale_rule=TOKENSPEED_RULE,
    engine="vLLM 0.33.0 vllm/models/deepseek_v41/common/ops/cache_utils.py _quantize_and_insert_k_mxfp8_kernel",
    source="vllm 0.33.0 (PyPI): amax floored at 1e-4, 2^ceil(log2(amax * (1/448))), x * 2^-e clamped to 448; "
           "finite input (spec/formats/fp8_ds_mla_v41_interleaved.md)")
PROFILES = declare("fp8_ds_mla_v41", TOKENSPEED, FLASHMLA)
INTERLEAVED_PROFILES = declare("fp8_ds_mla_v41_interleaved", FLASHMLA, VLLM, TOKENSPEED)


@attrs.frozen(kw_only=True)
class Fp8DsMlaV41(V41Rows):
    """``Fp8DsMlaV41(head_dim=512, page_size=64)``: 528 B rows, 33792 B pages, page-planar.

    ``encode(x [N, head_dim])`` rounds x to bf16 and quantizes every dim (RoPE included) per
    32-block with a power-of-two scale: ``2^ceil(log2(max(amax, 1e-4) / 448))`` (profile
    ``tokenspeed``, the default) or ``2^ceil(log2(max(amax / 448, 1e-4)))`` (``flashmla``).
    ``decode`` returns bf16 ``[N, head_dim]`` (``bf16(e4m3 value * 2^(s - 127))``).
    """

    PROFILES = PROFILES
    QUANT_BLOCK = QUANT_BLOCK
    examples = attrs.evolve(V41Rows.examples, one_block=dict(head_dim=QUANT_BLOCK))
    VALUES = ("float8_e4m3fn", "every head dim (RoPE too), scaled by 2^-e per 32-block")
    SCALES = ("float8_e8m0fnu", "e + 127 per 32-block")

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        blocks, prof = self._blocks(x), self.numerics
        e = prof.scale_rule.exponents(blocks)
        if prof.poison_nonfinite:
            values = nx.e4m3_quantize_divided(blocks, e)
        else:
            values = nx.e4m3_quantize_blocks(blocks, e)
        return self._rows(values, nx.ue8m0_encode(e))

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        # exact in float32 (4 significant bits times a power of two), then one RNE to bf16;
        # a NaN code or a NaN scale (0xFF) gives NaN
        values = nx.e4m3_decode(rows[:, self.row_span("values")])
        return self._scaled(values, nx.ue8m0_decode(rows[:, self.row_span("scale")])).to(torch.bfloat16)


@attrs.frozen(kw_only=True)
class Fp8DsMlaV41Interleaved(TokenInterleaved, Fp8DsMlaV41):
    """``Fp8DsMlaV41Interleaved(head_dim=512, page_size=64)``: the same 528 B per token as
    fp8_ds_mla_v41, token-interleaved (each token's 512 value bytes, then its 16 scale bytes);
    pages of ``page_size * 528`` bytes. Profiles: ``flashmla`` (default), ``vllm``,
    ``tokenspeed`` (the last two give the same bytes)."""

    PROFILES = INTERLEAVED_PROFILES
