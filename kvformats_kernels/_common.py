"""Launch helpers shared by the kernel families: geometry read off a layout, input views,
launch sizes. Nothing here synchronises with the host, so every launcher stays CUDA-graph
capturable."""

from __future__ import annotations

import collections
import functools
import struct
import types
from typing import Mapping

import torch
import triton.language as tl

from kvformats.runtime import deferred
from kvformats_kernels import rows_jit, settings, tuning
from kvformats_kernels.launch import fast

def config(module: str, op: str, rows: int | None = None) -> dict[str, int]:
    """The launch configuration of ``op`` launched by kernel ``module`` (its name in the tuning
    tables: ``tuning.module_name``); for a call of ``rows`` <= BOUNDS["small_rows"] rows, with
    SMALL's overrides, and FEW's too for ``rows`` <= BOUNDS["few_rows"] (``rows`` is a shape,
    known on the host, so graphs capture either). The values are kvformats_kernels.tuning's."""
    key = (module, op)
    cfg = tuning.CONFIG[key]
    if rows is None or rows > tuning.BOUNDS["small_rows"]:
        return cfg
    if key in tuning.SMALL:
        cfg = {**cfg, **tuning.SMALL[key]}
    if rows <= tuning.BOUNDS["few_rows"] and key in tuning.FEW:
        cfg = {**cfg, **tuning.FEW[key]}
    return cfg


def launch_opts(cfg: Mapping) -> dict:
    """Triton launch options of a config: ``num_warps`` and, where the config sets a nonzero
    ``maxnreg``, that cap on registers per thread (more programs fit on an SM, but spills cost
    instructions, so a sweep on the GPU decides per kernel)."""
    if cfg.get("maxnreg"):
        return {"num_warps": cfg["num_warps"], "maxnreg": cfg["maxnreg"]}
    return {"num_warps": cfg["num_warps"]}


def hw_cvt(cfg: dict) -> bool:
    """Whether a kernel uses the GPU's float8 / bf16 conversion instructions (``HW`` in
    numerics_jit) rather than integer rounding: where its config asks and not under the
    interpreter, whose float casts round differently (design.md)."""
    return bool(cfg.get("hw_cvt", 0)) and not settings.SETTINGS.interpret


