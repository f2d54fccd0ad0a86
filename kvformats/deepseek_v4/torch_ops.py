"""torch.library custom ops for every dispatched operation of ``kvformats.deepseek_v4``, and wrappers
with the Python functions' signatures that always go through them.

    import kvformats.deepseek_v4.torch_ops as dops
    dops.csa_compress_kv_insert(state, kv_cache, positions=pos, ...)   # == dsv4.csa_compress_kv_insert(...)
    torch.ops.kvformats.dsv4_table_slot_mapping(pos, req, table, 64, 1, None, None, "auto", True)
    args = dops.op_arguments("compressed_slot_mapping", num_tokens=8, ...)  # dict, schema order

Op ``kvformats::dsv4_<op>`` for each ``op`` in ``kvformats.deepseek_v4.MODEL_OPS``. Each is derived
from the op's declaration in its module (``kvformats.codec.op.Op``) and defined when that module
is imported; under ``torch.compile`` the public functions themselves go through these ops, so
this module is only needed to call the ops in eager code too. Conventions (as
``kvformats.codec.torch_ops``):

* the schema lists the Python function's parameters in definition order (positional, then
  keyword-only, same names), so every argument is positional at the op level; the real
  implementation calls the public function: same validation, same typed errors, same bytes;
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

from kvformats import deepseek_v4 as dsv4
from kvformats.codec.op import family_tables
from kvformats.codec.torch_library import NAMESPACE
from kvformats.deepseek_v4._dispatch import MODEL_FAMILY
from kvformats.errors import InputError

PREFIX = MODEL_FAMILY.torch_prefix
_DECLARED, SCHEMAS, WRAPPERS, TORCH_OP_NAMES = family_tables(MODEL_FAMILY, dsv4.MODEL_OPS)
globals().update(WRAPPERS)


def op_arguments(name: str, *args, **kwargs) -> dict:
    """The arguments of ``torch.ops.kvformats.dsv4_<name>`` (in schema order) for the call
    ``kvformats.deepseek_v4.<name>(*args, **kwargs)``: defaults filled in, scalar types checked,
    ``out`` workspaces allocated where None."""
    return _DECLARED[name].op_arguments(*args, **kwargs)


def results(name: str, arguments: dict, output):
    """The Python function's return value from the op's ``arguments`` and ``output`` (``q``;
    views of ``out`` workspaces; the nesting of ``prepare_indexer_q_mxfp4``)."""
    return _DECLARED[name].results(arguments, output)


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
__all__ = ["NAMESPACE", "SCHEMAS", "TORCH_OP_NAMES", "op_arguments", "results", *SCHEMAS, "csa_compress_kv_insert",
           "hca_compress_kv_insert"]
