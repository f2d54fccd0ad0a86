"""GPT-J (interleaved-pair) rotary embedding on the tail dims, as DeepSeek V4 applies it.

The cache formats store the RoPE tail already rotated; these helpers make that input (and the
golden vectors) reproducible. Math in float32, like every writer in spec/upstream.md §0.
"""

from __future__ import annotations

import operator

import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.runtime import deferred


def _as_int(name: str, value, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (anything with ``__index__`` but a bool; not a float)."""
    try:
        index = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        index = None
    if index is None:
        raise InputTypeError(f"{name} must be an int, got {describe(value)}")
    value = index
    if value < minimum:
        raise InputError(f"{name} must be >= {minimum}, got {value}")
    return value


def cos_sin_cache(rope_dim: int, max_positions: int, base: float = 10000.0) -> torch.Tensor:
    """float32 ``[max_positions, rope_dim]``: row p = [cos(p f_i) | sin(p f_i)], f_i = base^(-2i/rope_dim),
    computed in float64 then rounded to float32. ``rope_dim`` must be a positive even int."""
    rope_dim = _as_int("rope_dim", rope_dim, 2)
    if rope_dim % 2:
        raise InputError(f"rope_dim must be even (GPT-J rotates pairs of dims), got {rope_dim}")
    max_positions = _as_int("max_positions", max_positions, 0)
    half = rope_dim // 2
    freqs = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / rope_dim)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)


_SITE = deferred.site("rope_tail", "positions")


def _check_rope_args(x, positions, cos_sin, check, site) -> bool:
    """Typed errors for ``rope_tail``'s arguments; the position range is checked on the host
    when ``kvformats.runtime.deferred.on_host`` says so (CPU tensors, strict mode; never inside
    torch.compile tracing). Returns whether it was."""
    # a bad site would be recorded and break the message raise_pending builds from it
    deferred.check_site(site, arg_suffix="positions")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise InputTypeError(f"x must be a floating-point tensor [N, ..., D], got {describe(x)}")
    if not isinstance(cos_sin, torch.Tensor) or not cos_sin.is_floating_point() or cos_sin.dim() != 2:
        raise InputTypeError(f"cos_sin must be a floating-point tensor [max_positions, rope_dim] "
                             f"(kvformats.deepseek_v4.rope.cos_sin_cache), got {describe(cos_sin)}")
    rope_dim = cos_sin.shape[1]
    if rope_dim % 2 or rope_dim > x.shape[-1]:
        raise InputError(f"cos_sin must have an even number of columns (the rope dim) at most x's last dim "
                         f"{x.shape[-1]}, got {describe(cos_sin)}")
    if (not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or positions.dtype.is_complex
            or positions.dtype == torch.bool):
        raise InputTypeError(f"positions must be an integer tensor [N], got {describe(positions)}")
    if positions.dim() != 1 or positions.shape[0] != x.shape[0]:
        raise InputError(f"positions must be a 1-D tensor [N] with N = x.shape[0] = {x.shape[0]}, "
                         f"got {describe(positions)}")
    if positions.device != x.device or cos_sin.device != x.device:
        raise InputError(f"positions and cos_sin must be on x's device {x.device}, got {describe(positions)} "
                         f"and {describe(cos_sin)}")
    if torch.compiler.is_compiling() or not deferred.on_host(check, positions):
        return False
    if positions.numel() == 0:
        return True
    low, high = torch.aminmax(positions)
    lo, hi = int(low), int(high)
    if lo < 0 or hi >= cos_sin.shape[0]:
        raise InputError(f"positions must lie in [0, {cos_sin.shape[0]}) (the rows of cos_sin), got values in "
                         f"[{lo}, {hi}]; build a longer table with kvformats.deepseek_v4.rope.cos_sin_cache")
    return True


def rope_tail(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, *,
              inverse: bool = False, check=True, site: int = _SITE) -> torch.Tensor:
    """Rotate the last ``cos_sin.shape[1]`` dims of ``x [N, ..., D]`` at ``positions [N]`` -> float32.

    Pair i is (x[nope + 2i], x[nope + 2i + 1]); forward: e' = e cos - o sin, o' = e sin + o cos;
    ``inverse`` undoes it. The NoPE dims pass through (as float32). Positions must be rows of
    ``cos_sin``: checked as ``check`` says (``spec/checks.md``): on CPU tensors and in strict mode
    an InputError before anything is computed; on a GPU without a host read, where a row at an
    invalid position is returned unrotated and the violation recorded (at ``site``: an op that
    rotates through this names itself, ``kvformats.runtime.deferred.site``).
    """
    rope_dim = cos_sin.shape[1] if isinstance(cos_sin, torch.Tensor) and cos_sin.dim() == 2 else 0
    checked = _check_rope_args(x, positions, cos_sin, check, site)
    half = rope_dim // 2
    out = x.float().clone()
    p = positions.long()
    bad = None
    if not checked and p.numel():  # an invalid position reads row 0; its row is passed through below
        bad = (p < 0) | (p >= cos_sin.shape[0])
        deferred.record_where(bad, p, cos_sin.shape[0], deferred.Check.POSITION_RANGE, site)
        p = torch.where(bad, 0, p)
    cos = cos_sin[p, :half].float()
    sin = cos_sin[p, half:rope_dim].float()
    while cos.dim() < out.dim():
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if inverse:
        sin = -sin
    nope = x.shape[-1] - rope_dim
    even = out[..., nope::2].clone()
    odd = out[..., nope + 1::2].clone()
    out[..., nope::2] = even * cos - odd * sin
    out[..., nope + 1::2] = even * sin + odd * cos
    if bad is not None:  # the row of an invalid position: x as float32, unrotated (signs of zero kept)
        out = torch.where(bad.reshape(-1, *([1] * (out.dim() - 1))), x.float(), out)
    return out
