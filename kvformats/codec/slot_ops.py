"""The codec ops every layout exposes (encode / decode / gather): validate once, dispatch to a
backend, and the reference implementations, generic over formats."""

from __future__ import annotations

import torch

from kvformats.codec import registry
from kvformats.codec.rows import read_rows, write_rows
from kvformats.runtime import deferred, replay
from kvformats.validation import check_cache, check_slots

SLOT_OPS = ("encode", "decode", "gather")


_SITES = {op: deferred.site(op, "slots") for op in SLOT_OPS}


@replay.replayable
def encode(layout, x, cache, slots, *, backend="auto", check=True, **kwargs) -> None:
    """Validate, then quantize rows of ``x`` into ``cache`` at ``slots`` with ``backend``."""
    check_cache(layout, cache)
    n, kwargs = layout.check_encode_input(x, cache.device, **kwargs)
    fn = registry.resolve_for(layout, "encode", backend, cache.device)
    check_slots(layout, slots, n, cache, check_range=check, unique=True, site=_SITES["encode"],
                kernel=registry.is_kernel(fn))
    fn(layout, x, cache, slots, **kwargs)


@replay.replayable
def decode(layout, cache, slots, *, backend="auto", check=True):
    """Validate, then dequantize the rows at ``slots``."""
    check_cache(layout, cache)
    fn = registry.resolve_for(layout, "decode", backend, cache.device)
    check_slots(layout, slots, None, cache, check_range=check, unique=False, site=_SITES["decode"],
                kernel=registry.is_kernel(fn))
    return fn(layout, cache, slots)


@replay.replayable
def gather(layout, cache, slots, *, backend="auto", check=True) -> torch.Tensor:
    """Validate, then copy the encoded rows at ``slots`` -> uint8 ``[N, row_bytes]``."""
    check_cache(layout, cache)
    fn = registry.resolve_for(layout, "gather", backend, cache.device)
    check_slots(layout, slots, None, cache, check_range=check, unique=False, site=_SITES["gather"],
                kernel=registry.is_kernel(fn))
    return fn(layout, cache, slots)


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
