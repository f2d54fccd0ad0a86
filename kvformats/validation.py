"""Argument validation, in one place for every backend. Each check raises a typed error that
says what was expected and what came; none writes anything."""

from __future__ import annotations

import torch

from kvformats.errors import InputError, InputTypeError, LayoutError, describe, memory_problem
from kvformats.runtime import deferred

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
_STRIDED = torch.strided


def _names(dtypes) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def capturing(t: torch.Tensor) -> bool:
    """True inside CUDA-graph capture, where no host check can run."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _shape_fits(got, shape: tuple) -> bool:
    # Unpacked for one and two dims, the common ranks, and a plain loop otherwise: every op runs
    # this on each argument, and it is several times cheaper than any() over a generator (it is
    # part of every eager call's host cost).
    n = len(shape)
    if len(got) != n:
        return False
    if n == 1:
        return shape[0] is None or shape[0] == got[0]
    if n == 2:
        a, b = shape
        g0, g1 = got
        return (a is None or a == g0) and (b is None or b == g1)
    for want, size in zip(shape, got):
        if want is not None and want != size:
            return False
    return True


_compiling = torch.compiler.is_compiling


def check_memory(name: str, t: torch.Tensor) -> None:
    """InputTypeError unless a kernel can take ``t``'s memory as its values: a strided tensor
    without the conjugate or negative bit (``kvformats.errors.memory_problem``)."""
    if t.layout is not _STRIDED or t.is_neg() or t.is_conj():
        raise InputTypeError(f"{name} {memory_problem(t)}")


def check_tensor(name: str, t, *, dtypes, shape: tuple, device: torch.device | None = None) -> None:
    """``t`` is a strided tensor (no conjugate or negative bit: ``check_memory``) of one of
    ``dtypes`` with ``shape`` (None = any size) on ``device``."""
    # One boolean chain for the common case, then the failing test named (every op runs this on
    # each argument, so it is part of every eager call's host cost). The conjugate bit needs no
    # test here: only a complex tensor carries it, and no op takes a complex dtype.
    # Under torch.compile (a drop-in's checks traced by dynamo) is_neg() would break the graph, and
    # the traced tensors are the op's own: the memory check is the eager call's.
    if (isinstance(t, torch.Tensor) and t.dtype in dtypes and t.layout is _STRIDED
            and (_compiling() or not t.is_neg())
            and _shape_fits(t.shape, shape) and (device is None or t.device == device)):
        return
    if not isinstance(t, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {describe(t)}")
    if not _compiling():
        check_memory(name, t)  # before the shape: a sparse CSR tensor has no strides to read
    if t.dtype not in dtypes:
        raise InputTypeError(f"{name} must have dtype {_names(dtypes)}, got {describe(t)}")
    if not _shape_fits(t.shape, shape):
        # Any-size dims get letters (N, M, K, L): "slots must be a 1-D tensor [N]".
        letters = iter("NMKLPQ")
        dims = [next(letters, "*") if d is None else str(d) for d in shape]
        want = f"{len(shape)}-D tensor [{', '.join(dims)}]"
        free = [d for d, s in zip(dims, shape) if s is None]
        if free:
            want += f" ({', '.join(free)} any size)"
        if t.dim() != len(shape):
            raise InputError(f"{name} must be a {want}, got a {t.dim()}-D {describe(t)}")
        raise InputError(f"{name} must be a {want}, got {describe(t)}")
    raise InputError(f"{name} must be on the cache's device {device}, got {describe(t)}; "
                     f"move it with .to({str(device)!r})")


def overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory, from its sizes and strides alone: a dim of
    stride 0 (an expanded tensor), or a stride that does not step past everything the smaller
    strides reach (a row stride shorter than a row). Conservative: dims interleaved in some other
    non-overlapping way count as overlapping."""
    if t.numel() == 0:
        return False
    reach = 0  # the largest element offset the dims seen so far span
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def check_no_overlap(name: str, t: torch.Tensor, what: str = "rows") -> None:
    """InputError if elements of the output ``t`` share memory: its {what} would overwrite each other."""
    if overlapping(t):
        raise InputError(f"{name} has {what} that share memory (shape {tuple(t.shape)}, strides {t.stride()}): "
                         f"they would overwrite each other; pass a workspace whose {what} do not overlap "
                         f"(torch.empty, or .contiguous() of an expanded tensor)")


def _allocate_fix(layout) -> str:
    return f"allocate it with {layout.name} layout.allocate(num_pages)"


def _cache_fits(layout, cache) -> bool:
    """The common case of check_cache, from one read of the shape and the strides."""
    shape, stride = cache.shape, cache.stride()
    if cache.dtype != layout.container_dtype:
        return False
    if len(shape) == 2 and cache.dtype == torch.uint8:
        if shape[1] < layout.min_page_bytes or (stride[1] != 1 and shape[1] != 1):
            return False
        min_stride = shape[1]
    else:
        page_shape = layout.page_shape
        if (len(shape) != 3 or len(page_shape) != 2 or shape[1] != page_shape[0] or shape[2] != page_shape[1]
                or stride[2] != 1 or stride[1] != page_shape[1]):
            return False
        min_stride = page_shape[0] * page_shape[1]
    return shape[0] <= 1 or stride[0] >= min_stride


