"""DeepSeek V4 attention operations: the pure-torch reference of tokenspeed's op boundary
(spec/upstream.md §4.4-§6), built on the layouts' codecs (``encode_rows`` + row I/O).

    from kvformats import deepseek_v4 as dsv4
    dsv4.save_compressor_state(kv, score, ape, state, ratio=4, positions=pos, slots=state_slots)
    dsv4.csa_compress_kv_insert(state, kv_cache, positions=pos, req_indices=req, state_slots=state_slots,
                                block_table=state_table, rms_weight=w, rms_eps=1e-6,
                                cos_sin_cache=cs, kv_slots=kv_slots, kv_page_size=64)

Every public function validates its arguments first (typed errors, nothing written) and then
calls the implementation registered for its backend under the model op ``("deepseek_v4", op)`` in
``kvformats.codec.registry``; the reference implementations take the validated tensors. Each op
is declared once, in its module (``kvformats.codec.op.Op``): importing this package defines its
``torch.library`` op ``kvformats::dsv4_<op>``, which the public function goes through while
``torch.compile`` traces it. A mapping from every tokenspeed function is in
docs/porting-from-tokenspeed.md.
"""

import warnings

from kvformats.deepseek_v4._dispatch import FAMILY, MODEL_OPS
from kvformats.deepseek_v4.compress import (
    compress_kv_insert,
    csa_compress_kv_insert,
    hca_compress_kv_insert,
    indexer_compress_insert,
    save_compressor_state,
)
from kvformats.deepseek_v4.indices import (
    combine_dense_swa_indices,
    combine_topk_swa_indices,
    compressed_slot_mapping,
    decode_swa_indices_and_lens,
    dense_prefill_local_compressed_indices,
    global_topk_indices_and_lens,
    table_slot_mapping,
)
from kvformats.deepseek_v4.pooling import pool_compressor_state
from kvformats.deepseek_v4.query import inv_rope_fp8_quant, prepare_indexer_q_fp8, prepare_indexer_q_mxfp4
from kvformats.deepseek_v4.swa import swa_insert
from kvformats.deepseek_v4.transforms import cos_sin_cache, hadamard_transform, rms_norm, rope_tail

__all__ = [
    "FAMILY", "MODEL_OPS", "combine_dense_swa_indices", "combine_topk_swa_indices", "compress_kv_insert",
    "compressed_slot_mapping", "cos_sin_cache", "csa_compress_kv_insert", "decode_swa_indices_and_lens",
    "dense_prefill_local_compressed_indices", "global_topk_indices_and_lens", "hadamard_transform",
    "hca_compress_kv_insert", "indexer_compress_insert", "inv_rope_fp8_quant", "pool_compressor_state",
    "prepare_indexer_q_fp8", "prepare_indexer_q_mxfp4", "rms_norm", "rope_tail", "save_compressor_state",
    "swa_insert", "table_slot_mapping",
]


def __getattr__(name: str):
    if name == "OPS":  # MODEL_OPS's former name, kept for one release
        warnings.warn("kvformats.deepseek_v4.OPS is renamed MODEL_OPS", DeprecationWarning, stacklevel=2)
        return MODEL_OPS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
