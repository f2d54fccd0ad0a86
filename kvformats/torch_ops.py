"""torch.library custom ops for every registered format, so the codecs drop into compiled code.

    import kvformats.torch_ops as kops          # registers the ops (``import kvformats`` does not)
    kops.encode(layout, x, cache, slots)        # == layout.encode(...), through torch.ops.kvformats
    y = kops.decode(layout, cache, slots)

Ops (namespace ``kvformats``; a layout travels as its name and its parameters as a canonical JSON
string, e.g. ``fmt="fp8_ds_mla", params='{"head_dim":512,...,"profile":"tokenspeed"}'``):

| op | schema (besides ``fmt, params``) | mutates |
| --- | --- | --- |
| ``encode`` | ``inputs: Tensor[], cache, slots, backend`` -> () | cache |
| ``decode`` | ``cache, slots, backend`` -> Tensor[] | |
| ``gather`` | ``cache, slots, backend`` -> Tensor | |
| ``decode_topk`` | ``cache, topk_slots, backend`` -> Tensor[] | |
| ``dequantize_gather`` | ``cache, out, block_table, seq_lens, gather_lens?, base?, offset, backend`` -> () | out |
| ``gather_paged`` | ``cache, block_table, cu_seq_lens, out: Tensor[], backend`` -> () | out |

``inputs`` is ``[x]``, or ``[kv, score, positions, ape]`` for compressor_state. Decode-like ops
return a list (one tensor; two for compressor_state). Every op validates and dispatches exactly
like the layout method it wraps (same errors, same bytes, ``check=True``); the fake (meta)
implementations only compute output shapes, so ``torch.compile(fullgraph=True)`` traces through
them without a graph break. ``gather_paged`` takes preallocated workspaces (an output whose size
depends on ``cu_seq_lens[-1]`` would need a data-dependent shape).

The wrappers (``kops.encode(layout, ...)``) compile from torch 2.13 on, where dynamo folds
``layout_key(layout)`` into a constant; torch 2.11 raises there (seen on the GPU host). With an
older torch, compute ``key = kops.layout_key(layout)`` outside the compiled function and call
``torch.ops.kvformats.encode(*key, [x], cache, slots, "auto")`` inside it.
"""

from __future__ import annotations

import functools
import json

import torch

from kvformats.registry import get_format

NAMESPACE = "kvformats"
OPS = ("encode", "decode", "gather", "decode_topk", "dequantize_gather", "gather_paged")


@torch.compiler.assume_constant_result  # a layout is immutable: dynamo calls this once, eagerly
def layout_key(layout) -> tuple[str, str]:
    """(format name, canonical JSON of its parameters): the op arguments naming ``layout``."""
    return layout.name, json.dumps(layout.params, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=256)
def _layout(fmt: str, params: str):
    return get_format(fmt, **json.loads(params))


