"""DeepSeek V4.1 model ops: the operations that fill V4.1's caches (tokenspeed-kernel 0.1.4's
``swa_rope_scatter``, ``compressor_pool``, ``compressor_tail_scatter``, ``index_q_quantize``),
as a pure-torch reference and Triton kernels, on kvformats' V4.1 layouts.

    from kvformats import deepseek_v41 as dsv41
    dsv41.swa_rope_scatter(rows, positions, cos_sin, cache, slots)          # fp8_ds_mla_v41 rows
    dsv41.compressor_tail_scatter(content, scores, tail, slots=tail_slots)  # compressor_state_v41 rows
    pooled = dsv41.compressor_pool(content, scores, tail, previous=prev, tail_slots=tail_slots, active=active)
    q_sim = dsv41.index_q_quantize(index_q)                                 # as mxfp4_indexer stores keys

``kvformats.deepseek_v41.geometry`` describes where tokenspeed 0.1.1 keeps these records
(spec/dsv41-geometry.md).

Every public function validates its arguments first (typed errors, nothing written) and then
calls the implementation registered for its backend under the model op ``("deepseek_v41", op)``
in ``kvformats.codec.registry``.
"""

from kvformats.deepseek_v41._dispatch import FAMILY, MODEL_OPS
from kvformats.deepseek_v41.compressor import compressor_pool, compressor_tail_scatter, tail_layout
from kvformats.deepseek_v41.rows import INDEX_FORMATS, SWA_FORMATS, index_q_quantize, swa_rope_scatter

__all__ = ["FAMILY", "INDEX_FORMATS", "MODEL_OPS", "SWA_FORMATS", "compressor_pool", "compressor_tail_scatter",
           "index_q_quantize", "swa_rope_scatter", "tail_layout"]
