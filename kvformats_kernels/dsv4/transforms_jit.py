"""Device functions of the DeepSeek V4 transforms, in the reference's exact float32 order.

* ``rope_rows``: GPT-J RoPE on the last ROPE dims of a [BM, D] float32 tile (pairs interleaved),
  ``e cos - o sin`` / ``e sin + o cos`` as two products and one add, like torch's separate
  kernels; launch with ``enable_fp_fusion=False`` so the compiler keeps it that way. NoPE
  dims pass through untouched (a select, so the sign of a zero survives).
* ``hadamard_rows``: the Sylvester butterfly of ``kvformats.deepseek_v4.hadamard_reference``,
  stage for stage (h = 1, 2, ..., D/2: (a, b) -> (a + b, a - b)), so every float32 sum is the
  one the reference makes and the result is bit-identical (a matrix product would sum in
  another order).
* ``rms_rows``: the weightless RMSNorm (callers multiply by a weight).
"""

import triton
import triton.language as tl


@triton.jit
def rope_rows(x, pos, cs_ptr, cs_stride, D: tl.constexpr, ROPE: tl.constexpr, INVERSE: tl.constexpr):
    """x [BM, D] float32 rotated on its last ROPE dims at positions ``pos`` [BM] (int64, valid
    rows of ``cs_ptr``: a float32 cos_sin table [max_pos, ROPE] of [cos | sin] rows)."""
    k = tl.arange(0, D // 2) - (D - ROPE) // 2  # pair index inside the tail (< 0: a NoPE pair)
    is_rope = k >= 0
    kk = tl.where(is_rope, k, 0)
    row = cs_ptr + pos[:, None] * cs_stride
    cos = tl.load(row + kk[None, :], mask=is_rope[None, :], other=1.0)
    sin = tl.load(row + (ROPE // 2) + kk[None, :], mask=is_rope[None, :], other=0.0)
    return rope_apply(x, is_rope, cos, sin, INVERSE)


@triton.jit
def rope_apply(x, is_rope, cos, sin, INVERSE: tl.constexpr):
    """x [BM, D] with its pairs (2i, 2i + 1) rotated by cos / sin [BM, D / 2] where is_rope
    [D / 2] (elsewhere passed through by a select, so the sign of a zero survives)."""
    BM: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    ev, od = tl.split(tl.reshape(x, (BM, D // 2, 2)))
    if INVERSE:  # times -1, not unary minus: compiled, that is 0 - sin, which gives +0 for sin = +0
        sin = sin * -1.0
    ev2 = ev * cos - od * sin
    od2 = ev * sin + od * cos
    ev2 = tl.where(is_rope[None, :], ev2, ev)
    od2 = tl.where(is_rope[None, :], od2, od)
    return tl.reshape(tl.join(ev2, od2), (BM, D))


@triton.jit
def hadamard_rows(y, LOG2_D: tl.constexpr):
    """Unscaled Walsh-Hadamard transform of each row of y [BM, 2^LOG2_D] float32, in the
    reference's butterfly order."""
    BM: tl.constexpr = y.shape[0]
    D: tl.constexpr = 1 << LOG2_D
    for s in tl.static_range(LOG2_D):
        g = tl.permute(tl.reshape(y, (BM, D >> (s + 1), 2, 1 << s)), (0, 1, 3, 2))
        a, b = tl.split(g)
        y = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (BM, D))
    return y


@triton.jit
def rms_rows(x, eps, D: tl.constexpr):
    """x [BM, D] float32 times rsqrt(sum(x^2) / D + eps) per row (the weightless RMSNorm of
    ``kvformats.deepseek_v4.rms_norm``). The mean is a correctly rounded division, as torch's;
    the sum's order is the compiler's, so a result may differ from torch's in the last bits."""
    var = tl.math.div_rn(tl.sum(x * x, axis=1), tl.full((x.shape[0],), D, tl.float32))
    return x * tl.math.rsqrt(var + eps)[:, None]