def _fresh(out: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``out``, copied if it shares storage with an input (custom-op outputs must not alias)."""
    ptr = out.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() == ptr for t in inputs):
        return out.clone()
    return out


def _as_list(decoded, *inputs) -> list[torch.Tensor]:
    items = decoded if isinstance(decoded, tuple) else (decoded,)
    return [_fresh(t.contiguous(), *inputs) for t in items]


def _decoded_like(layout, cache: torch.Tensor, lead: tuple[int, ...]) -> list[torch.Tensor]:
    if layout.decode_dtype is None:  # compressor_state: (kv, score_state) float32
        return [cache.new_empty((*lead, layout.width), dtype=torch.float32) for _ in range(2)]
    return [cache.new_empty((*lead, layout.head_dim), dtype=layout.decode_dtype)]


# ----- encode -----------------------------------------------------------------------------------
@torch.library.custom_op(f"{NAMESPACE}::encode", mutates_args=("cache",))
def _encode(fmt: str, params: str, inputs: list[torch.Tensor], cache: torch.Tensor, slots: torch.Tensor,
            backend: str) -> None:
    layout = _layout(fmt, params)
    if layout.decode_dtype is None:
        kv, score, positions, ape = inputs
        layout.encode((kv, score), cache, slots, backend=backend, positions=positions, ape=ape)
    else:
        layout.encode(inputs[0], cache, slots, backend=backend)


@_encode.register_fake
def _(fmt, params, inputs, cache, slots, backend):
    return None


# ----- decode / gather / decode_topk -------------------------------------------------------------
@torch.library.custom_op(f"{NAMESPACE}::decode", mutates_args=())
def _decode(fmt: str, params: str, cache: torch.Tensor, slots: torch.Tensor, backend: str) -> list[torch.Tensor]:
    return _as_list(_layout(fmt, params).decode(cache, slots, backend=backend), cache, slots)


@_decode.register_fake
def _(fmt, params, cache, slots, backend):
    return _decoded_like(_layout(fmt, params), cache, (slots.shape[0],))


@torch.library.custom_op(f"{NAMESPACE}::gather", mutates_args=())
def _gather(fmt: str, params: str, cache: torch.Tensor, slots: torch.Tensor, backend: str) -> torch.Tensor:
    return _fresh(_layout(fmt, params).gather(cache, slots, backend=backend), cache, slots)


@_gather.register_fake
def _(fmt, params, cache, slots, backend):
    return cache.new_empty((slots.shape[0], _layout(fmt, params).row_bytes), dtype=torch.uint8)


@torch.library.custom_op(f"{NAMESPACE}::decode_topk", mutates_args=())
def _decode_topk(fmt: str, params: str, cache: torch.Tensor, topk_slots: torch.Tensor,
                 backend: str) -> list[torch.Tensor]:
    return _as_list(_layout(fmt, params).decode_topk(cache, topk_slots, backend=backend), cache, topk_slots)


@_decode_topk.register_fake
def _(fmt, params, cache, topk_slots, backend):
    return _decoded_like(_layout(fmt, params), cache, tuple(topk_slots.shape))


# ----- paged ops writing into caller workspaces ----------------------------------------------------
@torch.library.custom_op(f"{NAMESPACE}::dequantize_gather", mutates_args=("out",))
def _dequantize_gather(fmt: str, params: str, cache: torch.Tensor, out: torch.Tensor, block_table: torch.Tensor,
                       seq_lens: torch.Tensor, gather_lens: torch.Tensor | None, base: torch.Tensor | None,
                       offset: int, backend: str) -> None:
    _layout(fmt, params).dequantize_gather(cache, out, block_table=block_table, seq_lens=seq_lens,
                                           gather_lens=gather_lens, block_table_base_offsets=base,
                                           offset=offset, backend=backend)


@_dequantize_gather.register_fake
def _(fmt, params, cache, out, block_table, seq_lens, gather_lens, base, offset, backend):
    return None


@torch.library.custom_op(f"{NAMESPACE}::gather_paged", mutates_args=("out",))
def _gather_paged(fmt: str, params: str, cache: torch.Tensor, block_table: torch.Tensor,
                  cu_seq_lens: torch.Tensor, out: list[torch.Tensor], backend: str) -> None:
    _layout(fmt, params).gather_paged(cache, block_table=block_table, cu_seq_lens=cu_seq_lens, out=tuple(out),
                                      backend=backend)


@_gather_paged.register_fake
def _(fmt, params, cache, block_table, cu_seq_lens, out, backend):
    return None


# ----- layout-level wrappers ------------------------------------------------------------------------
def encode(layout, x, cache, slots, *, backend: str = "auto", **kwargs) -> None:
    """``layout.encode`` through ``torch.ops.kvformats.encode`` (compressor_state: x = (kv, score)
    with ``positions=`` and ``ape=``)."""
    inputs = [*x, kwargs.pop("positions"), kwargs.pop("ape")] if isinstance(x, tuple) else [x]
    if kwargs:
        raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
    torch.ops.kvformats.encode(*layout_key(layout), inputs, cache, slots, backend)


def _unwrap(layout, out: list[torch.Tensor]):
    return tuple(out) if layout.decode_dtype is None else out[0]


def decode(layout, cache, slots, *, backend: str = "auto"):
    """``layout.decode`` through ``torch.ops.kvformats.decode``."""
    return _unwrap(layout, torch.ops.kvformats.decode(*layout_key(layout), cache, slots, backend))


def gather(layout, cache, slots, *, backend: str = "auto") -> torch.Tensor:
    """``layout.gather`` through ``torch.ops.kvformats.gather``."""
    return torch.ops.kvformats.gather(*layout_key(layout), cache, slots, backend)


def decode_topk(layout, cache, topk_slots, *, backend: str = "auto"):
    """``layout.decode_topk`` through ``torch.ops.kvformats.decode_topk``."""
    return _unwrap(layout, torch.ops.kvformats.decode_topk(*layout_key(layout), cache, topk_slots, backend))


def dequantize_gather(layout, cache, out, *, block_table, seq_lens, gather_lens=None, block_table_base_offsets=None,
                      offset: int = 0, backend: str = "auto") -> torch.Tensor:
    """``layout.dequantize_gather`` through ``torch.ops.kvformats.dequantize_gather``; returns ``out``."""
    torch.ops.kvformats.dequantize_gather(*layout_key(layout), cache, out, block_table, seq_lens, gather_lens,
                                          block_table_base_offsets, offset, backend)
    return out


def gather_paged(layout, cache, *, block_table, cu_seq_lens, out, backend: str = "auto") -> tuple:
    """``layout.gather_paged`` into preallocated workspaces ``out`` (one per segment)."""
    torch.ops.kvformats.gather_paged(*layout_key(layout), cache, block_table, cu_seq_lens, list(out), backend)
    return tuple(out)
