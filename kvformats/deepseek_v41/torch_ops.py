"""torch.library custom ops for every dispatched operation of ``kvformats.deepseek_v41``.

    import kvformats.deepseek_v41.torch_ops as d41ops
    d41ops.swa_rope_scatter(values, positions, cos_sin, cache, slots)   # == dsv41.swa_rope_scatter(...)
    torch.ops.kvformats.dsv41_compressor_tail_scatter(content, scores, tail, slots, "auto", True)
    args = d41ops.op_arguments("compressor_pool", content, scores, tail, previous=prev, ...)  # dict, schema order

Op ``kvformats::dsv41_<op>`` for each ``op`` in ``kvformats.deepseek_v41.MODEL_OPS``. Each is derived
from the op's declaration in its module (``kvformats.codec.op.Op``) and defined when that module
is imported; under ``torch.compile`` the public functions themselves go through these ops, so
this module is only needed to call the ops in eager code too. The schema lists the Python
function's parameters in definition order (positional, then keyword-only, same names), so every
argument is positional at the op level. The real implementation calls the public function: same
validation, same typed errors, same bytes. Conventions (those of ``kvformats.deepseek_v4.torch_ops``):

* every op writes in place and returns ``()``: the caches (``cache``, ``tail``) and ``out`` are
  declared mutated (``Tensor(a!)``);
* ``index_q_quantize`` and ``compressor_pool`` return ``out``, a new tensor when the caller passes
  None. An op's outputs may not alias its inputs, so the op cannot hand back the caller's ``out``:
  ``out`` is required at the op level and, as for the V4 index helpers, the wrappers allocate the
  tensor the function would (q's shape, bf16; ``[N, 512]`` float32, or bf16 with
  ``norm_weight``) where the caller passes None;
* ``swa_rope_scatter``'s ``out`` stays optional (``Tensor(b!)?``): None there means "no round
  trip", which the function then skips, and it returns ``out`` as given (None included), so
  nothing has to come back from the op. A None ``out`` traces and compiles (aot_eager and
  inductor, torch 2.13: tests/interop/test_dsv41_torch_ops.py);
* fake (meta) implementations compute nothing (no op returns a tensor), so ``torch.compile(
  fullgraph=True)`` traces through without a graph break. Checks that read values run when the op
  really runs (inside a compiled graph too).

The module-level functions (``swa_rope_scatter``, ``index_q_quantize``, ``compressor_tail_scatter``,
``compressor_pool``) have the signatures, defaults and return values of their
``kvformats.deepseek_v41`` namesakes and go through the ops (``op_arguments`` -> op -> ``results``);
``check="strict"`` (a bool in the schema) runs the op inside ``kvformats.strict_checks()``.
``tail_layout`` builds a layout and dispatches nothing, so it has no op.
"""

from __future__ import annotations

from kvformats import deepseek_v41 as dsv41
from kvformats.codec.op import family_tables
from kvformats.codec.torch_library import NAMESPACE
from kvformats.deepseek_v41._dispatch import MODEL_FAMILY

PREFIX = MODEL_FAMILY.torch_prefix
_DECLARED, SCHEMAS, WRAPPERS, TORCH_OP_NAMES = family_tables(MODEL_FAMILY, dsv41.MODEL_OPS)
globals().update(WRAPPERS)


def op_arguments(name: str, *args, **kwargs) -> dict:
    """The arguments of ``torch.ops.kvformats.dsv41_<name>`` (in schema order) for the call
    ``kvformats.deepseek_v41.<name>(*args, **kwargs)``: defaults filled in, scalar types checked,
    ``out`` workspaces allocated where None (``index_q_quantize``, ``compressor_pool``)."""
    return _DECLARED[name].op_arguments(*args, **kwargs)


def results(name: str, arguments: dict, output):
    """The Python function's return value from the op's arguments: ``out`` (the workspace the
    wrapper allocated, or the caller's, None included for ``swa_rope_scatter``), or None for
    ``compressor_tail_scatter``. ``output`` is the op's (always None: every op returns ``()``)."""
    return _DECLARED[name].results(arguments, output)


__all__ = ["NAMESPACE", "SCHEMAS", "TORCH_OP_NAMES", "op_arguments", "results", *SCHEMAS]
