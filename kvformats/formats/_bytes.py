"""Byte views the format codecs share."""

from __future__ import annotations

import torch


def float_bytes(values: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 ``[n, 4k]``: the little-endian bytes of float32 ``values [n, k]``.

    Flattened before the byte view: a reduction over an empty batch can leave a size-one last dim
    with stride 0 (``[0, 1]``, strides ``(1, 0)``), which ``contiguous()`` keeps (the tensor counts
    as contiguous) and ``view(torch.uint8)`` refuses.
    """
    return values.contiguous().reshape(-1).view(torch.uint8).reshape(n, 4 * values.shape[-1])
