"""The ratio-2 compressor of DeepSeek V4.1: store each token's projected ``(content, scores)`` in
the compressor tail, and pool completed pairs (tokenspeed-kernel 0.1.4's
``compressor_tail_scatter`` and ``compressor_pool``, ``tokenspeed_kernel.ops.attention.dsv41``;
PyPI, https://github.com/lightseekorg/tokenspeed).

The tail is kvformats' ``compressor_state_v41`` cache at ``head_dim=512``
(spec/formats/compressor_state_v41.md): float32 rows ``[content 512 | scores 512]``, ``P`` rows a
page (tokenspeed: ``P = 2``), slot ``s`` at page ``s // P``, row ``s % P``. tokenspeed's field,
float32 ``[pages, 2, 2, 512]`` (page, token, content / score, channel), holds exactly those bytes:
both ops take it as it is, or as the layout's ``[pages, P, 1024]`` cache. The rows must be
contiguous (the page stride is free), as the layout says; tokenspeed also maps other strides.

* ``compressor_tail_scatter(content, scores, tail, slots=)``: row t -> slot ``slots[t]``.
* ``compressor_pool(content, scores, tail, previous=, tail_slots=, active=, norm_weight=,
  norm_eps=, out=)``: per row, a softmax of two scores per channel over the row and its
  predecessor, then optionally RMSNorm; writes no cache.

Numerics (docs/reference/deepseek_v41.md): the reference is float32 torch, operation by
operation; the Triton kernel does the same operations in the same order (exp, correctly rounded
divisions, products and sums never fused, the RMS sum of squares in a fixed pairwise order), so
on a CUDA device it equals the reference run on that device bit for bit (NaN for NaN). Only the
exponential and the RMS rsqrt are the device's: libdevice ``expf`` / ``rsqrtf`` on CUDA (torch's
CUDA exp / rsqrt and the kernel both), torch's CPU exp and ``1 / sqrt`` for the reference on CPU,
numpy's under the Triton interpreter.
"""

from __future__ import annotations

import struct

import torch

from kvformats.codec.op import Op
from kvformats.codec.rows import write_rows
from kvformats.codec.torch_library import rows as row_count
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v41 import _dispatch as D
from kvformats.errors import InputError, InputTypeError, LayoutError, describe
from kvformats.formats import CompressorStateV41
from kvformats.runtime import deferred
from kvformats.validation import (FLOAT_DTYPES, HOST_CHECK_MAX, INDEX_DTYPES, REPEATED_SLOTS, check_cache,
                                  check_memory, check_no_overlap, check_tensor, repeats)

__all__ = ["WIDTH", "compressor_pool", "compressor_tail_scatter", "tail_layout"]

WIDTH = 512  # channels of content and of scores (the V4.1 compressor's head dim)
INV_WIDTH = 1.0 / WIDTH  # exact (a power of two): mean = sum * INV_WIDTH, correctly rounded
FLT_MAX = 3.4028234663852886e38
# The smallest normal float32. norm_eps must be at least this: the argument of the RMS rsqrt is
# then a normal number, on which the GPU's rsqrtf (kernel and torch alike) agree bit for bit;
# on subnormal arguments torch's CUDA rsqrt and libdevice's differ.
FLT_MIN = 1.1754943508222875e-38


COMPRESSOR_TAIL_SCATTER = Op(D.MODEL_FAMILY, "compressor_tail_scatter", mutates=("tail",))
# out: the tensor the function would allocate (its dtype, shape and device), so the op's checks
# pass on it exactly where the function's would
COMPRESSOR_POOL = Op(D.MODEL_FAMILY, "compressor_pool", mutates=("out",), result=lambda a: a["out"],
                     workspaces={"out": lambda v: v["tail"].new_empty(
                         (row_count(v["content"]), WIDTH),
                         dtype=torch.float32 if v["norm_weight"] is None else torch.bfloat16)})


# ----- arguments ---------------------------------------------------------------------------------
def tail_layout(page_size: int = 2) -> CompressorStateV41:
    """The layout of the tail: ``compressor_state_v41`` with ``head_dim=512`` and ``page_size``
    rows a page (2 for tokenspeed-kernel 0.1.4's ``[pages, 2, 2, 512]`` field)."""
    return C.layout_of(CompressorStateV41, head_dim=WIDTH, page_size=page_size)