def f32(value: float) -> float:
    """The float32 value nearest to ``value`` (round to nearest even), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def rows_per_tile(tile: int, row: int) -> int:
    """Rows per program so that a program's tile spans about ``tile`` elements (a power of two)."""
    return max(1, tile // row)


def grid_rows(n: int, block_m: int) -> int:
    return (n + block_m - 1) // block_m


def region(layout, name: str):
    """(in-page byte offset of row 0, byte stride between rows, bytes per row) of a region."""
    r = layout.region(name)
    return r.offset, r.row_stride, r.nbytes


def capacity(layout, cache: torch.Tensor) -> int:
    """Slots the cache holds; kernels skip slot >= capacity (no write outside the cache)."""
    return cache.shape[0] * layout.page_size


def byte_cache(layout, cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(uint8 alias of the cache, page stride in bytes)."""
    return layout.byte_pages(cache)


# The record sites (deferred.SITES) the launchers pass to their kernels as the SITE constexpr:
# the same (op, argument) the reference records with (kvformats.codec.slot_ops and kvformats.codec.paged_ops).
SITES = {
    "encode": deferred.site("encode", "slots"),
    "decode": deferred.site("decode", "slots"),
    "gather": deferred.site("gather", "slots"),
    "decode_topk": deferred.site("decode_topk", "topk_slots"),
    "gather_lens": deferred.site("dequantize_gather", "gather_lens"),
    "out": deferred.site("dequantize_gather", "out"),
    "cu_seq_lens": deferred.site("gather_paged", "cu_seq_lens"),
}


def error_record(cache: torch.Tensor) -> torch.Tensor:
    """The error record of the cache's device, which the kernels write their violations to."""
    return deferred.error_record(cache.device)


def rows_input(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(``x [N, D]`` with unit column stride, whether it is bf16). The row stride is passed to
    the kernel; bf16 goes as its int16 bit patterns, which kernels widen exactly (load_f32)."""
    if x.stride(1) != 1 and x.shape[1] > 1:
        x = x.contiguous()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16), True
    return x, False


def row_stride(x: torch.Tensor) -> int:
    return x.stride(0) if x.shape[0] > 1 else x.shape[1]


def frozen(mapping: dict) -> types.MappingProxyType:
    """A read-only view of a cached plan's constexprs: no caller can change what another gets."""
    return types.MappingProxyType(mapping)


def per_layout(fn):
    """Memoise ``fn``, a pure function of hashable layouts / rules that returns kernel
    constexprs: worked out once per layout instead of on every launch (they cost a few µs of
    host time per call, a tenth of a small call's eager time), and handed out read-only so no
    caller can change what another gets."""

    @functools.lru_cache(maxsize=256)
    @functools.wraps(fn)
    def cached(*args, **kwargs):
        return types.MappingProxyType(fn(*args, **kwargs))

    return cached


@per_layout
def rule_constants(rule) -> dict:
    """A ScaleRule as kernel constexprs (floor and element max rounded to float32 as torch does)."""
    return dict(FLOOR=f32(rule.floor), ELEM_MAX=f32(rule.element_max), FLOOR_ON_SCALE=rule.floor_on == "scale",
                E_MIN=rule.exponent_min, E_MAX=rule.exponent_max)


@functools.cache
def short_exponent(rule) -> dict:
    """Constexprs of ``numerics_jit.block_exponent_short`` for a ScaleRule: SHORT_E (whether it
    holds: a ceil rule with power-of-two scales, an element max >= 1 of at most 8 significant
    bits, a floor that keeps every quotient normal), E_FLOOR (the rule's exponent of 0), and
    the element max's bits as EM_CARRY (0x7FFFFF - its mantissa field) and EM_FIELD (its
    exponent field)."""
    em, fl = f32(rule.element_max), f32(rule.floor)
    em_bits = struct.unpack("<I", struct.pack("<f", em))[0]
    tiny = 2.0 ** -126
    ok = (rule.power_of_two and rule.exponent_mode == "ceil" and 1.0 <= em < float("inf")
          and em_bits & 0xFFFF == 0 and fl >= tiny and (rule.floor_on == "scale" or fl / em >= tiny))
    e_floor = int(rule.exponents(torch.zeros(1, 1))[0]) if ok else 0
    return dict(SHORT_E=bool(ok), E_FLOOR=e_floor, EM_CARRY=0x7FFFFF - (em_bits & 0x7FFFFF),
                EM_FIELD=em_bits >> 23)


@per_layout
def profile_constants(layout, e2m1: bool = False) -> dict:
    """The rest of a layout's numerics profile as encode-kernel constexprs (with
    ``rule_constants``): exponent mode, and for e2m1 formats the rounding and sign of zero.
    Rules with arbitrary float32 scales (``POW2=False``, passed by the launchers) are honoured by
    the fp8_indexer and fp8_ds_mla (V3.2 rows) encoders."""
    rule = layout.scale_rule
    out = dict(FLOOR_MODE=rule.exponent_mode == "floor_minus_emax", ELEM_EMAX=rule.element_emax)
    if e2m1:
        prof = layout.numerics
        out.update(E2M1_RNE=prof.e2m1_rounding == "rne", E2M1_SIGNED_ZERO=prof.e2m1_signed_zero)
    return out


@per_layout
def read_constants(layout) -> dict:
    """The numerics profile as decode-kernel constexprs: FF_NAN, whether a ue8m0 scale byte 0xFF
    reads NaN (the profile's ue8m0_ff "nan", float8_e8m0fnu) rather than +Inf ("inf", the float32
    2^(255 - 127) of tokenspeed's readers; spec/nan-policy.md §4)."""
    profile = getattr(layout, "numerics", None)
    return dict(FF_NAN=profile is None or profile.ue8m0_ff == "nan")


@functools.cache
def _constants_type(names: tuple[str, ...]) -> type:
    """A named tuple of ``names`` whose fields read as tl.constexpr (Triton 3.6 wants one where a
    value makes a shape: tl.zeros) while the tuple holds the plain values, so that hashing it
    for a launch's key stays one C call, not a Python call per field."""
    base = collections.namedtuple("Constants", names)  # type: ignore[misc]  # names known at run time
    fields = {name: property(lambda self, i=i: tl.constexpr(tuple.__getitem__(self, i)))  # type: ignore[misc]
              for i, name in enumerate(names)}
    return type("Constants", (base,), {"__slots__": (), **fields})


def constants(values: dict) -> tuple:
    """``values`` as one constexpr that a jit function reads by name (``G.NB``): a named tuple,
    hashable and printed with its values, so Triton specializes on it as on a plain constexpr.
    How a format's decode body gets its constants through rows_jit's kernels, which serve every
    format."""
    names = tuple(sorted(values))
    return _constants_type(names)(*(values[n] for n in names))


def decode_constants(body, values: dict, page_size: int, cfg: dict, **kernel) -> types.MappingProxyType:
    """Every constexpr and launch option of rows_jit's decode kernels: the format's decode
    ``body`` and its constants ``values``, the page size, the config's rows per program, and the
    kernel's own (``kernel``: ROW and SITE, or paged_constants')."""
    return frozen(dict(BODY=body, G=constants(values), PAGE_SIZE=page_size, BLOCK_M=cfg["block_m"], **kernel,
                       **launch_opts(cfg)))


def decode_rows(layout, cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype, plan,
                site: int) -> torch.Tensor:
    """``[N, head_dim]`` rows of ``dtype`` at ``slots`` through rows_jit.decode_kernel; zero rows
    for invalid slots (those >= capacity recorded at ``site``). ``plan(layout, u8, page stride,
    N, site)`` gives the launch's rows per program, its decode_constants, and the second view of
    the cache the body reads with its page stride (the cache and 0 for a body that has none)."""
    n = slots.shape[0]
    out = torch.empty((n, layout.head_dim), dtype=dtype, device=cache.device)
    if n > 0:
        u8, stride = byte_cache(layout, cache)
        block_m, consts, aux, aux_stride = plan(layout, u8, stride, n, site)
        fast(rows_jit.decode_kernel)[(grid_rows(n, block_m),)](
            u8, slots, out, error_record(cache), n, slots.stride(0), capacity(layout, cache), stride, aux, aux_stride,
            **consts)
    return out


MAX_GRID_Y = 65535  # CUDA's limit on grid axis 1: requests beyond it go in further launches


def paged_constants(body, values: dict, page_size: int, has_glen: bool, has_base: bool,
                    cfg: dict) -> types.MappingProxyType:
    """Every constexpr and launch option of rows_jit's dequantize_gather kernel: decode_constants
    with which optional tensors came and the record sites."""
    return decode_constants(body, values, page_size, cfg, HAS_GLEN=has_glen, HAS_BASE=has_base,
                            GLEN_SITE=SITES["gather_lens"], OUT_SITE=SITES["out"])


def dequantize_gather_bf16(layout, cache: torch.Tensor, out: torch.Tensor, block_table, seq_lens, gather_lens, base,
                           offset: int, cfg: dict, plan) -> None:
    """bf16 ``out [R, W, head_dim]`` of a family whose decode body ``plan`` names (``plan(layout,
    has_glen, has_base, cfg_items, hw) -> (block_m, constexprs)``) under launch config ``cfg``:
    the paged kernel of rows_jit (launch_paged). Validated in kvformats.codec.paged_ops."""
    u8, stride = byte_cache(layout, cache)
    block_m, consts = plan(layout, gather_lens is not None, base is not None, tuple(cfg.items()), hw_cvt(cfg))
    launch_paged(u8, stride, out.view(torch.int16), block_table, seq_lens, gather_lens, base, offset,
                 cache.shape[0], block_m, consts)


def launch_paged(cache: torch.Tensor, stride: int, out: torch.Tensor, table: torch.Tensor, seq_lens: torch.Tensor,
                 gather_lens, base, offset: int, num_pages: int, block_m: int, consts, aux=None) -> None:
    """Launch rows_jit's dequantize_gather kernel over (row blocks of the workspace, requests)
    on the byte view ``cache`` (page stride ``stride``), with the constexprs and launch options
    ``consts`` (paged_constants), ``block_m`` rows per program and the body's second view of the
    cache ``aux`` (tensor, page stride), if it reads one.

    ``out [R, W, D]`` may have any strides; with a non-unit element stride the kernel writes a
    contiguous copy (holding the untouched rows too), copied back after. Nothing reads device
    memory on the host: the grid spans the workspace width, and rows at or beyond a request's
    gather_len are masked off inside the kernel. Each request has at least one program, even
    with no workspace rows after the offset: its first program checks gather_len and the
    width (rows_jit.record_request), as the reference does for every request."""
    requests, width = out.shape[0], out.shape[1] - offset
    if requests == 0:
        return
    target = out if out.stride(2) == 1 or out.shape[2] == 1 else out.contiguous()
    err = error_record(out)
    glen = seq_lens if gather_lens is None else gather_lens
    base = seq_lens if base is None else base
    aux, aux_stride = (cache, 0) if aux is None else aux
    for r0 in range(0, requests, MAX_GRID_Y):
        grid = (max(1, grid_rows(width, block_m)), min(requests - r0, MAX_GRID_Y))
        fast(rows_jit.paged_decode_kernel)[grid](
            cache, table, seq_lens, glen, base, target, err, table.stride(0), table.stride(1), table.shape[1],
            num_pages, stride, target.stride(0), target.stride(1), offset, width, r0, aux, aux_stride, **consts)
    if target is not out and width > 0:
        out.copy_(target)


def topk(decode, layout, cache: torch.Tensor, topk_slots: torch.Tensor):
    """``decode`` of the flattened ``[T, K]`` slots, reshaped to ``[T, K, ...]`` (each tensor);
    ``decode(layout, cache, slots, site)`` records at decode_topk's site, with the flat index
    in ``[T, K]`` as the reference does."""
    decoded = decode(layout, cache, topk_slots.reshape(-1), SITES["decode_topk"])
    shape = tuple(topk_slots.shape)
    if isinstance(decoded, tuple):
        return tuple(d.reshape(*shape, d.shape[-1]) for d in decoded)
    return decoded.reshape(*shape, decoded.shape[-1])


def words_aligned(u8: torch.Tensor, stride: int, geometry: dict) -> bool:
    """Whether every nibble-record address of a cache (its bytes ``u8``, page ``stride``, the
    launcher's geometry: VAL_OFF, VAL_STRIDE, QB) is a multiple of 4, so that e2m1 nibbles may
    be stored as int32 words. A function of the base address's alignment, which the replay key
    holds."""
    g = geometry
    return (u8.data_ptr() | stride | g["VAL_OFF"] | g["VAL_STRIDE"] | (g["QB"] // 2)) % 4 == 0
