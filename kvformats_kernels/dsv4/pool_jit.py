"""Device functions of the compressor-state pooling (spec/upstream.md §5.3): window rows through the
block table, the softmax-weighted sum over the window, and the RMSNorm sum of squares.

Numerics follow the torch reference operation by operation: libdevice exp and rsqrt and
correctly rounded divisions on the GPU (GPU=True), plain products (launch with
``enable_fp_fusion=False``), and, where cheap, the summation order torch's own kernels use:
  * CSA windows (8 rows, kept as 8 row vectors): the softmax sum runs row by row; the weighted
    sum, on the GPU, is torch's reduce of 4 interleaved accumulators ((r0 + r4) + (r1 + r5) ...),
    on the CPU a row-by-row sum;
  * the RMSNorm sum of squares, on the GPU, is torch's reduce over the last dim for >= 16 rows
    (32 lanes of 4-wide vectors, then a shuffle tree) when h is 128, 256 or 512;
  * HCA windows (128 rows) reduce as tiles in the compiler's order, so an fp32 sum may differ
    from torch's in the last bit (rare one-code flips after rounding, spec/upstream.md §2.5).
"""

import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:  # Triton releases before the backend-neutral alias
    from triton.language.extra.cuda import libdevice


MASKED_SCORE = tl.constexpr(-1.0e30)  # the reference's score of a missing window row (weight exactly 0)
# Softmax weights divide by div_by (same bits as div_rn, fewer instructions) where every weight
# of a tile is exp(s - max) >= exp(-41) > 2^-60 and the sums are at most 2^60 (not NaN); else by div_rn.
MIN_LOGIT = tl.constexpr(-41.0)
DIV_HI = tl.constexpr(2.0 ** 60)


@triton.jit
def exp_f32(x, GPU: tl.constexpr):
    if GPU:  # tl.exp is ex2.approx on the GPU; torch calls expf (= libdevice __nv_expf)
        return libdevice.exp(x)
    else:  # the interpreter has no libdevice
        return tl.exp(x)


@triton.jit
def rsqrt_f32(x, GPU: tl.constexpr):
    if GPU:
        return libdevice.rsqrt(x)
    else:
        return tl.math.rsqrt(x)


