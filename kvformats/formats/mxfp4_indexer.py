"""mxfp4_indexer: DeepSeek V4 CSA indexer keys in MXFP4 (spec/upstream.md §4).

Page = ``page_size`` value records (head_dim/2 bytes of e2m1 nibbles, element 2k in the low
nibble) then ``page_size`` scale records (one ue8m0 byte per 32 dims; read as a little-endian
int32 they are DeepGEMM's packed scale).
"""

from __future__ import annotations

import attrs
import torch

from kvformats.formats._blocks import IndexerRows
from kvformats.numerics import codes as nx
from kvformats.numerics.profiles import Profile, declare

QUANT_BLOCK = 32
SCALE_RULE = nx.ScaleRule(element_max=nx.E2M1_MAX, floor=1e-4, floor_on="absmax",
                          exponent_min=-127, exponent_max=127)
PROFILES = declare(
    "mxfp4_indexer",
    Profile(name="tokenspeed", scale_rule=SCALE_RULE, e2m1_rounding="threshold", ue8m0_ff="inf",
            engine="tokenspeed MXFP4 indexer writers",
            source="spec/upstream.md §4.3; spec/engines.md §5 'tokenspeed MXFP4 indexer'; "
                   "reads: spec/nan-policy.md §4"),
    Profile(name="vllm",
            scale_rule=nx.ScaleRule(element_max=nx.E2M1_MAX, floor=6 * 2.0**-126, floor_on="absmax",
                                    exponent_min=-127, exponent_max=127),
            e2m1_rounding="rne", e2m1_signed_zero=True,
            engine="vLLM V4 MXFP4 indexer (PTX cvt.rn.satfinite.e2m1x2.f32)",
            source="spec/engines.md §2 vLLM V4, §5 'vLLM V4 MXFP4 indexer': amax >= 6*2^-126, round-half-even"),
    Profile(name="deepgemm-ref", scale_rule=SCALE_RULE, e2m1_rounding="threshold",
            engine="DeepGEMM deep_gemm/utils/math.py per_token_cast_to_fp4 (head_dim 128: 4 scales = 1 int32)",
            source="spec/engines.md §2 DeepGEMM, §5 'DeepGEMM FP4 ref': ceil_ue8m0(amax/6), amax >= 1e-4, ties down"),
    Profile(name="ocp",
            scale_rule=nx.ScaleRule(element_max=nx.E2M1_MAX, floor=0.0, floor_on="absmax", exponent_min=-127,
                                    exponent_max=127, exponent_mode="floor_minus_emax", element_emax=2),
            e2m1_rounding="rne", e2m1_signed_zero=True,
            engine="OCP MX v1.0 reference rule (torchao ScaleCalculationMode.FLOOR)",
            source="spec/engines.md §2 'OCP MX v1.0 rules': 2^(floor(log2 amax) - 2), RNE, saturating",
            error_bound="|x - x_hat| <= 2^(e+1) per element (elements above 6 * 2^e, up to the block maximum "
                        "< 8 * 2^e, clip to 6 * 2^e); <= 2^e where |x| <= 6 * 2^e, <= 2^(e-2) where "
                        "|x| <= 2^(e+1)"),
)


@attrs.frozen(kw_only=True)
class Mxfp4Indexer(IndexerRows):
    """``Mxfp4Indexer(head_dim=128, page_size=64)``: 68 B rows, 4352 B pages.

    ``encode(x [N, head_dim])`` takes x as float32; per 32-block
    ``e = ceil(log2(max(amax, 1e-4) / 6))`` (clamped to ±127) and each element is coded by the
    threshold rule (ties toward the smaller magnitude). ``decode`` returns float32.
    ``profile``: tokenspeed (default), deepgemm-ref (same bytes), vllm (round-half-even, amax floor
    6·2^-126, sign of zero kept) or ocp (MX v1.0: e = floor(log2 amax) - 2, round-half-even).
    """

    # the scale region was "scales" until the names were unified (same bytes): files written
    # then still load (spec.accepted_fingerprints)
    former_region_names = {"scale": "scales"}
    PROFILES = PROFILES
    QUANT_BLOCK = QUANT_BLOCK
    examples = attrs.evolve(IndexerRows.examples,
                            params=(dict(head_dim=128), dict(head_dim=32), dict(head_dim=64), dict(head_dim=256)),
                            one_block=dict(head_dim=QUANT_BLOCK))
    VALUES = ("float4_e2m1fn_x2", "e2m1 codes, element 2k in the low nibble")
    SCALES = ("float8_e8m0fnu", "e + 127 per 32-block")

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        blocks, prof = self._blocks(x), self.numerics
        e = prof.scale_rule.exponents(blocks)
        codes = nx.e2m1_quantize_blocks(blocks, e, prof.e2m1_rounding, prof.e2m1_signed_zero)
        return self._rows(nx.pack_nibbles(codes.reshape(x.shape[0], self.head_dim)), nx.ue8m0_encode(e))

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        values = nx.e2m1_decode(nx.unpack_nibbles(rows[:, self.row_span("values")]))
        return self._scaled(values, nx.ue8m0_decode(rows[:, self.row_span("scale")], self.numerics.ue8m0_ff))
