"""Query-side and output-side transforms (spec/upstream.md §4.6, §6.2).

* ``prepare_indexer_q_mxfp4`` / ``prepare_indexer_q_fp8``: RoPE at each token's own position ->
  bf16 -> Hadamard-128 -> bf16 -> MXFP4 (through the mxfp4_indexer codec) or plain FP8, and the
  head weights ``weights * softmax_scale * head_scale``.
* ``inv_rope_fp8_quant``: inverse RoPE of the attention output, then FP8 with a power-of-two scale
  per 128 elements, in the two scale layouts DeepGEMM reads.
"""

from __future__ import annotations

import torch

from kvformats.codec.op import Op
from kvformats.deepseek_v4 import _dispatch as D
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.transforms import hadamard_reference, resolve_for_shapes, rope_tail
from kvformats.dsv4_constants import OUT_SCALE_RULE, round_up
from kvformats.errors import InputError
from kvformats.formats import Mxfp4Indexer
from kvformats.numerics import codes as nx
from kvformats.runtime import deferred

INDEX_HEAD_DIM = 128
_MXFP4 = Mxfp4Indexer(head_dim=INDEX_HEAD_DIM, page_size=1)


# ----- fakes: shapes, dtypes and strides only ------------------------------------------------------
def _fake_weights(index_q):
    return index_q.new_empty(index_q.shape[:2], dtype=torch.float32)