def _tail_cache(tail) -> tuple[CompressorStateV41, torch.Tensor]:
    """(layout, the ``[pages, P, 1024]`` cache view) of ``tail``: float32 ``[pages, P, 2, 512]``
    (tokenspeed's field) or ``[pages, P, 1024]`` (the layout's cache), rows contiguous."""
    want = (f"tail must be a float32 tensor [pages, P, 2, {WIDTH}] (tokenspeed's field) or "
            f"[pages, P, {2 * WIDTH}] (compressor_state_v41's cache)")
    if not isinstance(tail, torch.Tensor) or tail.dtype != torch.float32 or tail.dim() not in (3, 4):
        raise InputTypeError(f"{want}, got {describe(tail)}")
    check_memory("tail", tail)  # before its strides are read (a sparse tensor has none)
    if tail.shape[1] < 1:
        raise LayoutError(f"{want} with at least one row a page, got {describe(tail)}")
    if tail.dim() == 4:
        if tuple(tail.shape[2:]) != (2, WIDTH):
            raise LayoutError(f"{want}, got {describe(tail)}")
        pages, p = tail.shape[:2]
        if tail.stride(3) != 1 or tail.stride(2) != WIDTH or (p > 1 and tail.stride(1) != 2 * WIDTH):
            raise LayoutError(f"tail rows must be contiguous (strides [page, {2 * WIDTH}, {WIDTH}, 1]; only the "
                              f"page stride is free), got strides {list(tail.stride())}")
        tail = tail.as_strided((pages, p, 2 * WIDTH), (tail.stride(0), 2 * WIDTH, 1), tail.storage_offset())
    elif tail.shape[2] != 2 * WIDTH:
        raise LayoutError(f"{want}, got {describe(tail)}")
    layout = tail_layout(tail.shape[1])
    check_cache(layout, tail)
    return layout, tail


def _rows(name: str, x, n: int | None, device) -> int:
    check_tensor(name, x, dtypes=FLOAT_DTYPES, shape=(n, WIDTH), device=device)
    return x.shape[0]


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[first, end)`` that ``t``'s elements occupy (strides are never negative)."""
    first = t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return first, first + (last + 1) * t.element_size()


def _check_apart(name: str, t: torch.Tensor, others: dict) -> None:
    """InputError if the elements of ``t`` (written by the op) overlap those of a tensor among
    ``others`` (read by it): the kernel's reads and writes would race."""
    if t.numel() == 0 or t.device.type == "meta":
        return
    lo, hi = _span(t)
    for other_name, o in others.items():
        if isinstance(o, torch.Tensor) and o.numel() and o.device == t.device:
            a, b = _span(o)
            if a < hi and lo < b:
                raise InputError(f"{name} overlaps {other_name} in memory: the op writes {name} while it reads "
                                 f"{other_name}; pass tensors that do not share those bytes")


