"""Triton kernel of the DeepSeek V4 SWA insert (tokenspeed's fused_qnorm_rope_kv_insert,
spec/upstream.md §2.4, §6.1): one launch whose first programs normalise and rotate q in place and
whose last programs rotate the kv rows' RoPE tail and write them as fp8_ds_mla rows. Launch with
``enable_fp_fusion=False``: RoPE's and the RMS sum's products must not fuse into their adds.
"""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels import record_jit as rec
from kvformats_kernels.dsv4 import transforms_jit as tj
from kvformats_kernels.dsv4.query_jit import abs_max_nan, rope_pairs, words_f32
from kvformats_kernels.fp8_ds_mla_jit import store_row
from kvformats_kernels.rows_jit import locate_slot


@triton.jit
def _span_mask(live, N: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr):
    """[BM, N] mask: live rows, columns c with LO <= c < HI (bounds left out where they hold for
    every column, so that the compiler sees a row-uniform mask and vectorizes)."""
    c = tl.arange(0, N)
    m = live[:, None] & (c >= 0)[None, :]
    if LO > 0:
        m = m & (c >= LO)[None, :]
    if HI < N:
        m = m & (c < HI)[None, :]
    return m


@triton.jit
def _load_pairs(row, live, START: tl.constexpr, W: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
                IS_BF16: tl.constexpr, PAIRS: tl.constexpr):
    """(even, odd) float32 [BM, W / 2] of elements START + j (j < W) of the rows at ``row`` [BM],
    0 outside [LO, HI). PAIRS: bf16 read as int32 words (``row`` points at words; START, LO, HI
    even)."""
    BM: tl.constexpr = row.shape[0]
    if PAIRS:
        m = _span_mask(live, W // 2, (LO - START) // 2, (HI - START) // 2)
        w = tl.load(row[:, None] + (START // 2 + tl.arange(0, W // 2))[None, :], mask=m, other=0)
        return words_f32(w)
    else:
        m = _span_mask(live, W, LO - START, HI - START)
        x = nj.load_f32(row[:, None] + (START + tl.arange(0, W))[None, :], m, IS_BF16)
        return tl.split(tl.reshape(x, (BM, W // 2, 2)))


@triton.jit
def _store_pairs(row, live, ev, od, START: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
                 IS_BF16: tl.constexpr, PAIRS: tl.constexpr):
    """Store (even, odd) [BM, W / 2] as elements START + j of the rows, only those in [LO, HI):
    bf16 (round to nearest even, numerics_jit) or float32."""
    BM: tl.constexpr = ev.shape[0]
    W: tl.constexpr = 2 * ev.shape[1]
    if PAIRS:
        m = _span_mask(live, W // 2, (LO - START) // 2, (HI - START) // 2)
        words = nj.bf16_rne_bits(ev) | (nj.bf16_rne_bits(od) << 16)
        tl.store(row[:, None] + (START // 2 + tl.arange(0, W // 2))[None, :], words, mask=m)
    else:
        m = _span_mask(live, W, LO - START, HI - START)
        y = tl.reshape(tl.join(ev, od), (BM, W))
        at = row[:, None] + (START + tl.arange(0, W))[None, :]
        if IS_BF16:
            tl.store(at, nj.bf16_rne_bits(y).to(tl.int16), mask=m)
        else:
            tl.store(at, y, mask=m)


@triton.jit
def _q_rows(q_ptr, pos_ptr, cs_ptr, err_ptr, t, hb, heads, q_stride_t, q_stride_h, pos_stride, cs_stride, cs_rows,
            eps, SITE: tl.constexpr,
            D: tl.constexpr, DT: tl.constexpr, ROPE: tl.constexpr, RT: tl.constexpr, IS_BF16: tl.constexpr,
            PAIRS: tl.constexpr, BLOCK_H: tl.constexpr):
    """q[t, h] <- rope_p(rms(q[t, h])) for heads h of block hb, written back in q's dtype.

    The row is read right-aligned in a DT-wide tile (DT = next power of two of D) for the RMS
    factor (rms_rows's expression: x * rsqrt(sum(x^2) / D + eps)) and written back up to the
    tail; the tail is read again (from L1) as an RT-wide tile and rotated alone, so the
    rotation's products and selects are not spent on the NoPE dims."""
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    live = h < heads
    row = q_ptr + t * q_stride_t + h.to(tl.int64) * q_stride_h  # in q_ptr's units (words if PAIRS)
    # Every load (the row, its tail again, the position, cos / sin) comes before the first store:
    # a load cannot move above a store that may alias it, so each load after one waits on memory.
    ev, od = _load_pairs(row, live, D - DT, DT, 0, D, IS_BF16, PAIRS)
    te, to = _load_pairs(row, live, D - RT, RT, D - ROPE, D, IS_BF16, PAIRS)
    pos = tl.load(pos_ptr + t * pos_stride).to(tl.int64)
    pos_ok = (pos >= 0) & (pos < cs_rows)  # else no table read: the tail is normalised, not rotated
    cs_row = cs_ptr + tl.where(pos_ok, pos, 0) * cs_stride
    var = tl.math.div_rn(tl.sum(ev * ev + od * od, axis=1), tl.full((BLOCK_H,), D, tl.float32))
    r = tl.math.rsqrt(var + eps)[:, None]
    te, to = rope_pairs(te * r, to * r, cs_row, pos_ok, -((RT - ROPE) // 2), ROPE)  # one position per program
    _store_pairs(row, live, ev * r, od * r, D - DT, 0, D - ROPE, IS_BF16, PAIRS)
    _store_pairs(row, live, te, to, D - RT, D - ROPE, D, IS_BF16, PAIRS)
    rec.record_scalar(err_ptr, (hb == 0) & (pos_ok == 0), t, pos, cs_rows, 2, SITE)  # after the stores


@triton.jit
def _kv_rows(kv_ptr, slots_ptr, pos_ptr, cs_ptr, cache_ptr, blk_id, n_kv, kv_stride, slot_stride, pos_stride,
             cs_stride, cs_rows, capacity, page_stride,
             PAGE_SIZE: tl.constexpr, NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr,
             ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr, SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
             PAD_OFF: tl.constexpr, PAD_STRIDE: tl.constexpr, PAD_BYTES: tl.constexpr, PAD_P2: tl.constexpr,
             NB: tl.constexpr, NB_P2: tl.constexpr, QB: tl.constexpr, ROPE: tl.constexpr, RT: tl.constexpr,
             FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
             E_MIN: tl.constexpr, E_MAX: tl.constexpr, IS_BF16: tl.constexpr, BLOCK_KV: tl.constexpr):
    """kv rows t of block blk_id with a slot in [0, capacity): the tail rotated at p and rounded
    to bf16, the NoPE dims bf16-rounded and quantized per QB-block, as one fp8_ds_mla row
    (the arithmetic of fp8_ds_mla_jit.encode_kernel, NaN policy included)."""
    rows = blk_id.to(tl.int64) * BLOCK_KV + tl.arange(0, BLOCK_KV)
    in_range, ok, page, row, _ = locate_slot(slots_ptr, slot_stride, rows, n_kv, capacity, PAGE_SIZE)
    base = page * page_stride
    x_row = kv_ptr + rows * kv_stride

    blk = tl.arange(0, NB_P2)
    elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
    xq = nj.load_f32(x_row[:, None, None] + elem[None, :, :], in_range[:, None, None] & (blk < NB)[None, :, None],
                     IS_BF16)
    # The RoPE tail, right-aligned in an RT-wide tile and rotated at each row's position, is
    # loaded (with its position and cos / sin) before any store, as in the q rows above.
    j = tl.arange(0, RT) - (RT - ROPE)
    mt = in_range[:, None] & (j >= 0)[None, :]
    tail = nj.load_f32(x_row[:, None] + (NB * QB) + j[None, :], mt, IS_BF16)
    pos = tl.load(pos_ptr + rows * pos_stride, mask=in_range, other=0).to(tl.int64)
    pos_ok = (pos >= 0) & (pos < cs_rows)
    ok = ok & pos_ok  # an invalid position writes no row (the q programs record it)
    h = nj.bf16_rne_bits(tj.rope_rows(tail, tl.where(pos_ok, pos, 0), cs_ptr, cs_stride, RT, ROPE, False))
    if not IS_BF16:
        xq = nj.bf16_round(xq)
    e = nj.block_exponent(abs_max_nan(xq, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
    codes = nj.e4m3_bits(xq * nj.pow2(-e)[:, :, None])
    store_row(cache_ptr, base, row, ok, ok[:, None, None] & (blk < NB)[None, :, None], codes, e, h, NOPE_OFF,
              NOPE_STRIDE, ROPE_OFF, ROPE_STRIDE, SCALE_OFF, SCALE_STRIDE, PAD_OFF, PAD_STRIDE, PAD_BYTES, PAD_P2, NB,
              ROPE, RT - ROPE)


@triton.jit
def swa_kernel(q_ptr, kv_ptr, slots_ptr, pos_ptr, cs_ptr, cache_ptr, err_ptr,
               heads, head_blocks, q_programs, n_kv, q_stride_t, q_stride_h, kv_stride, slot_stride, pos_stride,
               cs_stride, cs_rows, capacity, page_stride, eps,
               D: tl.constexpr, DT: tl.constexpr, ROPE: tl.constexpr, RT: tl.constexpr,
               PAGE_SIZE: tl.constexpr, NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr,
               ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr, SCALE_OFF: tl.constexpr,
               SCALE_STRIDE: tl.constexpr, PAD_OFF: tl.constexpr, PAD_STRIDE: tl.constexpr,
               PAD_BYTES: tl.constexpr, PAD_P2: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr,
               QB: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
               E_MIN: tl.constexpr, E_MAX: tl.constexpr, Q_BF16: tl.constexpr, Q_PAIRS: tl.constexpr,
               KV_BF16: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr, SITE: tl.constexpr = 0):
    """Programs [0, q_programs): (token, head block) of q; the rest: blocks of kv rows. A
    position outside [0, cs_rows): q normalised but not rotated, no kv row, recorded (SITE)."""
    pid = tl.program_id(0)
    if pid < q_programs:
        t = pid // head_blocks
        _q_rows(q_ptr, pos_ptr, cs_ptr, err_ptr, t.to(tl.int64), pid - t * head_blocks, heads, q_stride_t,
                q_stride_h, pos_stride, cs_stride, cs_rows, eps, SITE, D, DT, ROPE, RT, Q_BF16, Q_PAIRS, BLOCK_H)
    else:
        _kv_rows(kv_ptr, slots_ptr, pos_ptr, cs_ptr, cache_ptr, pid - q_programs, n_kv, kv_stride, slot_stride,
                 pos_stride, cs_stride, cs_rows, capacity, page_stride, PAGE_SIZE, NOPE_OFF, NOPE_STRIDE, ROPE_OFF,
                 ROPE_STRIDE, SCALE_OFF, SCALE_STRIDE, PAD_OFF, PAD_STRIDE, PAD_BYTES, PAD_P2, NB, NB_P2, QB,
                 ROPE, RT, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, KV_BF16, BLOCK_KV)
