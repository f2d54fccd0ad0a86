"""The codec ops every layout exposes (encode / decode / gather): validate once, dispatch to a
backend, and the reference implementations, generic over formats.

Each is declared once (``kvformats.codec.op.Op`` in ``CODEC``): its record site, its public
function, the arguments of its torch op ``kvformats::<name>`` (a layout as ``str fmt, str params``)
and that op's real and fake implementations. ``kvformats.codec.torch_ops`` defines the ops."""

from __future__ import annotations

import torch

from kvformats.codec import registry
from kvformats.codec.op import CODEC, Op
from kvformats.codec.rows import read_rows, write_rows
from kvformats.codec.torch_library import as_list, decoded, decoded_like, layout_of, unaliased
from kvformats.errors import InputError, InputTypeError
from kvformats.validation import check_cache, check_slots

SLOT_OPS = ("encode", "decode", "gather")


ENCODE = Op(CODEC, "encode", mutates=("cache",), sites=("slots",), public_names={"inputs": "x"})
DECODE = Op(CODEC, "decode", sites=("slots",), result=decoded,
            fake=lambda fmt, params, cache, slots, *_: decoded_like(layout_of(fmt, params), cache, (slots.shape[0],)))
GATHER = Op(CODEC, "gather", sites=("slots",), fake=lambda fmt, params, cache, slots, *_: cache.new_empty(
    (slots.shape[0], layout_of(fmt, params).row_bytes), dtype=torch.uint8))
_ENCODE_SITE, _DECODE_SITE, _GATHER_SITE = ENCODE.site("slots"), DECODE.site("slots"), GATHER.site("slots")


# ----- encode -----------------------------------------------------------------------------------
@ENCODE.layout_public
def encode(layout, x, cache, slots, *, backend="auto", check=True, **kwargs) -> None:
    """Validate, then quantize rows of ``x`` into ``cache`` at ``slots`` with ``backend``."""
    check_cache(layout, cache)
    n, kwargs = layout.check_encode_input(x, cache.device, **kwargs)
    fn = registry.resolve_for(layout, "encode", backend, cache.device)
    check_slots(layout, slots, n, cache, check_range=check, unique=True, site=_ENCODE_SITE,
                kernel=registry.is_kernel(fn))
    fn(layout, x, cache, slots, **kwargs)


@ENCODE.lowering
def _encode_arguments(layout, x, cache, slots, *, backend="auto", check=True, **kwargs) -> tuple:
    """``inputs`` is ``[x]``, or ``[kv, score, positions, ape]`` for compressor_state (x = (kv,
    score) with ``positions=`` and ``ape=``), ``[kv, score]`` for compressor_state_v41."""
    if isinstance(x, tuple) and not kwargs:
        inputs = [*x]
    else:
        inputs = [*x, kwargs.pop("positions"), kwargs.pop("ape")] if isinstance(x, tuple) else [x]
    if kwargs:
        raise InputTypeError(f"unexpected keyword arguments {sorted(kwargs)}")
    return inputs, cache, slots, backend, check


@ENCODE.op_level
def _encode(fmt: str, params: str, inputs: list[torch.Tensor], cache: torch.Tensor, slots: torch.Tensor,
            backend: str, check: bool = True) -> None:
    layout = layout_of(fmt, params)
    if len(inputs) == 1:
        encode(layout, inputs[0], cache, slots, backend=backend, check=check)
    elif len(inputs) == 2 and layout.decode_dtype is None:  # compressor_state_v41 (its encode checks that)
        encode(layout, (inputs[0], inputs[1]), cache, slots, backend=backend, check=check)
    elif len(inputs) == 4:  # compressor_state (its encode checks that the layout is one)
        kv, score, positions, ape = inputs
        encode(layout, (kv, score), cache, slots, backend=backend, check=check, positions=positions, ape=ape)
    else:
        raise InputError(f"kvformats::encode takes inputs [x], [kv, score] or [kv, score, positions, ape], got "
                         f"{len(inputs)} tensors")


# ----- decode -----------------------------------------------------------------------------------
@DECODE.layout_public
def decode(layout, cache, slots, *, backend="auto", check=True):
    """Validate, then dequantize the rows at ``slots``."""
    check_cache(layout, cache)
    fn = registry.resolve_for(layout, "decode", backend, cache.device)
    check_slots(layout, slots, None, cache, check_range=check, unique=False, site=_DECODE_SITE,
                kernel=registry.is_kernel(fn))
    return fn(layout, cache, slots)


@DECODE.lowering
def _decode_arguments(layout, cache, slots, *, backend="auto", check=True) -> tuple:
    return cache, slots, backend, check


@DECODE.op_level
def _decode(fmt: str, params: str, cache: torch.Tensor, slots: torch.Tensor, backend: str,
            check: bool = True) -> list[torch.Tensor]:
    return as_list(decode(layout_of(fmt, params), cache, slots, backend=backend, check=check), cache, slots)


# ----- gather -----------------------------------------------------------------------------------
@GATHER.layout_public
def gather(layout, cache, slots, *, backend="auto", check=True) -> torch.Tensor:
    """Validate, then copy the encoded rows at ``slots`` -> uint8 ``[N, row_bytes]``."""
    check_cache(layout, cache)
    fn = registry.resolve_for(layout, "gather", backend, cache.device)
    check_slots(layout, slots, None, cache, check_range=check, unique=False, site=_GATHER_SITE,
                kernel=registry.is_kernel(fn))
    return fn(layout, cache, slots)


GATHER.lowering(_decode_arguments)


@GATHER.op_level
def _gather(fmt: str, params: str, cache: torch.Tensor, slots: torch.Tensor, backend: str,
            check: bool = True) -> torch.Tensor:
    return unaliased(gather(layout_of(fmt, params), cache, slots, backend=backend, check=check), cache, slots)


def encode_reference(layout, x, cache, slots, **kwargs) -> None:
    write_rows(layout, cache, slots, layout.encode_rows(x, **kwargs))


def decode_reference(layout, cache, slots):
    return layout.decode_rows(read_rows(layout, cache, slots))


def gather_reference(layout, cache, slots):
    return read_rows(layout, cache, slots)


def register_reference_ops(fmt: str) -> None:
    """Register the generic reference encode/decode/gather and paged ops for format ``fmt``."""
    from kvformats.codec.paged_ops import register_reference_paged_ops

    for op, fn in zip(SLOT_OPS, (encode_reference, decode_reference, gather_reference)):
        registry.register_op(fmt, op, "reference")(fn)
    register_reference_paged_ops(fmt)
