"""tokenspeed-kernel 0.1.4's DeepSeek V4.1 compressor ops (``tokenspeed_kernel.ops.attention.dsv41``;
PyPI, https://github.com/lightseekorg/tokenspeed) under their own names and parameters, on
kvformats' model ops ``kvformats.deepseek_v41.compressor``:

    # from tokenspeed_kernel.ops.attention.dsv41 import compressor_pool, compressor_tail_scatter
    from kvformats.compat.tokenspeed_kernel.dsv41 import compressor_pool, compressor_tail_scatter

``compressor_tail_scatter(content, scores, tail, slots)`` stores row t of the float32 ``content``
/ ``scores [T, 512]`` in the float32 ``tail [pages, 2, 2, 512]`` (page, token, content / score,
channel) at slot ``slots[t]`` = page * 2 + token, in place, and returns None; negative and
out-of-capacity slots write nothing. ``compressor_pool(content, scores, previous, tail,
tail_slots, active, out, norm_weight, norm_eps)`` pools each active row with its predecessor
(input row ``previous[t]``, or with ``previous[t] < 0`` the tail row at ``tail_slots[t]``, page 0
being the null page) by a per-channel softmax of the two scores, optionally RMS-normalised, into
``out`` (float32 ``[T, 512]``, bf16 with ``norm_weight``; None allocates it) and returns it;
inactive rows are 0. Every parameter is positional as there, none has a default.

The tail is kvformats' ``compressor_state_v41`` cache at ``head_dim=512, page_size=2`` (the same
bytes: each token row ``[content 512 | score 512]``). Each call validates everything before
anything is written (typed errors, all ``ValueError``: ``InputError``, ``InputTypeError``,
``LayoutError``). Values: ``compressor_tail_scatter`` stores tokenspeed's bytes; on the GPU
``compressor_pool`` without ``norm_weight`` gives tokenspeed's bits (the same float32 operations in
the same order, libdevice ``expf``); docs/reference/deepseek_v41.md gives the numerics. Where
kvformats departs:

* CPU tensors run (tokenspeed's kernels take CUDA / ROCm tensors only), through the torch
  reference: its exp is torch's CPU exp, so float32 results can differ from a GPU's in the last
  bits (within 8 ulps of ``|c0 * w0| + |c1 * w1|``).
* with ``norm_weight``, the RMS sum of squares adds adjacent pairs (nine levels, a fixed order;
  tokenspeed: the order of Triton's ``tl.sum``): a bf16 output can be one code apart from
  tokenspeed's on a row whose two sums differ in their last bit (on an H100: 13 of 16384 rows).
  ``norm_eps`` below 2^-126 (a subnormal float32): ``InputError`` (tokenspeed takes any positive
  value; the GPU's rsqrt and torch's differ on subnormal arguments).
* a tail whose rows are not contiguous (strides other than ``[page, 1024, 512, 1]``, any page
  stride): ``LayoutError`` (tokenspeed maps any strides). ``norm_weight`` may have any stride
  (tokenspeed reads it as contiguous) and must be bf16, fp16 or fp32 (``InputTypeError``).
* ``out`` (any non-overlapping strides, as there) must share no bytes with any input:
  ``InputError`` (tokenspeed refuses one in the storage of ``content``, ``scores`` or ``tail``,
  overlapping or not). ``content`` or ``scores`` inside the tail of ``compressor_tail_scatter``:
  ``InputError`` (tokenspeed: not checked).
* a non-negative slot below the capacity named twice in one ``compressor_tail_scatter``
  (tokenspeed requires unique slots and does not check): ``InputError`` on CPU tensors and in
  strict mode; on a GPU by default one of the rows is stored (kvformats' checks, spec/checks.md).
"""

from __future__ import annotations

import torch

from kvformats.compat._replay import replayed
from kvformats.deepseek_v41 import compressor as ops
from kvformats.errors import InputTypeError, LayoutError, describe

__all__ = ["compressor_tail_scatter", "compressor_pool"]  # in the released __all__'s order

TAIL_SHAPE = (2, 2, ops.WIDTH)  # tokenspeed's field: [pages, 2 tokens, content / score, 512 channels]


def _fp32(name: str, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise InputTypeError(f"{name} must be a float32 tensor [T, {ops.WIDTH}] (tokenspeed's projections), "
                             f"got {describe(x)}")


def _tail(tail) -> None:
    want = f"tail must be a float32 tensor [pages, 2, 2, {ops.WIDTH}]"
    if not isinstance(tail, torch.Tensor) or tail.dtype != torch.float32 or tail.dim() != 4:
        raise InputTypeError(f"{want}, got {describe(tail)}")
    if tuple(tail.shape[1:]) != TAIL_SHAPE:
        raise LayoutError(f"{want}, got {describe(tail)}")


@replayed  # checks, then the native call: replayed as the native call is
def compressor_tail_scatter(
    content: torch.Tensor,
    scores: torch.Tensor,
    tail: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Store float32 ``content`` / ``scores [T, 512]`` rows in ``tail [pages, 2, 2, 512]`` at
    ``slots [T]`` (int32 / int64; page ``slot // 2``, token ``slot % 2``); negative and
    out-of-capacity slots skip writes, live slots must be unique. Mutates ``tail``; returns None."""
    _fp32("content", content)
    _fp32("scores", scores)
    _tail(tail)
    ops.compressor_tail_scatter(content, scores, tail, slots=slots)
    return None


@replayed
def compressor_pool(
    content: torch.Tensor,
    scores: torch.Tensor,
    previous: torch.Tensor,
    tail: torch.Tensor,
    tail_slots: torch.Tensor,
    active: torch.Tensor,
    out: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    norm_eps: float,
) -> torch.Tensor:
    """Pool each active row of float32 ``content`` / ``scores [T, 512]`` with its predecessor
    (row ``previous[t]``, or for ``previous[t] < 0`` the tail row at ``tail_slots[t]``, slots of
    page 0 and beyond the tail reading zeros): per channel ``softmax(s0, s1)`` weighting ``c0`` and
    ``c1``; inactive rows 0. With ``norm_weight [512]``: bf16 rounding, RMSNorm with ``norm_eps``
    (> 0), bf16 output; else float32. Writes ``out`` (or a new tensor for None), returns it."""
    _fp32("content", content)
    _fp32("scores", scores)
    _tail(tail)
    return ops.compressor_pool(content, scores, tail, previous=previous, tail_slots=tail_slots, active=active,
                               norm_weight=norm_weight, norm_eps=norm_eps if norm_weight is not None else None,
                               out=out)