def _fake_q_mxfp4(index_q, *_):
    return (index_q.new_empty((*index_q.shape[:2], index_q.shape[2] // 2), dtype=torch.uint8),
            index_q.new_empty(index_q.shape[:2], dtype=torch.int32), _fake_weights(index_q))


def _fake_q_fp8(index_q, *_):
    return index_q.new_empty(index_q.shape, dtype=torch.float8_e4m3fn), _fake_weights(index_q)


def _fake_inv_rope(o, positions, cos_sin, n_groups, heads_per_group, group, tma_aligned, *_):
    t, _, d = o.shape
    q = o.new_empty((n_groups, t, heads_per_group * d), dtype=torch.float8_e4m3fn).transpose(0, 1)
    per_group = heads_per_group * (1 if tma_aligned else d // group)
    store = o.new_empty((n_groups, per_group, round_up(t, 4)), dtype=torch.int32 if tma_aligned else torch.float32)
    return q, store.permute(2, 0, 1)[:t]


PREPARE_INDEXER_Q_MXFP4 = Op(D.MODEL_FAMILY, "prepare_indexer_q_mxfp4", sites=("positions",), fake=_fake_q_mxfp4)
PREPARE_INDEXER_Q_FP8 = Op(D.MODEL_FAMILY, "prepare_indexer_q_fp8", sites=("positions",), fake=_fake_q_fp8)
# its outputs are the documented DeepGEMM views (of two buffers it allocates): kept as they are
INV_ROPE_FP8_QUANT = Op(D.MODEL_FAMILY, "inv_rope_fp8_quant", sites=("positions",), fake=_fake_inv_rope,
                        keep_layout=True)


def _check_positions(positions, cos_sin, check) -> None:
    if deferred.on_host(check, positions):
        C.check_positions_in_table(positions, cos_sin)


def _prepare(op: Op, index_q, positions, cos_sin, weights, softmax_scale, head_scale, backend, check):
    """A query prep: its inputs validated (weights taken as ``[T, H]``), then ``op``'s
    implementation run on them."""
    device = index_q.device if isinstance(index_q, torch.Tensor) else None
    C.check_tensor("index_q", index_q, dtypes=C.FLOAT_DTYPES, shape=(None, None, INDEX_HEAD_DIM), device=device)
    t, h, _ = index_q.shape
    C.check_index("positions", positions, t, device)
    rope_dim = C.check_cos_sin(cos_sin, device)
    if rope_dim > INDEX_HEAD_DIM:
        raise InputError(f"rope_dim {rope_dim} exceeds the indexer head dim {INDEX_HEAD_DIM}")
    if isinstance(weights, torch.Tensor) and weights.dim() == 3 and weights.shape[2] == 1:
        weights = weights.squeeze(2)
    C.check_tensor("weights", weights, dtypes=C.FLOAT_DTYPES, shape=(t, h), device=device)
    C.check_float("softmax_scale", softmax_scale, minimum=float("-inf"))
    C.check_float("head_scale", head_scale, minimum=float("-inf"))
    _check_positions(positions, cos_sin, check)
    fn = op.resolve(backend, index_q.device)
    return fn(index_q, positions, cos_sin, weights, float(softmax_scale), float(head_scale))


def _rotated(index_q, positions, cos_sin, op: Op) -> torch.Tensor:
    """bf16 ``[T, H, 128]``: Hadamard(bf16(rope_p(q))); a token at an invalid position unrotated
    and recorded (the public function checked on the host where its mode asks)."""
    rotated = rope_tail(index_q, positions, cos_sin, check=False, site=op.site("positions"))
    return hadamard_reference(rotated, INDEX_HEAD_DIM ** -0.5)


def _head_weights(weights, softmax_scale, head_scale) -> torch.Tensor:
    return weights.float() * softmax_scale * head_scale


@PREPARE_INDEXER_Q_MXFP4.public
def prepare_indexer_q_mxfp4(index_q: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                            weights: torch.Tensor, softmax_scale: float, head_scale: float, *,
                            backend: str = "auto",
                            check: bool | str = True) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Indexer queries for DeepGEMM's MXFP4 logits.

    ``index_q [T, H, 128]`` (bf16; other float dtypes are rounded to bf16 after RoPE),
    ``positions [T]``, ``weights [T, H]`` or ``[T, H, 1]``. Returns
    ``((q_packed uint8 [T, H, 64], q_scale int32 [T, H]), weights_out float32 [T, H])``:
    packed e2m1 nibbles (element 2k low) and the four ue8m0 block scales as one little-endian
    int32 (block 0 in the low byte); ``weights_out = (weights * softmax_scale) * head_scale``.

    ``check`` (True, False or "strict"; ``spec/checks.md``): positions outside the cos/sin
    table raise before anything is computed on CPU tensors and in strict mode; on a GPU they are
    not read on the host: such a token's outputs are computed unrotated (cos 1, sin 0) and the
    violation is recorded for ``kvformats.raise_pending``.
    """
    return _prepare(PREPARE_INDEXER_Q_MXFP4, index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale,
                    backend, check)


@PREPARE_INDEXER_Q_MXFP4.reference
def prepare_indexer_q_mxfp4_reference(index_q, positions, cos_sin, weights, softmax_scale, head_scale):
    t, h, d = index_q.shape
    rows = _MXFP4.encode_rows(_rotated(index_q, positions, cos_sin, PREPARE_INDEXER_Q_MXFP4).reshape(t * h, d))
    packed = rows[:, :d // 2].reshape(t, h, d // 2)
    scales = rows[:, d // 2:].contiguous().view(torch.int32).reshape(t, h)
    return (packed, scales), _head_weights(weights, softmax_scale, head_scale)


@PREPARE_INDEXER_Q_FP8.public
def prepare_indexer_q_fp8(index_q: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                          weights: torch.Tensor, softmax_scale: float, head_scale: float, *,
                          backend: str = "auto", check: bool | str = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer queries for DeepGEMM's FP8 logits (tokenspeed HEAD, SM90 path).

    Same inputs as ``prepare_indexer_q_mxfp4``. Returns ``(q_fp8 float8_e4m3fn [T, H, 128],
    weights_out float32 [T, H])`` with ``q_fp8 = fp8(Hadamard(bf16(rope_p(q))))`` and no scale.
    Values beyond ±448 saturate to ±448 (tokenspeed's unclamped cast would give NaN there).
    ``check`` as in ``prepare_indexer_q_mxfp4``.
    """
    return _prepare(PREPARE_INDEXER_Q_FP8, index_q, positions, cos_sin_cache, weights, softmax_scale, head_scale,
                    backend, check)


@PREPARE_INDEXER_Q_FP8.reference
def prepare_indexer_q_fp8_reference(index_q, positions, cos_sin, weights, softmax_scale, head_scale):
    q = nx.e4m3_encode(_rotated(index_q, positions, cos_sin, PREPARE_INDEXER_Q_FP8).float()).view(torch.float8_e4m3fn)
    return q, _head_weights(weights, softmax_scale, head_scale)


@INV_ROPE_FP8_QUANT.public
def inv_rope_fp8_quant(o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, *, n_groups: int,
                       heads_per_group: int, quant_group_size: int = 128, tma_aligned_scales: bool = True,
                       backend: str = "auto", check: bool | str = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-RoPE the attention output and quantize it to FP8 for the output projection.

    ``o [T, n_groups * heads_per_group, D]`` (bf16/fp16/fp32; D = nope + rope_dim with the RoPE
    dims last, rope_dim = ``cos_sin_cache.shape[1]``). Per (token, head): inverse GPT-J rotation
    of the tail at p in float32 (not re-rounded); per ``quant_group_size`` elements
    ``e = ceil(log2(max(amax, 1e-10) / 448))``, bytes ``fp8(clamp(x * 2^-e, ±448))``.

    Returns ``(q, scales)``: ``q`` float8_e4m3fn ``[T, G, Hg * D]``, a transposed view of a
    contiguous ``[G, T, Hg * D]`` buffer. ``scales`` are stored token-fastest with T padded to a
    multiple of 4 (padding zero): with ``tma_aligned_scales`` int32 ``[T, G, Hg]`` (each word packs
    the ``e + 127`` bytes of one head's groups, group c in byte c; needs D / group == 4), else
    float32 ``[T, G, Hg * D / group]`` holding ``2^e``.

    The Triton kernel takes power-of-two groups of at most 128 that hold the whole RoPE tail
    (DeepSeek V4's 128-groups with a 64-dim tail): other groups run the reference under
    ``backend="auto"`` and raise BackendUnavailableError under ``backend="triton"``.

    ``check`` (True, False or "strict"; ``spec/checks.md``): positions outside the cos/sin
    table raise before anything is computed on CPU tensors and in strict mode; on a GPU they are
    not read on the host: such a token's outputs are computed unrotated (cos 1, sin 0) and the
    violation is recorded for ``kvformats.raise_pending``.
    """
    device = o.device if isinstance(o, torch.Tensor) else None
    C.check_int("n_groups", n_groups, minimum=1)
    C.check_int("heads_per_group", heads_per_group, minimum=1)
    C.check_int("quant_group_size", quant_group_size, minimum=1)
    C.check_tensor("o", o, dtypes=C.FLOAT_DTYPES, shape=(None, n_groups * heads_per_group, None), device=device)
    d = o.shape[2]
    C.check_index("positions", positions, o.shape[0], device)
    rope_dim = C.check_cos_sin(cos_sin_cache, device)
    if d % quant_group_size or rope_dim >= d:
        raise InputError(f"head dim {d} must be a multiple of quant_group_size {quant_group_size} and exceed "
                         f"rope_dim {rope_dim}")
    if tma_aligned_scales and d // quant_group_size != 4:
        raise InputError(f"tma_aligned_scales packs 4 group exponents per head into an int32: needs "
                         f"D / quant_group_size == 4, got {d} / {quant_group_size}")
    _check_positions(positions, cos_sin_cache, check)
    args = (o, positions, cos_sin_cache, n_groups, heads_per_group, quant_group_size, bool(tma_aligned_scales))
    return resolve_for_shapes(INV_ROPE_FP8_QUANT, backend, o.device, args)(*args)


@INV_ROPE_FP8_QUANT.reference
def inv_rope_fp8_quant_reference(o, positions, cos_sin, n_groups, heads_per_group, group, tma_aligned):
    t, heads, d = o.shape
    blocks = rope_tail(o, positions, cos_sin, inverse=True, check=False,
                       site=INV_ROPE_FP8_QUANT.site("positions")).reshape(t, heads, d // group, group)
    e = OUT_SCALE_RULE.exponents(blocks)  # [T, heads, D / group]
    values = nx.e4m3_quantize_blocks(blocks, e).view(torch.float8_e4m3fn)
    buf = values.reshape(t, n_groups, heads_per_group * d).transpose(0, 1).contiguous()
    t_pad = -(-t // 4) * 4
    if tma_aligned:
        words = nx.ue8m0_encode(e).contiguous().view(torch.int32).reshape(t, heads)
    else:
        words = nx.pow2(e).reshape(t, heads * (d // group))
    per_group = words.shape[1] // n_groups
    store = torch.zeros((n_groups, per_group, t_pad), dtype=words.dtype, device=o.device)
    store[:, :, :t] = words.reshape(t, n_groups, per_group).permute(1, 2, 0)
    return buf.transpose(0, 1), store.permute(2, 0, 1)[:t]
