"""Constants of the DeepSeek V4 model ops that their Triton kernels read too.

They live below both (the kernels must not import ``kvformats.deepseek_v4``, whose modules
dispatch through the registry that reads the kernels' table): the family name the ops are
registered under, the index rows' alignment and integer bounds, the output scale rule of
``inv_rope_fp8_quant``. (Where an op records an invalid value is its declaration's:
``Op.site(arg)``, which a kernel names as ``deferred.site(op, arg)``.)
"""

from __future__ import annotations

from kvformats.numerics import codes as nx

FAMILY = "deepseek_v4"  # the model ops' family: the registry keys them under OpFamily(FAMILY)

ALIGN = 128  # index rows are padded to a multiple of 128 entries (sparse-prefill alignment)
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1

# inv_rope_fp8_quant: fp8 e4m3 with a power-of-two scale per group, amax floored at 1e-10
OUT_SCALE_RULE = nx.ScaleRule(element_max=nx.FP8_E4M3_MAX, floor=1e-10, floor_on="absmax")

def max_page_entry(page_size: int, limit: int) -> int:
    """The largest block-table entry whose slots ``entry * page_size + row`` (row < page_size)
    all stay <= ``limit`` (INT64_MAX for the slot mappings, INT32_MAX for the index rows); larger
    entries count as missing pages (−1)."""
    return (limit + 1) // page_size - 1


def round_up(n: int, k: int) -> int:
    """``n`` rounded up to a multiple of ``k`` (index rows are ALIGN-padded)."""
    return -(-n // k) * k
