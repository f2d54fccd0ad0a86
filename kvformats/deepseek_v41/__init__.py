"""DeepSeek V4.1 model ops: the operations that fill V4.1's caches (tokenspeed-kernel 0.1.4's
``swa_rope_scatter``, ``compressor_pool``, ``compressor_tail_scatter``, ``index_q_quantize``),
as a pure-torch reference and Triton kernels, on kvformats' V4.1 layouts.

    from kvformats import deepseek_v41 as dsv41

Every public function validates its arguments first (typed errors, nothing written) and then
calls the implementation registered for its backend under the model op ``("deepseek_v41", op)``
in ``kvformats.codec.registry``.
"""

from kvformats.deepseek_v41._dispatch import FAMILY, MODEL_OPS

from kvformats.deepseek_v41 import compressor, rows  # registers the references

__all__ = ["FAMILY", "MODEL_OPS"]
