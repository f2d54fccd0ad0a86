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
from typing import Callable

import torch

from kvformats.codec import slot_ops as ops
from kvformats.codec.registry import get_format
from kvformats.codec.torch_library import NAMESPACE, check_memories, define, shares_storage  # noqa: F401  (NAMESPACE: the ops' namespace, public)
from kvformats.errors import InputError, InputTypeError


@torch.compiler.assume_constant_result  # a layout is immutable: dynamo calls this once, eagerly
def layout_key(layout) -> tuple[str, str]:
    """(format name, canonical JSON of its parameters): the op arguments naming ``layout``."""
    return _key(layout)


@functools.lru_cache(maxsize=256)  # json.dumps would dominate an eager wrapper call, which makes the key each time
def _key(layout) -> tuple[str, str]:
    return layout.name, json.dumps(layout.params, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=256)
def _layout(fmt: str, params: str):
    return get_format(fmt, **json.loads(params))


def _fresh(out: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``out``, copied if it shares storage with an input (custom-op outputs must not alias)."""
    if out._base is None:  # a tensor of its own, not a view: the common case, without the storage lookups
        for t in inputs:
            if out is t:
                break
        else:
            return out
    return out.clone() if shares_storage(out, inputs) else out


def _as_list(decoded, *inputs) -> list[torch.Tensor]:
    if not isinstance(decoded, tuple):
        return [_fresh(decoded.contiguous(), *inputs)]
    # Several outputs must not alias each other either: compressor_state's (kv, score) are the two
    # halves of one buffer, which contiguous() keeps as views when there are 0 or 1 rows.
    outs: list[torch.Tensor] = []
    for t in decoded:
        t = t.contiguous()
        if shares_storage(t, outs):
            t = t.clone()
        outs.append(_fresh(t, *inputs))
    return outs


def _decoded_like(layout, cache: torch.Tensor, lead: tuple[int, ...]) -> list[torch.Tensor]:
    if layout.decode_dtype is None:  # compressor_state: (kv, score_state) float32
        return [cache.new_empty((*lead, layout.width), dtype=torch.float32) for _ in range(2)]
    return [cache.new_empty((*lead, layout.head_dim), dtype=layout.decode_dtype)]


# ----- encode -----------------------------------------------------------------------------------
def _encode(fmt, params, inputs, cache, slots, backend, check=True):
    layout = _layout(fmt, params)
    if len(inputs) == 1:
        ops.encode(layout, inputs[0], cache, slots, backend=backend, check=check)
    elif len(inputs) == 2 and layout.decode_dtype is None:  # compressor_state_v41 (its encode checks that)
        ops.encode(layout, (inputs[0], inputs[1]), cache, slots, backend=backend, check=check)
    elif len(inputs) == 4:  # compressor_state (its encode checks that the layout is one)
        kv, score, positions, ape = inputs
        ops.encode(layout, (kv, score), cache, slots, backend=backend, check=check, positions=positions, ape=ape)
    else:
        raise InputError(f"kvformats::encode takes inputs [x], [kv, score] or [kv, score, positions, ape], got "
                         f"{len(inputs)} tensors")


def _no_result(*args):
    return None


# ----- decode / gather / decode_topk -------------------------------------------------------------
def _decode(fmt, params, cache, slots, backend, check=True):
    return _as_list(ops.decode(_layout(fmt, params), cache, slots, backend=backend, check=check), cache, slots)


def _decode_fake(fmt, params, cache, slots, backend, check=True):
    return _decoded_like(_layout(fmt, params), cache, (slots.shape[0],))


def _gather(fmt, params, cache, slots, backend, check=True):
    return _fresh(ops.gather(_layout(fmt, params), cache, slots, backend=backend, check=check), cache, slots)


def _gather_fake(fmt, params, cache, slots, backend, check=True):
    return cache.new_empty((slots.shape[0], _layout(fmt, params).row_bytes), dtype=torch.uint8)


def _decode_topk(fmt, params, cache, topk_slots, backend, check=True):
    return _as_list(_layout(fmt, params).decode_topk(cache, topk_slots, backend=backend, check=check),
                    cache, topk_slots)


def _decode_topk_fake(fmt, params, cache, topk_slots, backend, check=True):
    return _decoded_like(_layout(fmt, params), cache, tuple(topk_slots.shape))


# ----- paged ops writing into caller workspaces ----------------------------------------------------
def _dequantize_gather(fmt, params, cache, out, block_table, seq_lens, gather_lens, base, offset, backend, check=True):
    _layout(fmt, params).dequantize_gather(cache, out, block_table=block_table, seq_lens=seq_lens,
                                           gather_lens=gather_lens, block_table_base_offsets=base,
                                           offset=offset, backend=backend, check=check)


def _gather_paged(fmt, params, cache, block_table, cu_seq_lens, out, backend, check=True):
    _layout(fmt, params).gather_paged(cache, block_table=block_table, cu_seq_lens=cu_seq_lens, out=tuple(out),
                                      backend=backend, check=check)


_KEY = "str fmt, str params, "
_TAIL = "str backend, bool check=True"
SCHEMAS: dict[str, tuple[str, Callable, Callable]] = {  # op -> (schema, real implementation, fake)
    "encode": (f"({_KEY}Tensor[] inputs, Tensor(a!) cache, Tensor slots, {_TAIL}) -> ()", _encode, _no_result),
    "decode": (f"({_KEY}Tensor cache, Tensor slots, {_TAIL}) -> Tensor[]", _decode, _decode_fake),
    "gather": (f"({_KEY}Tensor cache, Tensor slots, {_TAIL}) -> Tensor", _gather, _gather_fake),
    "decode_topk": (f"({_KEY}Tensor cache, Tensor topk_slots, {_TAIL}) -> Tensor[]", _decode_topk,
                    _decode_topk_fake),
    "dequantize_gather": (f"({_KEY}Tensor cache, Tensor(a!) out, Tensor block_table, Tensor seq_lens, "
                          f"Tensor? gather_lens, Tensor? base, int offset, {_TAIL}) -> ()", _dequantize_gather,
                          _no_result),
    "gather_paged": (f"({_KEY}Tensor cache, Tensor block_table, Tensor cu_seq_lens, Tensor(a!)[] out, {_TAIL}) -> ()",
                     _gather_paged, _no_result),
}
for _name, (_schema, _real, _fake) in SCHEMAS.items():
    define(_name, _schema, _real, _fake)
TORCH_OP_NAMES = tuple(SCHEMAS)  # torch.ops.kvformats.<name>


# ----- layout-level wrappers ------------------------------------------------------------------------
def encode(layout, x, cache, slots, *, backend: str = "auto", check: bool = True, **kwargs) -> None:
    """``layout.encode`` through ``torch.ops.kvformats.encode`` (compressor_state: x = (kv, score)
    with ``positions=`` and ``ape=``; compressor_state_v41: x = (kv, score) alone)."""
    if isinstance(x, tuple) and not kwargs:
        inputs = [*x]
    else:
        inputs = [*x, kwargs.pop("positions"), kwargs.pop("ape")] if isinstance(x, tuple) else [x]
    if kwargs:
        raise InputTypeError(f"unexpected keyword arguments {sorted(kwargs)}")
    check_memories(x=inputs, cache=cache, slots=slots)
    torch.ops.kvformats.encode(*layout_key(layout), inputs, cache, slots, backend, check)


def _unwrap(layout, out: list[torch.Tensor]):
    return tuple(out) if layout.decode_dtype is None else out[0]


def decode(layout, cache, slots, *, backend: str = "auto", check: bool = True):
    """``layout.decode`` through ``torch.ops.kvformats.decode``."""
    check_memories(cache=cache, slots=slots)
    return _unwrap(layout, torch.ops.kvformats.decode(*layout_key(layout), cache, slots, backend, check))


def gather(layout, cache, slots, *, backend: str = "auto", check: bool = True) -> torch.Tensor:
    """``layout.gather`` through ``torch.ops.kvformats.gather``."""
    check_memories(cache=cache, slots=slots)
    return torch.ops.kvformats.gather(*layout_key(layout), cache, slots, backend, check)


def decode_topk(layout, cache, topk_slots, *, backend: str = "auto", check: bool = True):
    """``layout.decode_topk`` through ``torch.ops.kvformats.decode_topk``."""
    check_memories(cache=cache, topk_slots=topk_slots)
    return _unwrap(layout, torch.ops.kvformats.decode_topk(*layout_key(layout), cache, topk_slots, backend, check))


def dequantize_gather(layout, cache, out, *, block_table, seq_lens, gather_lens=None, block_table_base_offsets=None,
                      offset: int = 0, backend: str = "auto", check: bool = True) -> torch.Tensor:
    """``layout.dequantize_gather`` through ``torch.ops.kvformats.dequantize_gather``; returns ``out``."""
    check_memories(cache=cache, out=out, block_table=block_table, seq_lens=seq_lens, gather_lens=gather_lens,
                   block_table_base_offsets=block_table_base_offsets)
    torch.ops.kvformats.dequantize_gather(*layout_key(layout), cache, out, block_table, seq_lens, gather_lens,
                                          block_table_base_offsets, offset, backend, check)
    return out


def gather_paged(layout, cache, *, block_table, cu_seq_lens, out, backend: str = "auto", check: bool = True) -> tuple:
    """``layout.gather_paged`` into preallocated workspaces ``out`` (one per segment)."""
    check_memories(cache=cache, block_table=block_table, cu_seq_lens=cu_seq_lens, out=out)
    torch.ops.kvformats.gather_paged(*layout_key(layout), cache, block_table, cu_seq_lens, list(out), backend, check)
    return tuple(out)