def _f32(value: float) -> float:
    """The float32 value nearest to ``value``, as a Python float (what the kernel receives)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _norm_eps(norm_weight, norm_eps) -> float:
    if norm_weight is None:
        if norm_eps is not None and (isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float))):
            raise InputTypeError(f"norm_eps must be a float or None, got {describe(norm_eps)}")
        return 0.0
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)):
        raise InputTypeError(f"norm_eps must be a float when norm_weight is given, got {describe(norm_eps)}")
    if not FLT_MIN <= norm_eps <= FLT_MAX or not _f32(norm_eps) >= FLT_MIN:
        raise InputError(f"norm_eps must be a finite float32 number of at least {FLT_MIN!r} (the smallest normal "
                         f"float32), got {norm_eps!r}")
    return _f32(norm_eps)


# ----- compressor_tail_scatter -------------------------------------------------------------------
@COMPRESSOR_TAIL_SCATTER.public
def compressor_tail_scatter(content: torch.Tensor, scores: torch.Tensor, tail: torch.Tensor, *,
                            slots: torch.Tensor, backend: str = "auto", check: bool | str = True) -> None:
    """Store row t of ``content`` and ``scores`` at tail slot ``slots[t]``, as float32.

    Args:
        content, scores: ``[N, 512]`` float32 (bf16 and fp16 are widened exactly), any strides.
        tail: the compressor tail, float32 ``[pages, P, 2, 512]`` (tokenspeed-kernel 0.1.4's field,
            ``P = 2``) or ``[pages, P, 1024]`` (``compressor_state_v41``'s cache), rows contiguous,
            any page stride. Slot s is page ``s // P``, row ``s % P``: ``[content | scores]``.
        slots: int32 / int64 ``[N]``. A slot that is negative or at least ``pages * P`` writes
            nothing and is not an error (engines pad with such slots, as tokenspeed allows); page
            0 is an ordinary page here (``compressor_pool`` reads it as the null page).

    Writes the tail in place and returns None. Read the pairs this call overwrites first
    (``compressor_pool``), as tokenspeed's engine does. ``check`` (True, False or "strict";
    spec/checks.md): on CPU tensors and in strict mode a non-negative slot below the capacity
    named twice raises before anything is written; on a GPU by default it is not looked for, and
    each element of that row comes from one of the rows that name it. Other arguments are
    checked on every device: typed errors (InputTypeError, InputError, LayoutError), nothing
    written; ``content`` or ``scores`` sharing bytes with the tail is refused.
    """
    C.check_mode(check)
    layout, cache = _tail_cache(tail)
    device = tail.device
    n = _rows("content", content, None, device)
    _rows("scores", scores, n, device)
    check_tensor("slots", slots, dtypes=INDEX_DTYPES, shape=(n,), device=device)
    _check_apart("tail", tail, {"content": content, "scores": scores, "slots": slots})
    fn = COMPRESSOR_TAIL_SCATTER.resolve(backend, device)
    if n and deferred.on_host(check, slots):
        capacity = cache.shape[0] * layout.page_size
        if n <= HOST_CHECK_MAX:
            live = [v for v in slots.tolist() if 0 <= v < capacity]
            repeated = len(set(live)) != len(live)
        else:
            repeated = repeats(slots[(slots >= 0) & (slots < capacity)])
        if repeated:
            raise InputError(REPEATED_SLOTS)
    fn(layout, content, scores, cache, slots)


@COMPRESSOR_TAIL_SCATTER.reference
def tail_scatter_reference(layout, content, scores, cache, slots) -> None:
    """compressor_state_v41's rows ``[content | scores]`` written at the live slots (validated
    input; slots outside ``[0, capacity)`` skipped)."""
    write_rows(layout, cache, slots, layout.encode_rows((content, scores)))


# ----- compressor_pool ---------------------------------------------------------------------------
@COMPRESSOR_POOL.public
def compressor_pool(content: torch.Tensor, scores: torch.Tensor, tail: torch.Tensor, *, previous: torch.Tensor,
                    tail_slots: torch.Tensor, active: torch.Tensor, norm_weight: torch.Tensor | None = None,
                    norm_eps: float | None = None, out: torch.Tensor | None = None, backend: str = "auto",
                    check: bool | str = True) -> torch.Tensor:
    """Pool each active row with its predecessor: a softmax over the two scores of each channel.

    For row t with ``active[t]``, the predecessor (``c0``, ``s0``) is row ``previous[t]`` of
    ``content`` / ``scores`` when ``0 <= previous[t] < N``; when ``previous[t] < 0`` it is the
    tail row at ``tail_slots[t]`` if that slot lies in ``[P, pages * P)`` (page 0 is the null
    page); otherwise it is zero (content 0, score 0). With (``c1``, ``s1``) row t itself, per
    channel, in float32::

        m = fmax(s0, s1); e0 = exp(s0 - m); e1 = exp(s1 - m); d = e0 + e1
        pooled = c0 * (e0 / d) + c1 * (e1 / d)          # no fused multiply-add

    An inactive row pools to 0. With ``norm_weight``: ``x = bf16(pooled)`` (widened back),
    ``y = (x * rsqrt(sum(x * x) / 512 + eps)) * weight`` and the output is ``bf16(y)`` (an
    inactive row: ``0 * weight``); the sum of squares adds adjacent pairs, nine times
    (``x[2i] + x[2i + 1]``). Without it the output is ``pooled``, float32.

    Args:
        content, scores: ``[N, 512]`` float32 (bf16 and fp16 are widened exactly), any strides.
        tail: the compressor tail, as ``compressor_tail_scatter`` takes it. Nothing is written to it.
        previous, tail_slots: int32 / int64 ``[N]``; active: bool ``[N]``.
        norm_weight: ``[512]`` float (bf16, fp16, fp32), or None; norm_eps: its epsilon (a float,
            taken as float32, at least the smallest normal float32 ~1.18e-38), required with a
            weight, ignored without.
        out: the destination, ``[N, 512]`` float32 (no norm) or bf16 (with norm), any
            non-overlapping strides, sharing no bytes with the inputs; None allocates it.

    Returns ``out`` (or the new tensor). No value of these inputs is invalid (each maps to the
    output above): ``check`` (spec/checks.md) is validated and changes nothing.
    """
    C.check_mode(check)
    layout, cache = _tail_cache(tail)
    device = tail.device
    n = _rows("content", content, None, device)
    _rows("scores", scores, n, device)
    check_tensor("previous", previous, dtypes=INDEX_DTYPES, shape=(n,), device=device)
    check_tensor("tail_slots", tail_slots, dtypes=INDEX_DTYPES, shape=(n,), device=device)
    check_tensor("active", active, dtypes=(torch.bool,), shape=(n,), device=device)
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, dtypes=FLOAT_DTYPES, shape=(WIDTH,), device=device)
    eps = _norm_eps(norm_weight, norm_eps)
    dtype = torch.float32 if norm_weight is None else torch.bfloat16
    if out is None:
        out = torch.empty((n, WIDTH), dtype=dtype, device=device)
    else:
        if not isinstance(out, torch.Tensor) or out.dtype != dtype:
            raise InputTypeError(f"out must be a {'float32' if dtype == torch.float32 else 'bfloat16'} tensor "
                                 f"[{n}, {WIDTH}] ({'with' if norm_weight is not None else 'without'} norm_weight), "
                                 f"got {describe(out)}")
        check_tensor("out", out, dtypes=(dtype,), shape=(n, WIDTH), device=device)
        check_no_overlap("out", out)
        _check_apart("out", out, {"content": content, "scores": scores, "tail": tail, "previous": previous,
                                  "tail_slots": tail_slots, "active": active, "norm_weight": norm_weight})
    fn = COMPRESSOR_POOL.resolve(backend, device)
    if n:
        fn(layout, content, scores, cache, previous, tail_slots, active, norm_weight, eps, out)
    return out


@COMPRESSOR_POOL.reference
def pool_reference(layout, content, scores, cache, previous, tail_slots, active, norm_weight, eps, out) -> None:
    """``compressor_pool`` on validated input (N > 0), written to ``out``."""
    n = content.shape[0]
    page = layout.page_size
    capacity = cache.shape[0] * page
    prev, slot = previous.long(), tail_slots.long()
    in_batch = active & (prev >= 0) & (prev < n)
    in_tail = active & (prev < 0) & (slot >= page) & (slot < capacity)
    c, s = content.float(), scores.float()
    here = torch.where(in_batch, prev, 0)
    zero = torch.zeros((), dtype=torch.float32, device=c.device)
    if capacity:
        at = torch.where(in_tail, slot, 0)
        rows = cache[at // page, at % page]
        tail_c = torch.where(in_tail[:, None], rows[:, :WIDTH], zero)
        tail_s = torch.where(in_tail[:, None], rows[:, WIDTH:], zero)
    else:
        tail_c = tail_s = torch.zeros((n, WIDTH), dtype=torch.float32, device=c.device)
    c0 = torch.where(in_batch[:, None], c[here], tail_c)
    s0 = torch.where(in_batch[:, None], s[here], tail_s)
    live = active[:, None]
    c1 = torch.where(live, c, zero)
    s1 = torch.where(live, s, zero)
    m = torch.fmax(s0, s1)  # a NaN score leaves the other: the kernel's maxnum
    e0 = torch.exp(s0 - m)
    e1 = torch.exp(s1 - m)
    d = e0 + e1
    pooled = c0 * (e0 / d) + c1 * (e1 / d)
    pooled = torch.where(live, pooled, zero)
    if norm_weight is None:
        out.copy_(pooled)
        return
    x = pooled.to(torch.bfloat16).float()
    sq = x * x
    while sq.shape[1] > 1:  # adjacent pairs: 512 -> 256 -> ... -> 1
        sq = sq[:, 0::2] + sq[:, 1::2]
    r = torch.rsqrt(sq * INV_WIDTH + eps)
    out.copy_(((x * r) * norm_weight.float()).to(torch.bfloat16))
