"""GPT-J (interleaved-pair) rotary embedding on the tail dims, as DeepSeek V4 applies it.

The cache formats store the RoPE tail already rotated; these helpers make that input (and the
golden vectors) reproducible. Math in float32, like every writer in formats.md §0.
"""

from __future__ import annotations

import torch


def cos_sin_cache(rope_dim: int, max_positions: int, base: float = 10000.0) -> torch.Tensor:
    """float32 ``[max_positions, rope_dim]``: row p = [cos(p f_i) | sin(p f_i)], f_i = base^(-2i/rope_dim),
    computed in float64 then rounded to float32."""
    half = rope_dim // 2
    freqs = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / rope_dim)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)


def rope_tail(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, *,
              inverse: bool = False) -> torch.Tensor:
    """Rotate the last ``cos_sin.shape[1]`` dims of ``x [N, ..., D]`` at ``positions [N]`` -> float32.

    Pair i is (x[nope + 2i], x[nope + 2i + 1]); forward: e' = e cos - o sin, o' = e sin + o cos;
    ``inverse`` undoes it. The NoPE dims pass through (as float32).
    """
    rope_dim = cos_sin.shape[1]
    half = rope_dim // 2
    out = x.float().clone()
    cos = cos_sin[positions.long(), :half].float()
    sin = cos_sin[positions.long(), half:rope_dim].float()
    while cos.dim() < out.dim():
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if inverse:
        sin = -sin
    nope = x.shape[-1] - rope_dim
    even = out[..., nope::2].clone()
    odd = out[..., nope + 1::2].clone()
    out[..., nope::2] = even * cos - odd * sin
    out[..., nope + 1::2] = even * sin + odd * cos
    return out
