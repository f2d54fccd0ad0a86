"""Element-wise transforms of DeepSeek V4 attention: GPT-J RoPE on the tail dims, the Sylvester
Hadamard rotation of the indexer, and RMSNorm.

RoPE is ``kvformats.deepseek_v4.rope`` (re-exported here): interleaved pairs on the last ``rope_dim`` dims,
float32 math, a float32 ``cos_sin_cache [max_positions, rope_dim]`` of ``[cos | sin]`` rows.
"""

from __future__ import annotations

import torch

from kvformats.codec.op import Op
from kvformats.deepseek_v4 import _dispatch as D
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.rope import cos_sin_cache, rope_tail
from kvformats.errors import BackendUnavailableError, InputError, InputTypeError, describe
from kvformats.validation import FLOAT_DTYPES, check_memory

__all__ = ["cos_sin_cache", "hadamard_transform", "rms_norm", "rope_tail"]


def resolve_for_shapes(op: Op, backend: str, device, args: tuple):
    """The implementation of ``op`` for ``args`` (validated, in the order the implementation
    takes them). A kernel that does not run every shape names the ones it cannot in an
    ``unsupported(*args)`` attribute; for those, backend="triton" raises
    BackendUnavailableError (nothing falls back silently) and "auto" picks the reference."""
    fn = op.resolve(backend, device)
    unsupported = getattr(fn, "unsupported", None)
    reason = unsupported(*args) if unsupported is not None else None
    if reason is None:
        return fn
    if backend == "triton":
        raise BackendUnavailableError(f"the Triton kernel of deepseek_v4.{op.name} does not run {reason}; pass "
                                      f"backend='reference', or 'auto' (which runs the reference for these shapes)")
    return op.resolve("reference", device)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


HADAMARD_TRANSFORM = Op(D.MODEL_FAMILY, "hadamard_transform",
                        fake=lambda x, *_: x.new_empty(x.shape, dtype=torch.bfloat16))


@HADAMARD_TRANSFORM.public
def hadamard_transform(x: torch.Tensor, scale: float | None = None, *, backend: str = "auto",
                       check: bool | str = True) -> torch.Tensor:
    """Natural-order (Sylvester) Walsh-Hadamard transform of the last dim -> bfloat16, same shape.

    ``y_j = scale * sum_i (-1)^popcount(i & j) * bf16(x)_i`` with ``scale = D^-0.5`` by default
    (spec/upstream.md §4.4). The input is rounded to bf16 first; the sums run in float32 as an in-place
    butterfly (stages h = 1, 2, 4, ... D/2, each ``(a, b) -> (a + b, a - b)``), the product with
    the float32 scale follows, and the result is rounded to bf16. ``D`` must be a power of two.
    The Triton kernel takes rows of up to 1024 elements: wider rows run the reference under
    ``backend="auto"`` and raise BackendUnavailableError under ``backend="triton"``. Every value
    of ``x`` is transformed: ``check`` (spec/checks.md) is validated and changes nothing.
    """
    C.check_mode(check)
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"x must be a bf16, fp16 or fp32 tensor, got {describe(x)}")
    check_memory("x", x)  # x takes no check_tensor (any rank): its memory is checked here
    d = x.shape[-1] if x.dim() else 0
    if not _is_pow2(d):
        raise InputError(f"hadamard_transform needs a power-of-two last dim, got {describe(x)}")
    scale = d ** -0.5 if scale is None else float(scale)
    return resolve_for_shapes(HADAMARD_TRANSFORM, backend, x.device, (x, scale))(x, scale)


@HADAMARD_TRANSFORM.reference
def hadamard_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The butterfly of ``hadamard_transform`` on validated input."""
    shape, d = x.shape, x.shape[-1]
    y = x.to(torch.bfloat16).to(torch.float32).reshape(-1, d)
    h = 1
    while h < d:
        pairs = y.view(-1, d // (2 * h), 2, h)
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2).view(-1, d)
        h *= 2
    return (y * scale).to(torch.bfloat16).reshape(shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in float32, no mean subtraction:
    ``x * rsqrt(sum(x^2) / D + eps) * weight`` (``weight=None``: weightless) -> float32."""
    xf = x.float()
    # a tensor divisor: torch on CUDA would multiply by the reciprocal of a host scalar
    # (made by a fill kernel: a copy from a host tensor is refused inside CUDA-graph capture)
    var = xf.square().sum(dim=-1, keepdim=True) / torch.full((), float(x.shape[-1]), device=xf.device)
    out = xf * torch.rsqrt(var + eps)
    return out if weight is None else out * weight.float()
