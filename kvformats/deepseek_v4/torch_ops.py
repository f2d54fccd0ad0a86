"""torch.library custom ops for every dispatched operation of ``kvformats.deepseek_v4``.

    import kvformats.deepseek_v4.torch_ops as dops   # registers the ops (``import kvformats.deepseek_v4`` does not)
    dops.csa_compress_kv_insert(state, kv_cache, positions=pos, ...)   # == dsv4.csa_compress_kv_insert(...)
    torch.ops.kvformats.dsv4_table_slot_mapping(pos, req, table, 64, 1, None, None, "auto", True)
    args = dops.op_arguments("compressed_slot_mapping", num_tokens=8, ...)  # dict, schema order

Op ``kvformats::dsv4_<op>`` for each ``op`` in ``kvformats.deepseek_v4.MODEL_OPS``; its schema lists the
Python function's parameters in definition order (positional, then keyword-only, same names), so
every argument is positional at the op level. The real implementation calls the public function:
same validation, same typed errors, same bytes (the ops and wrappers are built by
``kvformats.codec.torch_library.ModelOps``). Conventions (as ``kvformats.codec.torch_ops``):

* caches and ``q`` written in place are declared mutated (``Tensor(a!)``) and the op returns
  ``()``; so do the index helpers with ``out=`` workspaces, whose ``out`` arguments are required
  at the op level (the wrappers allocate result-sized ones where the caller passes None: an
  optional mutated argument passed as None breaks inductor's lowering in torch 2.13);
* outputs never alias inputs or each other and are contiguous, except ``inv_rope_fp8_quant``'s,
  which keep the documented DeepGEMM views (of two buffers the op allocates);
* nested results are flattened (``prepare_indexer_q_mxfp4`` -> 3 tensors; the wrapper re-nests);
* fake (meta) implementations compute shapes, dtypes and strides only, so ``torch.compile(
  fullgraph=True)`` traces through without a graph break. Checks that read values run when the op
  really runs (inside a compiled graph too).

The module-level functions (``save_compressor_state``, ``compress_kv_insert``, ...,
``csa_compress_kv_insert``, ``hca_compress_kv_insert``) have the signatures, defaults and return
values of their ``kvformats.deepseek_v4`` namesakes and go through the ops (``op_arguments`` ->
op -> ``results``). ``rope_tail``, ``rms_norm`` and ``cos_sin_cache`` are plain torch arithmetic
without dispatch: torch.compile traces them directly, so they have no op.
"""

from __future__ import annotations

import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.codec.torch_library import NAMESPACE, ModelOps, rows
from kvformats.deepseek_v4.indices import ALIGN, round_up
from kvformats.errors import InputError

PREFIX = "dsv4_"

# Argument lists of the schemas (-> returns), in the Python functions' parameter order.
_WINDOW_ARGS = "Tensor positions, Tensor req_indices, Tensor state_slots, Tensor block_table, Tensor rms_weight, " \
               "float rms_eps, Tensor cos_sin_cache"
_Q_ARGS = "Tensor index_q, Tensor positions, Tensor cos_sin_cache, Tensor weights, float softmax_scale, " \
          "float head_scale, str backend, bool check"