@triton.jit
def recip_for_div(b):
    """The reciprocal estimate of sm_90's div.rn.f32 fast path (MUFU.RCP and one Newton step,
    as ptxas emits them), for ``div_by`` (GPU only)."""
    return tl.inline_asm_elementwise(
        "{\n.reg .f32 r, t;\nrcp.approx.ftz.f32 r, $1;\nneg.f32 t, $1;\nfma.rn.f32 t, t, r, 0f3F800000;\n"
        "fma.rn.f32 $0, r, t, r;\n}", "=f,f", [b], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def div_by(a, b, y):
    """a / b correctly rounded (div_rn's bits) for y = recip_for_div(b), when a and b lie in
    [2^-60, 2^60] (callers check; outside, use div_rn).

    sm_90's div.rn.f32 is: y as recip_for_div, q0 = a * y, r = fma(-b, q0, a), q = fma(y, r,
    q0), then FCHK sends operands whose exponents could make that wrong to a slow subroutine;
    with the call's register shuffling one division takes ~10 instructions on the fast path.
    Dividing many values by one b, y is made once and each value costs these three. In the
    range above neither quotient nor remainder can under- or overflow, and the sequence is
    the fast path's own; tests/kernels/test_pool_division.py compares it with div_rn on the GPU."""
    q0 = a * y  # launched with enable_fp_fusion=False: a plain product, as the fast path's FFMA(a, y, 0)
    return tl.fma(y, tl.fma(-b, q0, a), q0)


@triton.jit
def max_min(a0, a1, b0, b1):
    """Combine of a (max, min) reduction (tl.reduce over a pair of tensors)."""
    return tl.maximum(a0, b0), tl.minimum(a1, b1)


# ----- window rows ---------------------------------------------------------------------------
@triton.jit
def spread(flag, like):
    """Scalar bool ``flag`` as a bool tensor shaped like ``like``. (The interpreter turns
    ``vector & scalar`` of bools into int32 and then rejects it as a load mask.)"""
    return (like * 0 + flag.to(tl.int32)) != 0


@triton.jit
def window_rows(o, p, r, r_ok, base_r, table_ptr, t_stride0, t_stride1, table_cols, num_pages, page_stride,
                L: tl.constexpr, ROWS: tl.constexpr, ROW_FLOATS: tl.constexpr):
    """(valid, float offset of the state row) of window position ``o`` (scalar or vector) of the
    window ending at p: position q = p - L + 1 + o is valid when q >= 0, its page index
    q // ROWS - base lies in the table row r (r_ok) and the entry is in [0, num_pages).
    Invalid rows get offset 0 (multiplied by the mask: no int64 select)."""
    q = p - (L - 1) + o
    qs = tl.maximum(q, 0)
    pidx = qs // ROWS - base_r
    inside = (q >= 0) & (pidx >= 0) & (pidx < table_cols) & spread(r_ok, q)
    pidx = pidx * inside.to(tl.int64)
    entry = tl.load(table_ptr + r * t_stride0 + pidx * t_stride1, mask=inside, other=-1).to(tl.int64)
    ok = inside & (entry >= 0) & (entry < num_pages)
    return ok, (entry * page_stride + (qs % ROWS) * ROW_FLOATS) * ok.to(tl.int64)


@triton.jit
def csa_row(state_ptr, d, p, r, r_ok, base_r, table_ptr, t_stride0, t_stride1, table_cols, num_pages,
            page_stride, O: tl.constexpr, COL: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
            ROWS: tl.constexpr, ROW_FLOATS: tl.constexpr):
    """(kv, score) [BD] of row O of the 8-row overlapping window; COL is 0 for the older four
    rows (first half of their state row) and H for the newer four (second half)."""
    ok, off = window_rows(O, p, r, r_ok, base_r, table_ptr, t_stride0, t_stride1, table_cols, num_pages,
                          page_stride, 8, ROWS, ROW_FLOATS)
    at = state_ptr + off + COL + d
    okv = spread(ok, d) & (d < H)
    kv = tl.load(at, mask=okv, other=0.0)
    score = tl.load(at + W, mask=okv, other=MASKED_SCORE)
    return kv, score


@triton.jit
def div4(a0, a1, a2, a3, b):
    """a0 / b .. a3 / b, correctly rounded (div_rn)."""
    return tl.math.div_rn(a0, b), tl.math.div_rn(a1, b), tl.math.div_rn(a2, b), tl.math.div_rn(a3, b)


@triton.jit
def pool_csa(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, H: tl.constexpr,
             W: tl.constexpr, ROWS: tl.constexpr, RF: tl.constexpr, GPU: tl.constexpr, FAST_DIV: tl.constexpr):
    """Softmax-pooled features ``d`` [BD] of the 8-row CSA window (ratio 4) ending at p, every
    float32 operation in the reference's order (each window row is its own vector)."""
    kv0, s0 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 0, 0, H, W, ROWS, RF)
    kv1, s1 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 1, 0, H, W, ROWS, RF)
    kv2, s2 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 2, 0, H, W, ROWS, RF)
    kv3, s3 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 3, 0, H, W, ROWS, RF)
    kv4, s4 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 4, H, H, W, ROWS, RF)
    kv5, s5 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 5, H, H, W, ROWS, RF)
    kv6, s6 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 6, H, H, W, ROWS, RF)
    kv7, s7 = csa_row(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, 7, H, H, W, ROWS, RF)
    m = tl.maximum(tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3)),
                   tl.maximum(tl.maximum(s4, s5), tl.maximum(s6, s7)))
    e0 = exp_f32(s0 - m, GPU)
    e1 = exp_f32(s1 - m, GPU)
    e2 = exp_f32(s2 - m, GPU)
    e3 = exp_f32(s3 - m, GPU)
    e4 = exp_f32(s4 - m, GPU)
    e5 = exp_f32(s5 - m, GPU)
    e6 = exp_f32(s6 - m, GPU)
    e7 = exp_f32(s7 - m, GPU)
    total = (((((((e0 + e1) + e2) + e3) + e4) + e5) + e6) + e7)
    fast = False
    if GPU and FAST_DIV:
        least = tl.minimum(tl.minimum(tl.minimum(s0, s1), tl.minimum(s2, s3)),
                           tl.minimum(tl.minimum(s4, s5), tl.minimum(s6, s7)))
        fast = tl.min(((least - m >= MIN_LOGIT) & (total <= DIV_HI)).to(tl.int32), axis=0) == 1
    if fast:
        y = recip_for_div(total)
        w0 = div_by(e0, total, y)
        w1 = div_by(e1, total, y)
        w2 = div_by(e2, total, y)
        w3 = div_by(e3, total, y)
        w4 = div_by(e4, total, y)
        w5 = div_by(e5, total, y)
        w6 = div_by(e6, total, y)
        w7 = div_by(e7, total, y)
    else:
        w0, w1, w2, w3 = div4(e0, e1, e2, e3, total)
        w4, w5, w6, w7 = div4(e4, e5, e6, e7, total)
    p0 = kv0 * w0
    p1 = kv1 * w1
    p2 = kv2 * w2
    p3 = kv3 * w3
    p4 = kv4 * w4
    p5 = kv5 * w5
    p6 = kv6 * w6
    p7 = kv7 * w7
    if GPU:  # torch's CUDA reduce: 4 accumulators (rows i, i + 4) from 0, then combined in order
        return ((((0.0 + p0) + p4) + ((0.0 + p1) + p5)) + ((0.0 + p2) + p6)) + ((0.0 + p3) + p7)
    else:  # torch's CPU sum over a strided dim: one accumulator from 0
        return (((((((0.0 + p0) + p1) + p2) + p3) + p4) + p5) + p6) + p7