def check_cache(layout, cache) -> None:
    """The cache fits the layout: a strided tensor (``check_memory``) of the container dtype and
    rank, page width, contiguous rows."""
    # the layout first: a sparse CSR tensor has no strides for _cache_fits to read
    if isinstance(cache, torch.Tensor) and cache.layout is _STRIDED and not cache.is_neg() \
            and _cache_fits(layout, cache):
        return  # else the checks below, in order, name what is wrong
    if not isinstance(cache, torch.Tensor):
        raise InputTypeError(f"cache must be a torch.Tensor, got {describe(cache)}")
    check_memory("cache", cache)
    page_shape = layout.page_shape
    if cache.dtype != layout.container_dtype or cache.dim() != 1 + len(page_shape):
        raise InputTypeError(f"{layout.name} cache must be a {layout.container_dtype} tensor "
                             f"[pages, {', '.join(map(str, page_shape))}], got {describe(cache)}; "
                             f"{_allocate_fix(layout)}")
    if cache.dtype == torch.uint8:
        if cache.shape[1] < layout.min_page_bytes:
            raise LayoutError(f"{layout.name} pages must be at least page_size * row_bytes = "
                              f"{layout.page_size} * {layout.row_bytes} = {layout.min_page_bytes} bytes wide, "
                              f"got {cache.shape[1]}; {_allocate_fix(layout)}")
        inner_ok = cache.stride(1) == 1 or cache.shape[1] == 1
        min_stride = cache.shape[1]
    else:
        if tuple(cache.shape[1:]) != tuple(page_shape):
            raise LayoutError(f"{layout.name} cache pages must be {list(page_shape)}, "
                              f"got {list(cache.shape[1:])}; {_allocate_fix(layout)}")
        inner_ok = cache.stride(2) == 1 and cache.stride(1) == page_shape[1]
        min_stride = page_shape[0] * page_shape[1]
    if not inner_ok:
        raise LayoutError(f"{layout.name} cache rows must be contiguous (only the page stride may be "
                          f"padded), got strides {cache.stride()}")
    if cache.shape[0] > 1 and cache.stride(0) < min_stride:
        raise LayoutError(f"{layout.name} cache page stride {cache.stride(0)} is smaller than a page "
                          f"({min_stride} elements): pages would overlap")


HOST_CHECK_MAX = 2048  # slot lists up to this long are checked on the host (see check_slots)
REPEATED_SLOTS = "slots repeat a target row; each non-negative slot may appear once per call"


def repeats(live: torch.Tensor) -> bool:
    """Whether a slot appears twice among ``live``, the slots a call writes (one host read)."""
    return torch.unique(live).numel() != live.numel()


def check_slots(layout, slots, n: int | None, cache: torch.Tensor, *, check_range, unique: bool,
                site: int | None = None, kernel: bool = False) -> None:
    """``slots`` is int32/int64 ``[n]`` (any length for None) on the cache's device. Its values
    are checked by the op's check mode ``check_range`` (True, False or "strict":
    ``kvformats.runtime.deferred``): on the host before any write (every slot below the capacity and,
    with ``unique``, no non-negative slot repeated), or on the device through the error record,
    which a ``kernel`` implementation writes itself and the reference writes here (``site``)."""
    check_tensor("slots", slots, dtypes=INDEX_DTYPES, shape=(n,), device=cache.device)
    if deferred.on_host(check_range, slots):
        if slots.numel():
            _host_slot_checks(layout, slots, cache, unique)
    elif site is not None and not kernel and slots.numel():
        capacity = cache.shape[0] * layout.page_size
        deferred.record_where(slots >= capacity, slots, capacity, deferred.Check.SLOT_RANGE, site)


def _host_slot_checks(layout, slots, cache, unique: bool) -> None:
    capacity = cache.shape[0] * layout.page_size
    if slots.numel() <= HOST_CHECK_MAX:
        # Decode-sized lists: one copy to the host and plain Python, cheaper than the ~10 device
        # operations the flags below launch.
        values = slots.tolist()
        over = next((i for i, v in enumerate(values) if v >= capacity), None)
        real = [v for v in values if v >= 0]
        repeat = unique and len(set(real)) != len(real)
    else:
        # Both checks reduce to flags on the device and reach the host in one read.
        flags = [(slots >= capacity).any()]
        if unique and slots.numel() > 1:
            s = torch.sort(slots).values
            flags.append(((s[1:] == s[:-1]) & (s[1:] >= 0)).any())
        is_over, *repeated = torch.stack(flags).tolist()
        over = int((slots >= capacity).nonzero()[0, 0]) if is_over else None
        repeat = any(repeated)
    if over is not None:
        raise InputError(f"slots[{over}] = {int(slots[over])} is beyond the cache's capacity: "
                         f"{cache.shape[0]} pages * {layout.page_size} rows = {capacity} slots "
                         f"(valid slots are 0..{capacity - 1}, or negative for 'no row')")
    if repeat:  # found with the range check above: one host read for both (not repeats())
        raise InputError(REPEATED_SLOTS)


def check_float_rows(name: str, x, width: int, device: torch.device) -> int:
    """``x`` is a bf16/fp16/fp32 ``[N, width]`` tensor on ``device``; returns N."""
    check_tensor(name, x, dtypes=FLOAT_DTYPES, shape=(None, width), device=device)
    return x.shape[0]
