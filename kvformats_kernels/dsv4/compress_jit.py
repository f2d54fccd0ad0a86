"""Triton kernel of DeepSeek V4's compressor path (spec/upstream.md §5.3, §2.4, §3.4, §4.5): softmax
pooling of state windows + RMSNorm (pool_jit), then by MODE the float32 row itself (0), or RoPE
and an fp8_ds_mla row (1), or RoPE, the Hadamard rotation and an fp8_indexer (2) / mxfp4_indexer
(3) row.

One kernel per call. A program scans BLOCK_T tokens and works only on those that write (a
device-side test, no host sync). A token's pooling is split into NCHUNK feature chunks of BD:
with NSPLIT == 1 one program pools every chunk; with NSPLIT == NCHUNK each chunk is its own
program (decode-sized HCA calls), the chunks meet in a float32 workspace row, and the program
that completes the row (an atomic counter per token) finishes it. Launch with
``enable_fp_fusion=False``.
"""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels import record_jit as rec
from kvformats_kernels.dsv4 import pool_jit as pj
from kvformats_kernels.dsv4 import transforms_jit as tj


# ----- row tails -----------------------------------------------------------------------------
@triton.jit
def finisher_inputs(weight_ptr, w_stride, cs_ptr, cs_stride, tslot_ptr, tslot_stride, t, rope_pos, ready,
                    H: tl.constexpr, HP: tl.constexpr, ROPE: tl.constexpr, W_BF16: tl.constexpr,
                    MASKED: tl.constexpr):
    """What finishing token t needs besides its pooled row: the RMSNorm weight [HP] as float32,
    the RoPE pairs (is_rope [HP / 2]: pair i of the row is RoPE pair i - (H - ROPE) / 2) with
    their cos / sin at rope_pos, and the target slot. MASKED: loaded only where ``ready`` (a
    program that may not finish issues them before it knows)."""
    k = tl.arange(0, HP)
    w_on = k < H
    pr = tl.arange(0, HP // 2) - (H - ROPE) // 2
    is_rope = (pr >= 0) & (pr < ROPE // 2)
    cs_on = is_rope
    if MASKED:
        w_on = w_on & pj.spread(ready, k)
        cs_on = cs_on & pj.spread(ready, pr)
    w = nj.load_f32(weight_ptr + k * w_stride, w_on, W_BF16)
    row = cs_ptr + rope_pos * cs_stride + tl.where(is_rope, pr, 0)
    cos = tl.load(row, mask=cs_on, other=1.0)
    sin = tl.load(row + ROPE // 2, mask=cs_on, other=0.0)
    slot = tl.load(tslot_ptr + t * tslot_stride).to(tl.int64)
    return w, is_rope, cos, sin, slot


@triton.jit
def store_ds_mla(y, cache_ptr, base, row, H: tl.constexpr, NB: tl.constexpr, QB: tl.constexpr,
                 NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr, ROPE_OFF: tl.constexpr,
                 ROPE_STRIDE: tl.constexpr, SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
                 PAD_OFF: tl.constexpr, PAD_STRIDE: tl.constexpr, PAD_BYTES: tl.constexpr, PAD_P2: tl.constexpr,
                 FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                 E_MIN: tl.constexpr, E_MAX: tl.constexpr, FLOOR_MODE: tl.constexpr, ELEM_EMAX: tl.constexpr,
                 HW: tl.constexpr):
    """fp8_ds_mla row of y [1, HP] (dims beyond H padding; RoPE tail rotated) at byte ``base`` +
    row offsets: NoPE blocks as e4m3 of bf16(y) * 2^-e, ue8m0 scale bytes, zero pad, bf16 tail
    little endian; the encode kernel's arithmetic (with HW its hardware conversions too)."""
    HP: tl.constexpr = y.shape[1]
    NOPE: tl.constexpr = NB * QB
    bits = nj.bf16_bits(y, HW)
    blk = tl.arange(0, HP // QB)  # the NoPE blocks first (HP >= H > NOPE, both multiples of QB)
    j = tl.arange(0, QB)
    nope = blk < NB
    xq = nj.bf16_bits_f32(tl.reshape(bits, (HP // QB, QB)))
    e = nj.block_exponent(nj.abs_max(xq, 1), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE, ELEM_EMAX)
    codes = nj.e4m3_code(xq * nj.pow2(-e)[:, None], HW)
    tl.store(cache_ptr + base + NOPE_OFF + row * NOPE_STRIDE + blk[:, None] * QB + j[None, :], codes.to(tl.uint8),
             mask=nope[:, None])
    s = nj.ue8m0_byte(e)
    tl.store(cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE + blk, s.to(tl.uint8), mask=nope)
    if PAD_BYTES > 0:
        k = tl.arange(0, PAD_P2)
        tl.store(cache_ptr + base + PAD_OFF + row * PAD_STRIDE + k, tl.zeros((PAD_P2,), tl.uint8),
                 mask=k < PAD_BYTES)
    flat = tl.reshape(bits, (HP,))
    k = tl.arange(0, HP)
    tail = (k >= NOPE) & (k < H)
    at = cache_ptr + base + ROPE_OFF + row * ROPE_STRIDE + 2 * (k - NOPE) * tail.to(tl.int32)
    lo_hi = tl.join(flat & 0xFF, (flat >> 8) & 0xFF)  # element k: low byte at 2k, high at 2k + 1
    tl.store(at[:, None] + tl.arange(0, 2)[None, :], lo_hi.to(tl.uint8), mask=tail[:, None])


@triton.jit
def store_indexer(y, had_scale, cache_ptr, base, row, LOG2_H: tl.constexpr, MXFP4: tl.constexpr,
                  NB: tl.constexpr, QB: tl.constexpr,
                  VAL_OFF: tl.constexpr, VAL_STRIDE: tl.constexpr, SCALE_OFF: tl.constexpr,
                  SCALE_STRIDE: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr,
                  FLOOR_ON_SCALE: tl.constexpr, E_MIN: tl.constexpr, E_MAX: tl.constexpr,
                  FLOOR_MODE: tl.constexpr, ELEM_EMAX: tl.constexpr, POW2: tl.constexpr,
                  E2M1_RNE: tl.constexpr, E2M1_SIGNED_ZERO: tl.constexpr):
    """Indexer row of y [1, H]: bf16, Hadamard butterfly, times the float32 scale, bf16 (as
    hadamard_reference), then the fp8_indexer or mxfp4_indexer encode of the encode kernels."""
    z = nj.bf16_round(tj.hadamard_rows(nj.bf16_round(y), LOG2_H) * had_scale)
    x = tl.reshape(z, (NB, QB))
    blk = tl.arange(0, NB)
    if MXFP4:
        e = nj.block_exponent(nj.abs_max(x, 1), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE,
                              ELEM_EMAX)
        codes = nj.e2m1_code(x * nj.pow2(-e)[:, None], E2M1_RNE, E2M1_SIGNED_ZERO)
        lo, hi = tl.split(tl.reshape(codes, (NB, QB // 2, 2)))  # element 2k low nibble, 2k + 1 high
        pair = blk[:, None] * (QB // 2) + tl.arange(0, QB // 2)[None, :]
        tl.store(cache_ptr + base + VAL_OFF + row * VAL_STRIDE + pair, (lo | (hi << 4)).to(tl.uint8))
        s = nj.ue8m0_byte(e)
        tl.store(cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE + blk, s.to(tl.uint8))
    else:
        if POW2:
            e = nj.block_exponent(nj.abs_max(x, 1), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE,
                                  ELEM_EMAX)
            codes = nj.e4m3_bits(x * nj.pow2(-e)[:, None])
            sbits = nj.pow2_bits(e)
        else:
            q = nj.block_scale(nj.abs_max(x, 1), FLOOR, ELEM_MAX, FLOOR_ON_SCALE)
            codes = nj.e4m3_bits(tl.math.div_rn(x, tl.broadcast_to(q[:, None], x.shape)))
            sbits = nj.f32_bits(q)
        elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
        tl.store(cache_ptr + base + VAL_OFF + row * VAL_STRIDE + elem, codes.to(tl.uint8))
        for i in tl.static_range(4):
            tl.store(cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE + 4 * blk + i,
                     ((sbits >> (8 * i)) & 0xFF).to(tl.uint8))


@triton.jit
def compress_kernel(state_ptr, table_ptr, base_ptr, pos_ptr, req_ptr, sslot_ptr, tslot_ptr, weight_ptr, cs_ptr,
                    out_ptr, ws_ptr, cnt_ptr, err_ptr, n_tokens, page_stride, num_pages, t_stride0, t_stride1,
                    table_rows, table_cols, base_stride, pos_stride, req_stride, sslot_stride, tslot_stride, w_stride,
                    cs_stride, cs_rows, out_stride, capacity, eps, had_scale,
                    MODE: tl.constexpr, RATIO: tl.constexpr, H: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr,
                    BD: tl.constexpr, NCHUNK: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_T: tl.constexpr,
                    HAS_BASE: tl.constexpr, W_BF16: tl.constexpr, GPU: tl.constexpr, FAST_DIV: tl.constexpr,
                    ROPE: tl.constexpr,
                    LOG2_H: tl.constexpr, PAGE_SIZE: tl.constexpr, NB: tl.constexpr, QB: tl.constexpr,
                    OFF0: tl.constexpr, STRIDE0: tl.constexpr, OFF1: tl.constexpr, STRIDE1: tl.constexpr,
                    SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr, PAD_OFF: tl.constexpr,
                    PAD_STRIDE: tl.constexpr, PAD_BYTES: tl.constexpr, PAD_P2: tl.constexpr,
                    FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                    E_MIN: tl.constexpr, E_MAX: tl.constexpr, FLOOR_MODE: tl.constexpr, ELEM_EMAX: tl.constexpr,
                    POW2: tl.constexpr, E2M1_RNE: tl.constexpr, E2M1_SIGNED_ZERO: tl.constexpr,
                    HW: tl.constexpr = False, EARLY_INPUTS: tl.constexpr = False,
                    SLOT_SITE: tl.constexpr = 0, POS_SITE: tl.constexpr = 0):
    """Tokens pid * BLOCK_T .. + BLOCK_T; program axis 1 is the feature chunk when NSPLIT > 1.
    Rows are worked on as HP = NCHUNK * BD (a power of two) features, the head dim H first.

    MODE 0 (pool): every token; out float32 [T, H] (row stride out_stride). MODE 1-3
    (inserts): a token writes iff p >= 0, (p + 1) % RATIO == 0, its state slot >= 0, its
    target slot in [0, capacity) and its rope position (p // RATIO) * RATIO is a row of
    cos_sin; out is the target cache's bytes (page stride out_stride). ws: float32 [T, HP].
    A group end whose target slot is >= capacity, or whose rope position is beyond cos_sin, is
    recorded (kvformats.runtime.deferred; SLOT_SITE, POS_SITE) after the stores, by axis-1 program 0: a
    store to the record ahead of them would hold the row loads back.

    HW: the GPU's float8 / bf16 conversions in the fp8_ds_mla row. EARLY_INPUTS (unsplit
    programs): the finisher's inputs load before the window loads, so that their latency
    overlaps (a decode program is one dependent chain), at the cost of registers held through
    the pooling."""
    HP: tl.constexpr = NCHUNK * BD
    pid = tl.program_id(0).to(tl.int64)
    ar = tl.arange(0, BLOCK_T)
    tt = pid * BLOCK_T + ar
    live = tt < n_tokens
    pos = tl.load(pos_ptr + tt * pos_stride, mask=live, other=-1).to(tl.int64)
    if MODE == 0:
        go = live
    else:
        sslot = tl.load(sslot_ptr + tt * sslot_stride, mask=live, other=-1)
        tslot = tl.load(tslot_ptr + tt * tslot_stride, mask=live, other=-1).to(tl.int64)
        go = live & (pos >= 0) & ((pos + 1) % RATIO == 0) & (sslot >= 0) & (tslot >= 0) & (tslot < capacity)
        go = go & ((pos // RATIO) * RATIO < cs_rows)
    i = tl.min(tl.where(go, ar, BLOCK_T), axis=0)
    while i < BLOCK_T:  # over this program's writing tokens
        t = pid * BLOCK_T + i
        p = tl.load(pos_ptr + t * pos_stride).to(tl.int64)
        r = tl.load(req_ptr + t * req_stride).to(tl.int64)
        r_ok = (r >= 0) & (r < table_rows)
        r = r * r_ok.to(tl.int64)
        base_r = 0
        if HAS_BASE:
            base_r = tl.load(base_ptr + r * base_stride, mask=r_ok, other=0).to(tl.int64)
        cidx = tl.arange(0, NCHUNK)
        j = tl.arange(0, BD)
        if NSPLIT == 1 and EARLY_INPUTS:
            w, is_rope, cos, sin, slot = finisher_inputs(weight_ptr, w_stride, cs_ptr, cs_stride, tslot_ptr,
                                                         tslot_stride, t, (p // RATIO) * RATIO, True, H, HP,
                                                         ROPE, W_BF16, False)
        if NSPLIT == 1:
            pooled = tl.zeros((NCHUNK, BD), tl.float32)
            for c in range(NCHUNK):
                part = pj.pool_features(state_ptr, c * BD + j, p, r, r_ok, base_r, table_ptr, t_stride0, t_stride1,
                                        table_cols, num_pages, page_stride, RATIO, H, W, ROWS, GPU,
                                        FAST_DIV)
                pooled = tl.where(cidx[:, None] == c, part[None, :], pooled)
            ready = True
        else:
            c = tl.program_id(1)
            part = pj.pool_features(state_ptr, c * BD + j, p, r, r_ok, base_r, table_ptr, t_stride0, t_stride1,
                                    table_cols, num_pages, page_stride, RATIO, H, W, ROWS, GPU,
                                    FAST_DIV)
            ws_row = ws_ptr + t * HP
            tl.store(ws_row + c * BD + j, part)
            tl.debug_barrier()  # every thread's part is stored before the counter releases it
            ready = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu") == NSPLIT - 1
        if NSPLIT > 1:  # the finisher's other inputs load with its pooled row: one wait, not three
            w, is_rope, cos, sin, slot = finisher_inputs(weight_ptr, w_stride, cs_ptr, cs_stride, tslot_ptr,
                                                         tslot_stride, t, (p // RATIO) * RATIO, ready, H, HP,
                                                         ROPE, W_BF16, True)
            at = cidx[:, None] * BD + j[None, :]
            pooled = tl.load(ws_row + at, mask=pj.spread(ready, at), other=0.0, cache_modifier=".cg")
        if ready:  # this program holds (or completed) the whole pooled row
            if NSPLIT == 1 and not EARLY_INPUTS:  # loaded here, they hold no registers during the pooling
                w, is_rope, cos, sin, slot = finisher_inputs(weight_ptr, w_stride, cs_ptr, cs_stride, tslot_ptr,
                                                             tslot_stride, t, (p // RATIO) * RATIO, ready, H, HP,
                                                             ROPE, W_BF16, False)
            n = pj.rms_weighted(tl.reshape(pooled, (HP,)), w, eps, H, GPU)
            if MODE == 0:
                k = tl.arange(0, HP)[None, :]
                tl.store(out_ptr + t * out_stride + k, n, mask=k < H)
            else:
                y = tj.rope_apply(n, is_rope, cos[None, :], sin[None, :], False)
                base = (slot // PAGE_SIZE) * out_stride
                row = slot % PAGE_SIZE
                if MODE == 1:
                    store_ds_mla(y, out_ptr, base, row, H, NB, QB, OFF0, STRIDE0, OFF1, STRIDE1, SCALE_OFF,
                                 SCALE_STRIDE, PAD_OFF, PAD_STRIDE, PAD_BYTES, PAD_P2, FLOOR, ELEM_MAX,
                                 FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE, ELEM_EMAX, HW)
                else:  # the indexer's head dim is a power of two (HP == H)
                    store_indexer(y, had_scale, out_ptr, base, row, LOG2_H, MODE == 3, NB, QB, OFF0, STRIDE0,
                                  SCALE_OFF, SCALE_STRIDE, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX,
                                  FLOOR_MODE, ELEM_EMAX, POW2, E2M1_RNE, E2M1_SIGNED_ZERO)
        i = tl.min(tl.where(go & (ar > i), ar, BLOCK_T), axis=0)
    if MODE != 0:
        if tl.program_id(1) == 0:
            ends = live & (pos >= 0) & ((pos + 1) % RATIO == 0) & (sslot >= 0) & (tslot >= 0)
            over = ends & (tslot >= capacity)
            rec.record_violation(err_ptr, over, tt, tslot, capacity, 1, SLOT_SITE)
            rope_pos = (pos // RATIO) * RATIO
            rec.record_violation(err_ptr, ends & (tslot < capacity) & (rope_pos >= cs_rows), tt, rope_pos, cs_rows,
                                 2, POS_SITE)