@triton.jit
def pool_tile(state_ptr, d, p, r, r_ok, base_r, table_ptr, t_stride0, t_stride1, table_cols, num_pages,
              page_stride, L: tl.constexpr, H: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr,
              ROW_FLOATS: tl.constexpr, GPU: tl.constexpr, FAST_DIV: tl.constexpr):
    """Softmax-pooled features ``d`` [BD] of the L-row (non-overlapping) window ending at p, as
    one [L, BD] tile (sums in the compiler's order)."""
    ok, off = window_rows(tl.arange(0, L), p, r, r_ok, base_r, table_ptr, t_stride0, t_stride1, table_cols,
                          num_pages, page_stride, L, ROWS, ROW_FLOATS)
    at = state_ptr + off[:, None] + d[None, :]
    m = ok[:, None] & (d < H)[None, :]
    kv = tl.load(at, mask=m, other=0.0)
    score = tl.load(at + W, mask=m, other=MASKED_SCORE)
    if GPU and FAST_DIV:
        peak, least = tl.reduce((score, score), 0, max_min)
    else:
        peak = tl.max(score, axis=0)
    e = exp_f32(score - peak[None, :], GPU)
    sums = tl.sum(e, axis=0)
    total = tl.broadcast_to(sums[None, :], e.shape)
    fast = False
    if GPU and FAST_DIV:
        fast = tl.min(((least - peak >= MIN_LOGIT) & (sums <= DIV_HI)).to(tl.int32), axis=0) == 1
    if fast:
        w = div_by(e, total, tl.broadcast_to(recip_for_div(sums)[None, :], e.shape))
    else:
        w = tl.math.div_rn(e, total)
    return tl.sum(kv * w, axis=0)


