"""Triton kernels of ``kvformats.deepseek_v41``'s row writers, registered as their "triton" backend.

* ``swa_rope_scatter``: one program per BLOCK_M tokens reads each 512-dim bf16 row once, rotates
  its RoPE pairs (dims 448..511) at the token's position in the reference's float32 order (two
  products and one add or subtract: launched with ``enable_fp_fusion=False``), rounds the row to
  bf16 and quantizes it per block: fp8_ds_mla_v41's sixteen 32-blocks (every dim e4m3, one ue8m0
  byte each) or fp8_ds_mla's seven 64-blocks of NoPE dims plus the raw bf16 tail, through the
  shared store of fp8_ds_mla_jit. The same program writes ``out``: the decode of what it stored
  (the V4.1 decode's ue8m0_block_bits; the tail as rounded). A token at a position outside the
  cos/sin table is quantized unrotated into ``out``, writes no cache row and is recorded. The op's
  ``first_slot`` (slots below it skipped) and ``negative_positions="clamp"`` (a negative position
  rotates as 0) are applied here, so that tokenspeed's drop-in is one launch and no torch op.
* ``index_q_quantize``: one program per BLOCK_M rows of 128 dims quantizes and dequantizes each
  row in registers (mxfp4_indexer's profile vllm: e2m1 round-half-even; or tokenspeed's 'index_v4'
  rule: one float32 scale per row, x / scale correctly rounded, e4m3) and stores bf16.

Every rounding is done on bit patterns (numerics_jit), so the bytes equal the reference's under
the interpreter and on a GPU alike; nothing here reads a tensor on the host.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kvformats.formats import Mxfp4Indexer
from kvformats.runtime import deferred
from kvformats_kernels import _common as cm
from kvformats_kernels import numerics_jit as nj
from kvformats_kernels import record_jit as rec
from kvformats_kernels import settings
from kvformats_kernels.dsv4 import transforms_jit as tj
from kvformats_kernels.fp8_ds_mla_jit import store_row, ue8m0_block_bits
from kvformats_kernels.geometry import row_geometry
from kvformats_kernels.launch import fast
from kvformats_kernels.rows_jit import locate_slot

__all__ = ["LAUNCHERS", "index_q_quantize", "swa_rope_scatter"]

HEAD_DIM, ROPE_DIM, INDEX_HEAD_DIM = 512, 64, 128
POSITION_RANGE = tl.constexpr(int(deferred.Check.POSITION_RANGE))  # a global the kernels read
# the site SWA_ROPE_SCATTER (kvformats.deepseek_v41.rows) declares for positions, by its names (the
# kernels do not import the model ops): the same id whichever module is imported first
SITE = deferred.site("swa_rope_scatter", "positions")
_MXFP4 = Mxfp4Indexer(head_dim=INDEX_HEAD_DIM, page_size=1, profile="vllm")  # tokenspeed's 'index' row
FP8_SCALE_FLOOR = 1e-6  # tokenspeed's 'index_v4' row: fl32(max(amax, 1e-6) * fl32(1 / 448))

# Rows per program and warps (hw_cvt: the GPU's float8 / bf16 conversions, cm.hw_cvt).
CONFIG = settings.declare("dsv41_rows", {
    "swa_rope_scatter": {"block_m": 2, "num_warps": 4, "hw_cvt": 1},
    "index_q_quantize": {"block_m": 8, "num_warps": 4, "hw_cvt": 1},
})


@triton.jit
def _swa_rope_scatter_kernel(x_ptr, pos_ptr, cs_ptr, slots_ptr, cache_ptr, out_ptr, err_ptr, n_rows, x_stride,
                             pos_stride, cs_stride, cs_rows, slot_stride, capacity, first_slot, page_stride,
                             PAGE_SIZE: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr, QB: tl.constexpr,
                             NB: tl.constexpr, TAIL: tl.constexpr, VAL_OFF: tl.constexpr,
                             VAL_STRIDE: tl.constexpr, SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
                             ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr, PAD_OFF: tl.constexpr,
                             PAD_STRIDE: tl.constexpr, PAD_BYTES: tl.constexpr, PAD_P2: tl.constexpr,
                             FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                             E_MIN: tl.constexpr, E_MAX: tl.constexpr, FF_NAN: tl.constexpr, HW: tl.constexpr,
                             HAS_OUT: tl.constexpr, CLAMP: tl.constexpr, BLOCK_M: tl.constexpr,
                             SITE: tl.constexpr):
    """Tokens [BLOCK_M] of a call: rows x (bf16 bits, int16) rotated at their positions (CLAMP:
    negative ones as 0), rounded to bf16, stored as rows at their slots (skipped outside
    [first_slot, capacity) or at an invalid position) and, with HAS_OUT, decoded into out (bf16
    bits, int16, contiguous [N, D]).

    The row is one [BLOCK_M, D / QB, QB] tile of blocks: all of them scaled (fp8_ds_mla_v41), or
    (TAIL, fp8_ds_mla) the first NB scaled and the last one the RoPE tail (D = (NB + 1) * QB)."""
    NT: tl.constexpr = D // QB
    tl.static_assert((NT == NB) | (TAIL & (NT == NB + 1) & (QB == ROPE)), "blocks tile the row (tail: one)")
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    ok = ok & (slot >= first_slot)  # below it: skipped as negative slots are (tokenspeed's null page)
    pos = tl.load(pos_ptr + rows * pos_stride, mask=in_range, other=0).to(tl.int64)
    if CLAMP:  # negative_positions="clamp": rotated (and checked, recorded) as position 0
        pos = tl.maximum(pos, 0)
    bad = in_range & ((pos < 0) | (pos >= cs_rows))
    pos_ok = in_range & (pos >= 0) & (pos < cs_rows)
    ok = ok & pos_ok
    d = tl.arange(0, D)
    x = nj.load_f32((x_ptr + rows * x_stride)[:, None] + d[None, :], in_range[:, None], True)
    # GPT-J pairs of the tail at each row's position (NoPE pairs and invalid positions pass through)
    k = tl.arange(0, D // 2) - (D - ROPE) // 2
    is_rope = k >= 0
    kk = tl.where(is_rope, k, 0)
    m = pos_ok[:, None] & is_rope[None, :]
    cs_row = (cs_ptr + tl.where(pos_ok, pos, 0) * cs_stride)[:, None]
    cos = tl.load(cs_row + kk[None, :], mask=m, other=1.0)
    sin = tl.load(cs_row + (ROPE // 2) + kk[None, :], mask=m, other=0.0)
    r = tl.where(pos_ok[:, None], tj.rope_apply(x, is_rope, cos, sin, False), x)
    h = nj.bf16_rne_bits(r)  # the rotated row in bf16 (bits)
    xb = tl.reshape(nj.bf16_bits_f32(h), (BLOCK_M, NT, QB))
    e = nj.block_exponent(nj.abs_max(xb, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
    codes = nj.e4m3_code(xb * nj.pow2(-e)[:, :, None], HW)
    blk = tl.arange(0, NT)
    base = page * page_stride
    if TAIL:
        h3 = tl.reshape(h, (BLOCK_M, NT, QB))
        tail = tl.sum(tl.where((blk == NB)[None, :, None], h3, 0), axis=1)  # [BM, ROPE]: the last block
        store_row(cache_ptr, base, row, ok, ok[:, None, None] & (blk < NB)[None, :, None], codes, e, tail, VAL_OFF,
                  VAL_STRIDE, ROPE_OFF, ROPE_STRIDE, SCALE_OFF, SCALE_STRIDE, PAD_OFF, PAD_STRIDE, PAD_BYTES, PAD_P2,
                  NB, ROPE, 0)
    else:
        elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
        tl.store((cache_ptr + base + VAL_OFF + row * VAL_STRIDE)[:, None, None] + elem[None, :, :],
                 codes.to(tl.uint8), mask=ok[:, None, None])
        tl.store((cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE)[:, None] + blk[None, :],
                 nj.ue8m0_byte(e).to(tl.uint8), mask=ok[:, None])
    if HAS_OUT:
        bits = ue8m0_block_bits(codes.to(tl.uint8), nj.ue8m0_byte(e), HW, FF_NAN)
        if TAIL:
            bits = tl.where((blk < NB)[None, :, None], bits, tl.reshape(h, (BLOCK_M, NT, QB)))
        tl.store((out_ptr + rows * D)[:, None] + d[None, :], tl.reshape(bits, (BLOCK_M, D)).to(tl.int16),
                 mask=in_range[:, None])
    rec.record_violation(err_ptr, bad, rows, pos, tl.zeros_like(pos) + cs_rows, POSITION_RANGE, SITE)


@functools.lru_cache(maxsize=64)
def _swa_plan(layout, cfg_items: tuple, hw: bool, has_out: bool, clamp: bool):
    """(tokens per program, the constexprs and launch options) of a layout (fp8_ds_mla_v41 or
    fp8_ds_mla, 512 dims) and launch config; no tensor value or address."""
    cfg = dict(cfg_items)
    g = row_geometry(layout)
    tail = g.has_tail
    geometry = dict(QB=g.block, NB=g.blocks, TAIL=tail, VAL_OFF=g.data.offset, VAL_STRIDE=g.data.stride,
                    SCALE_OFF=g.scale.offset, SCALE_STRIDE=g.scale.stride, ROPE_OFF=g.tail.offset,
                    ROPE_STRIDE=g.tail.stride, PAD_OFF=g.pad.offset, PAD_STRIDE=g.pad.stride,
                    PAD_BYTES=g.pad.nbytes, PAD_P2=cm.next_pow2(g.pad.nbytes))
    return cfg["block_m"], cm.frozen(dict(
        PAGE_SIZE=layout.page_size, D=HEAD_DIM, ROPE=ROPE_DIM, **geometry, **cm.rule_constants(layout.scale_rule),
        **cm.read_constants(layout), HW=hw, HAS_OUT=has_out, CLAMP=clamp, BLOCK_M=cfg["block_m"], SITE=SITE,
        **cm.launch_opts(cfg), enable_fp_fusion=False))


def swa_rope_scatter(values, positions, cos_sin, cache, layout, slots, out, first_slot: int = 0,
                     clamp: bool = False) -> None:
    """``kvformats.deepseek_v41.swa_rope_scatter`` on validated arguments (its reference's:
    ``first_slot`` at most the capacity, ``clamp`` for ``negative_positions="clamp"``)."""
    t = values.shape[0]
    if t == 0:
        return
    x, _ = cm.rows_input(values)
    u8, stride = cm.byte_cache(layout, cache)
    cs = cos_sin if cos_sin.shape[0] <= 1 or cos_sin.stride(1) == 1 else cos_sin.contiguous()
    cfg = CONFIG["swa_rope_scatter"]
    block_m, consts = _swa_plan(layout, tuple(cfg.items()), cm.hw_cvt(cfg), out is not None, bool(clamp))
    fast(_swa_rope_scatter_kernel)[(cm.grid_rows(t, block_m),)](
        x, positions, cs, slots, u8, x if out is None else out.view(torch.int16), deferred.error_record(cache.device),
        t, cm.row_stride(x), positions.stride(0), cs.stride(0), cs.shape[0], slots.stride(0),
        cm.capacity(layout, cache), first_slot, stride, **consts)


@triton.jit
def _index_q_kernel(q_ptr, out_ptr, n_rows, heads, q_stride_t, q_stride_h, D: tl.constexpr, QB: tl.constexpr,
                    MXFP4: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                    E_MIN: tl.constexpr, E_MAX: tl.constexpr, FLOOR_MODE: tl.constexpr, ELEM_EMAX: tl.constexpr,
                    E2M1_RNE: tl.constexpr, E2M1_SIGNED_ZERO: tl.constexpr, FF_NAN: tl.constexpr,
                    RCP: tl.constexpr, HW: tl.constexpr, BLOCK_M: tl.constexpr):
    """Rows [BLOCK_M] of q [T, H, D] (bf16 bits, int16; row r = (r // H, r % H)) quantized and
    dequantized into out (contiguous [T * H, D], bf16 bits). MXFP4: per QB-block exponent of the
    ScaleRule, e2m1 codes (E2M1_RNE, E2M1_SIGNED_ZERO), values e2m1 * 2^e. Else (QB = D): one
    float32 scale s = max(amax, FLOOR) * RCP, e4m3(x / s), values e4m3 * s."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < n_rows
    tok = rows // heads
    head = rows - tok * heads
    d = tl.arange(0, D)
    x = nj.load_f32((q_ptr + tok * q_stride_t + head * q_stride_h)[:, None] + d[None, :], live[:, None], True)
    xb = tl.reshape(x, (BLOCK_M, D // QB, QB))
    amax = nj.abs_max(xb, 2)
    if MXFP4:
        e = nj.block_exponent(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE, ELEM_EMAX)
        codes = nj.e2m1_code(xb * nj.pow2(-e)[:, :, None], E2M1_RNE, E2M1_SIGNED_ZERO)
        v = nj.e2m1_value(codes) * nj.ue8m0_value(nj.ue8m0_byte(e), FF_NAN)[:, :, None]
    else:
        s = nj.max_nan(amax, FLOOR) * tl.full(amax.shape, RCP, tl.float32)
        codes = nj.e4m3_code(tl.math.div_rn(xb, tl.broadcast_to(s[:, :, None], xb.shape)), HW)
        v = nj.e4m3_to_f32(codes.to(tl.uint8), HW) * s[:, :, None]
    bits = nj.bf16_bits(tl.reshape(v, (BLOCK_M, D)), HW)
    tl.store((out_ptr + rows * D)[:, None] + d[None, :], bits.to(tl.int16), mask=live[:, None])


@functools.lru_cache(maxsize=16)
def _index_plan(fmt: str, cfg_items: tuple, hw: bool):
    cfg = dict(cfg_items)
    if fmt == "mxfp4_indexer":
        rule = dict(QB=_MXFP4.QUANT_BLOCK, MXFP4=True, **cm.rule_constants(_MXFP4.scale_rule),
                    **cm.profile_constants(_MXFP4, e2m1=True), **cm.read_constants(_MXFP4), RCP=0.0)
    else:
        rule = dict(QB=INDEX_HEAD_DIM, MXFP4=False, FLOOR=cm.f32(FP8_SCALE_FLOOR), ELEM_MAX=0.0,
                    FLOOR_ON_SCALE=False, E_MIN=0, E_MAX=0, FLOOR_MODE=False, ELEM_EMAX=0, E2M1_RNE=False,
                    E2M1_SIGNED_ZERO=False, FF_NAN=False, RCP=cm.f32(1.0 / 448.0))
    return cfg["block_m"], cm.frozen(dict(D=INDEX_HEAD_DIM, **rule, HW=hw, BLOCK_M=cfg["block_m"],
                                          **cm.launch_opts(cfg), enable_fp_fusion=False))


def index_q_quantize(q, fmt, out) -> None:
    """``kvformats.deepseek_v41.index_q_quantize`` on validated arguments (its reference's)."""
    t, heads, d = q.shape
    n = t * heads
    if n == 0:
        return
    qk = (q if q.stride(2) == 1 else q.contiguous()).view(torch.int16)
    cfg = CONFIG["index_q_quantize"]
    block_m, consts = _index_plan(fmt, tuple(cfg.items()), cm.hw_cvt(cfg))
    fast(_index_q_kernel)[(cm.grid_rows(n, block_m),)](qk, out.view(torch.int16), n, heads, qk.stride(0),
                                                       qk.stride(1), **consts)


LAUNCHERS = {"swa_rope_scatter": swa_rope_scatter, "index_q_quantize": index_q_quantize}


# launch settings change through settings.change
settings.guard(__name__, 'CONFIG')
