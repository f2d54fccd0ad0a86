"""torch.library custom ops for every registered format, so the codecs drop into compiled code.

    import kvformats.codec.torch_ops as kops          # registers the ops (``import kvformats`` does not)
    kops.encode(layout, x, cache, slots)        # == layout.encode(...), through torch.ops.kvformats
    y = kops.decode(layout, cache, slots)

Ops (namespace ``kvformats``; a layout travels as its name and its parameters as a canonical JSON
string, e.g. ``fmt="fp8_ds_mla", params='{"head_dim":512,...,"profile":"tokenspeed"}'``):

| op | schema (besides ``fmt, params`` first and ``backend, check=True`` last) | mutates |
| --- | --- | --- |
| ``encode`` | ``inputs: Tensor[], cache, slots`` -> () | cache |
| ``decode`` | ``cache, slots`` -> Tensor[] | |
| ``gather`` | ``cache, slots`` -> Tensor | |
| ``decode_topk`` | ``cache, topk_slots`` -> Tensor[] | |
| ``dequantize_gather`` | ``cache, out, block_table, seq_lens, gather_lens?, base?, offset`` -> () | out |
| ``gather_paged`` | ``cache, block_table, cu_seq_lens, out: Tensor[]`` -> () | out |

``inputs`` is ``[x]``, or ``[kv, score, positions, ape]`` for compressor_state (``[kv, score]`` for
compressor_state_v41). Decode-like ops return a list (one tensor; two for the compressor states).
Every op validates and dispatches exactly like the layout method it wraps (same errors, same bytes;
``check`` a bool with the meaning it has there, spec/checks.md; strict mode through
``kvformats.strict_checks()`` or ``KVFORMATS_STRICT=1``); the fake (meta) implementations only
compute output shapes, so ``torch.compile(fullgraph=True)`` traces through them without a graph
break. ``gather_paged`` takes preallocated workspaces (an output whose size depends on
``cu_seq_lens[-1]`` would need a data-dependent shape).

Each op is declared once beside its public function (``kvformats.codec.op.Op`` in
``kvformats.codec.slot_ops`` and ``paged_ops``: sites, op-level arguments, real and fake
implementations); this module defines every op declared in ``CODEC`` (a loop) and exports their
wrappers, which have the public functions' signatures (``gather_paged`` needs ``out=`` or
``num_rows=``). Once it is imported, dynamo traces the public functions themselves (``Layout.encode``
and the rest) as their ops: code that calls them needs no second spelling for compiled code.

The wrappers (``kops.encode(layout, ...)``) compile from torch 2.13 on, where dynamo folds
``layout_key(layout)`` into a constant; torch 2.11 raises there (seen on the GPU host). With an
older torch, compute ``key = kops.layout_key(layout)`` outside the compiled function and call
``torch.ops.kvformats.encode(*key, [x], cache, slots, "auto")`` inside it. The ops are defined
through ``kvformats.codec.torch_library`` (a ``torch.library.Library`` fragment: the eager dispatch is several
times cheaper than ``torch.library.custom_op``'s).
"""

from __future__ import annotations

import functools
import json

import torch

from kvformats.codec import paged_ops, slot_ops  # noqa: F401  (declare the codec ops)
from kvformats.codec.op import CODEC
from kvformats.codec.torch_library import NAMESPACE  # noqa: F401  (the ops' namespace, public)


@torch.compiler.assume_constant_result  # a layout is immutable: dynamo calls this once, eagerly
def layout_key(layout) -> tuple[str, str]:
    """(format name, canonical JSON of its parameters): the op arguments naming ``layout``."""
    return _key(layout)


@functools.lru_cache(maxsize=256)  # json.dumps would dominate an eager wrapper call, which makes the key each time
def _key(layout) -> tuple[str, str]:
    return layout.name, json.dumps(layout.params, sort_keys=True, separators=(",", ":"))


WRAPPERS = {name: op.define_layout_op(layout_key) for name, op in CODEC.declared.items()}
TORCH_OP_NAMES = tuple(op.torch_name for op in CODEC.declared.values())  # torch.ops.kvformats.<name>
globals().update(WRAPPERS)
__all__ = ["NAMESPACE", "TORCH_OP_NAMES", "WRAPPERS", "layout_key", *WRAPPERS]