# ----- sum of squares in torch's order ---------------------------------------------------------
@triton.jit
def seq4(v, RANK: tl.constexpr):
    """((v0 + v1) + v2) + v3 over the last dim (size 4) of a RANK-2 or RANK-3 tile."""
    if RANK == 2:
        b0, b1 = tl.split(tl.reshape(v, (v.shape[0], 2, 2)))
    else:
        b0, b1 = tl.split(tl.reshape(v, (v.shape[0], v.shape[1], 2, 2)))
    x0, x2 = tl.split(b0)
    x1, x3 = tl.split(b1)
    return ((x0 + x1) + x2) + x3


@triton.jit
def tree32(v):
    """Sum of v [32] as a warp's shuffle-down tree (offsets 1, 2, 4, 8, 16) leaves it in lane 0
    -> [1]."""
    a, b = tl.split(tl.reshape(v, (16, 2)))
    v = a + b
    a, b = tl.split(tl.reshape(v, (8, 2)))
    v = a + b
    a, b = tl.split(tl.reshape(v, (4, 2)))
    v = a + b
    a, b = tl.split(tl.reshape(v, (2, 2)))
    v = a + b
    a, b = tl.split(tl.reshape(v, (1, 2)))
    return a + b


@triton.jit
def sum_squares(x, H: tl.constexpr, GPU: tl.constexpr):
    """sum(x * x) of x [HP] (zeros beyond H) -> [1]. On the GPU for H = 128 / 256 / 512 in the order of torch's
    CUDA reduce of a row (>= 16 rows per call): 32 lanes; H = 128 lane l sums x[l + 32k],
    k = 0..3; H > 128 (4-wide vector loads) lane l keeps 4 accumulators over the vectors
    l, l + 32, ... then adds them; the lanes then meet in a shuffle tree."""
    sq = x * x
    HP: tl.constexpr = x.shape[0]
    if GPU and HP == H and H == 128:
        lanes = seq4(tl.permute(tl.reshape(sq, (4, 32)), (1, 0)), 2)
        return tree32(lanes)
    elif GPU and HP == H and (H == 256 or H == 512):
        v = tl.permute(tl.reshape(sq, (H // 128, 32, 4)), (1, 2, 0))  # [lane, i, k]
        if H == 256:
            k0, k1 = tl.split(v)
            acc = k0 + k1
        else:
            acc = seq4(v, 3)
        return tree32(seq4(acc, 2))
    else:
        return tl.zeros((1,), tl.float32) + tl.sum(sq, axis=0)


@triton.jit
def pool_features(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, RATIO: tl.constexpr,
                  H: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr, GPU: tl.constexpr, FAST_DIV: tl.constexpr):
    """Softmax-pooled features ``d`` [BD] of the window ending at position p of request r
    (features d >= H, the padding of a head dim that is not a power of two, pool to 0)."""
    if RATIO == 4:
        return pool_csa(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, H, W, ROWS, 2 * W,
                        GPU, FAST_DIV)
    else:
        return pool_tile(state_ptr, d, p, r, r_ok, base_r, tab, ts0, ts1, cols, pages, stride, RATIO, H, W, ROWS,
                         2 * W, GPU, FAST_DIV)


@triton.jit
def rms_weighted(x, w, eps, H: tl.constexpr, GPU: tl.constexpr):
    """x [HP] (zeros beyond H), weight w [HP] float32 -> [1, HP]: (x * rsqrt(sum(x^2) / H +
    eps)) * w, as kvformats.deepseek_v4.rms_norm; zeros beyond H where w is."""
    var = tl.math.div_rn(sum_squares(x, H, GPU), tl.full((1,), H, tl.float32))
    scale = rsqrt_f32(var + eps, GPU)
    return (x[None, :] * scale[:, None]) * w[None, :]