SCHEMAS = {
    # transforms and pooling
    "hadamard_transform": ("Tensor x, float? scale, str backend, bool check", "Tensor"),
    "pool_compressor_state": ("Tensor state_cache, int ratio, Tensor positions, Tensor req_indices, "
                              "Tensor block_table, Tensor rms_weight, float rms_eps, "
                              "Tensor? block_table_base_offsets, str backend, bool check", "Tensor"),
    # cache writers
    "save_compressor_state": ("Tensor kv, Tensor score, Tensor ape, Tensor(a!) state_cache, int ratio, "
                              "Tensor positions, Tensor? slots, Tensor? req_indices, Tensor? block_table, "
                              "Tensor? block_table_base_offsets, str backend, bool check", "()"),
    "compress_kv_insert": ("Tensor state_cache, Tensor(a!) kv_cache, int ratio, " + _WINDOW_ARGS +
                           ", Tensor kv_slots, int kv_page_size, Tensor? block_table_base_offsets, str backend, "
                           "bool check", "()"),
    "indexer_compress_insert": ("Tensor state_cache, Tensor(a!) index_cache, str index_format, " + _WINDOW_ARGS +
                                ", Tensor index_slots, int index_page_size, int ratio, "
                                "Tensor? block_table_base_offsets, str backend, bool check", "()"),
    "swa_insert": ("Tensor(a!) q, Tensor kv, Tensor(b!) kv_cache, Tensor slots, Tensor positions, "
                   "Tensor cos_sin_cache, float rms_eps, int page_size, str backend, bool check", "()"),
    # query / output transforms
    "prepare_indexer_q_mxfp4": (_Q_ARGS, "(Tensor, Tensor, Tensor)"),
    "prepare_indexer_q_fp8": (_Q_ARGS, "(Tensor, Tensor)"),
    "inv_rope_fp8_quant": ("Tensor o, Tensor positions, Tensor cos_sin_cache, int n_groups, int heads_per_group, "
                           "int quant_group_size, bool tma_aligned_scales, str backend, bool check",
                           "(Tensor, Tensor)"),
    # index helpers
    "table_slot_mapping": ("Tensor positions, Tensor req_indices, Tensor block_table, int page_size, "
                           "int entry_stride, Tensor? block_table_base_offsets, Tensor? is_valid_token, "
                           "str backend, bool check", "Tensor"),
    "compressed_slot_mapping": ("int num_tokens, Tensor query_start_loc, Tensor seq_lens, Tensor block_table, "
                                "int page_size, int ratio, Tensor? block_table_base_offsets, Tensor(a!) out, "
                                "str backend, bool check", "()"),
    "global_topk_indices_and_lens": ("Tensor topk_indices, Tensor req_indices, Tensor block_table, int page_size, "
                                     "Tensor? is_valid_token, str backend, bool check", "(Tensor, Tensor)"),
    "combine_topk_swa_indices": ("Tensor topk_indices, Tensor query_start_loc, Tensor seq_lens, "
                                 "Tensor gather_lens, int window_size, int ratio, int topk, int workspace_width, "
                                 "int compressed_base, str backend, bool check", "(Tensor, Tensor)"),
    "combine_dense_swa_indices": ("Tensor positions, Tensor req_indices, Tensor seq_lens, Tensor compressed_lens, "
                                  "Tensor gather_lens, int window_size, int ratio, int workspace_width, "
                                  "int compressed_base, str backend, bool check", "(Tensor, Tensor)"),
    "decode_swa_indices_and_lens": ("Tensor query_start_loc, Tensor seq_lens, Tensor req_indices, "
                                    "Tensor block_table, int window_size, int page_size, "
                                    "Tensor? block_table_base_offsets, Tensor? is_valid_token, "
                                    "Tensor(a!) out_indices, Tensor(b!) out_lens, str backend, bool check", "()"),
    "dense_prefill_local_compressed_indices": ("Tensor positions, int ratio, int width, Tensor(a!) out, "
                                               "str backend, bool check", "()"),
}
KEEP_LAYOUT = {"inv_rope_fp8_quant"}  # outputs are documented strided views of fresh buffers


# ----- fakes: shapes, dtypes and strides only ------------------------------------------------------
def _i32(like, *shape):
    return like.new_empty(shape, dtype=torch.int32)


