"""Softmax pooling of compressor-state windows + RMSNorm (spec/upstream.md §5.3), shared by the CSA /
HCA compressed-KV inserts and the CSA indexer insert.

For a token at position p the window is the ``L`` positions ``p - L + 1 .. p`` with ``L = ratio``
(HCA) or ``2 * ratio`` (CSA, overlapping). With overlap the older ``ratio`` positions contribute
the first half of their state row and the newer ``ratio`` positions the second half. Per
feature d: ``w = softmax_o(score[o, d])``, ``c_d = sum_o w[o, d] * kv[o, d]``, then
``n = c * rsqrt(sum(c^2) / h + eps) * weight``. A window position is missing when it is
negative or its page is not in the state group's block table (index out of range, entry < 0,
entry beyond the cache); it scores -1e30 (like tokenspeed's torch path, so its weight is exactly 0
next to any real score) and contributes kv 0. When every position is missing the pooled vector
is 0 and so is the normed one (tokenspeed's Triton kernel would give NaN).
"""

from __future__ import annotations

import torch

from kvformats.codec.blocktable import table_slots
from kvformats.codec.op import Op
from kvformats.deepseek_v4 import _dispatch as D
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.transforms import rms_norm

MASKED_SCORE = -1.0e30

# Not replayed, as before it was declared: no engine step calls it (the inserts pool in their own
# kernels); quality checks do (kvformats.dsv4_layer.quality).
POOL_COMPRESSOR_STATE = Op(D.MODEL_FAMILY, "pool_compressor_state", replay=False,
                           fake=lambda state, ratio, positions, req, table, weight, *_:
                           state.new_empty((positions.shape[0], weight.shape[0]), dtype=torch.float32))


def window_slots(state_cache, ratio: int, positions, req_indices, block_table, base_offsets) -> torch.Tensor:
    """int64 ``[T, L]`` state slots of every window position (−1 where missing)."""
    L = ratio * C.halves(ratio)
    offsets = torch.arange(L, device=positions.device, dtype=torch.int64)
    q = positions.long()[:, None] - L + 1 + offsets[None, :]
    return table_slots(block_table, req_indices, q, state_cache.shape[1], base_offsets, state_cache.shape[0])


def _take(state_cache, slots, col: int, width: int) -> torch.Tensor:
    """float32 ``[T, k, width]``: columns ``col .. col + width`` of the state rows at ``slots``."""
    safe = slots.clamp_min(0)
    rows = state_cache.shape[1]
    return state_cache[:, :, col:col + width][safe // rows, safe % rows]


@POOL_COMPRESSOR_STATE.reference
def pool_reference(state_cache, ratio: int, positions, req_indices, block_table, base_offsets,
                   weight, eps: float) -> torch.Tensor:
    """float32 ``[T, h]``: pooled and normed windows ending at each position (inputs validated)."""
    h = weight.shape[0]
    w_state = state_cache.shape[2] // 2
    slots = window_slots(state_cache, ratio, positions, req_indices, block_table, base_offsets)
    if ratio == 4:  # older half-window: first halves; newer: second halves
        old, new = slots[:, :ratio], slots[:, ratio:]
        kv = torch.cat((_take(state_cache, old, 0, h), _take(state_cache, new, h, h)), dim=1)
        score = torch.cat((_take(state_cache, old, w_state, h), _take(state_cache, new, w_state + h, h)), dim=1)
    else:
        kv, score = _take(state_cache, slots, 0, h), _take(state_cache, slots, w_state, h)
    missing = (slots < 0).unsqueeze(-1)
    score = score.masked_fill(missing, MASKED_SCORE)
    kv = kv.masked_fill(missing, 0.0)
    pooled = (kv * torch.softmax(score, dim=1)).sum(dim=1)
    return rms_norm(pooled, weight, eps)


@POOL_COMPRESSOR_STATE.public
def pool_compressor_state(state_cache: torch.Tensor, *, ratio: int, positions: torch.Tensor,
                          req_indices: torch.Tensor, block_table: torch.Tensor, rms_weight: torch.Tensor,
                          rms_eps: float, block_table_base_offsets: torch.Tensor | None = None,
                          backend: str = "auto", check: bool | str = True) -> torch.Tensor:
    """Pool and RMS-normalise the compressor-state window ending at each token -> float32 ``[T, h]``.

    Args:
        state_cache: float32 ``[pages, rows_per_page, 2 * W]`` (``W = 2h`` for ratio 4, ``h`` for 128).
        ratio: 4 (CSA, overlapping windows of 8) or 128 (HCA, windows of 128).
        positions: int ``[T]`` absolute positions.
        req_indices: int ``[T]`` request rows of ``block_table``.
        block_table: int ``[R, max_pages]`` of the state group; ``block_table_base_offsets`` int
            ``[R]``: logical page of column 0 (sliding-window groups).
        rms_weight: ``[h]`` norm weight (any float dtype, used in float32); ``rms_eps``: its epsilon.

    Generic in ``h`` (spec/upstream.md §12 C uses h = 2). Every token is pooled, group end or not.
    No value of these inputs is invalid (a missing page leaves its rows out of the window):
    ``check`` (spec/checks.md) is validated and changes nothing.
    """
    C.check_mode(check)
    device = state_cache.device if isinstance(state_cache, torch.Tensor) else None
    C.check_tensor("rms_weight", rms_weight, dtypes=C.FLOAT_DTYPES, shape=(None,), device=device)
    C.state_layout(state_cache, ratio, rms_weight.shape[0])
    n = C.check_index("positions", positions, None, device)
    C.check_index("req_indices", req_indices, n, device)
    C.check_table(block_table, None, device, block_table_base_offsets)
    eps = C.check_float("rms_eps", rms_eps)
    fn = POOL_COMPRESSOR_STATE.resolve(backend, state_cache.device)
    return fn(state_cache, ratio, positions, req_indices, block_table, block_table_base_offsets, rms_weight, eps)