def _fake_inv_rope(o, positions, cos_sin, n_groups, heads_per_group, group, tma_aligned, *_):
    t, _, d = o.shape
    q = o.new_empty((n_groups, t, heads_per_group * d), dtype=torch.float8_e4m3fn).transpose(0, 1)
    per_group = heads_per_group * (1 if tma_aligned else d // group)
    store = o.new_empty((n_groups, per_group, round_up(t, 4)), dtype=torch.int32 if tma_aligned else torch.float32)
    return q, store.permute(2, 0, 1)[:t]


def _fake_weights(index_q):
    return index_q.new_empty(index_q.shape[:2], dtype=torch.float32)


FAKES = {
    "hadamard_transform": lambda x, *_: x.new_empty(x.shape, dtype=torch.bfloat16),
    "pool_compressor_state": lambda state, ratio, positions, req, table, weight, *_:
        state.new_empty((positions.shape[0], weight.shape[0]), dtype=torch.float32),
    "save_compressor_state": lambda *_: None,
    "compress_kv_insert": lambda *_: None,
    "indexer_compress_insert": lambda *_: None,
    "swa_insert": lambda *_: None,
    "prepare_indexer_q_mxfp4": lambda index_q, *_: (
        index_q.new_empty((*index_q.shape[:2], index_q.shape[2] // 2), dtype=torch.uint8),
        _i32(index_q, *index_q.shape[:2]), _fake_weights(index_q)),
    "prepare_indexer_q_fp8": lambda index_q, *_: (
        index_q.new_empty(index_q.shape, dtype=torch.float8_e4m3fn), _fake_weights(index_q)),
    "inv_rope_fp8_quant": _fake_inv_rope,
    "table_slot_mapping": lambda positions, *_: positions.new_empty(positions.shape, dtype=torch.int64),
    "global_topk_indices_and_lens": lambda topk, *_: (_i32(topk, *topk.shape), _i32(topk, topk.shape[0])),
    "combine_topk_swa_indices": lambda topk_idx, qsl, sl, gl, window, ratio, topk, *_: (
        _i32(topk_idx, topk_idx.shape[0], round_up(topk + window, ALIGN)), _i32(topk_idx, topk_idx.shape[0])),
    "combine_dense_swa_indices": lambda pos, req, sl, cl, gl, window, ratio, ww, cb, *_: (
        _i32(pos, pos.shape[0], round_up(max(cb + window, 1), ALIGN)), _i32(pos, pos.shape[0])),
    "compressed_slot_mapping": lambda *_: None,
    "decode_swa_indices_and_lens": lambda *_: None,
    "dense_prefill_local_compressed_indices": lambda *_: None,
}


# ----- wrappers with the signatures of kvformats.deepseek_v4 ---------------------------------------
WORKSPACES = {  # out= arguments the wrappers allocate when None (exactly the size of the result)
    "compressed_slot_mapping": lambda v: dict(
        out=v["block_table"].new_empty(max(v["num_tokens"], 0), dtype=torch.int64)),
    "decode_swa_indices_and_lens": lambda v: dict(
        out_indices=_i32(v["req_indices"], rows(v["req_indices"]), max(v["window_size"], 0)),
        out_lens=_i32(v["req_indices"], rows(v["req_indices"]))),
    "dense_prefill_local_compressed_indices": lambda v: dict(
        out=_i32(v["positions"], rows(v["positions"]), max(v["width"], 0))),
}


def results(name: str, arguments: dict, output):
    """The Python function's return value from the op's ``output`` (``q``; views of ``out``
    workspaces; the nesting of ``prepare_indexer_q_mxfp4``)."""
    a = arguments
    if name == "swa_insert":
        return a["q"]
    if name == "prepare_indexer_q_mxfp4":
        return (output[0], output[1]), output[2]
    if name == "compressed_slot_mapping":
        return a["out"][:a["num_tokens"]]
    if name == "dense_prefill_local_compressed_indices":
        return a["out"][:a["positions"].shape[0], :a["width"]]
    if name == "decode_swa_indices_and_lens":
        n = a["req_indices"].shape[0]
        return a["out_indices"][:n], a["out_lens"][:n]
    return output


# Defines the ops (real implementations: the public functions) and builds the wrappers.
_OPS = ModelOps(dsv4, PREFIX, SCHEMAS, FAKES, results, workspaces=WORKSPACES, keep_layout=KEEP_LAYOUT)


def op_arguments(name: str, *args, **kwargs) -> dict:
    """The arguments of ``torch.ops.kvformats.dsv4_<name>`` (in schema order) for the call
    ``kvformats.deepseek_v4.<name>(*args, **kwargs)``: defaults filled in, scalar types checked,
    ``out`` workspaces allocated where None."""
    return _OPS.op_arguments(name, *args, **kwargs)


WRAPPERS = _OPS.wrappers
globals().update(WRAPPERS)


def _fixed_ratio(label: str, fixed: int):
    def insert(state_cache, kv_cache, **kwargs) -> None:
        ratio = kwargs.pop("ratio", fixed)
        if ratio != fixed:
            raise InputError(f"{label} compress insert requires ratio {fixed}, got {ratio!r}")
        WRAPPERS["compress_kv_insert"](state_cache, kv_cache, ratio=fixed, **kwargs)

    insert.__name__ = insert.__qualname__ = f"{label.lower()}_compress_kv_insert"
    insert.__doc__ = getattr(dsv4, insert.__name__).__doc__
    return insert


csa_compress_kv_insert = _fixed_ratio("CSA", 4)
hca_compress_kv_insert = _fixed_ratio("HCA", 128)
TORCH_OP_NAMES = _OPS.op_names
__all__ = ["NAMESPACE", "SCHEMAS", "TORCH_OP_NAMES", "op_arguments", "results", *SCHEMAS, "csa_compress_kv_insert",
           "hca_compress_kv_insert"]
