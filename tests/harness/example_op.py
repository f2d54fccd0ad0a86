"""An op declared in one file outside the package: its declaration, its public function, its
reference and its Triton kernel. tests/test_new_op_suite.py runs the suite's op tests on it with
no other file edited; docs/howto/add-an-op.md walks through it.

    scaled_gather(x, slots, scale)   # float32 [S, D]: x[slots[i]] * scale, a zero row for slot < 0
"""

from __future__ import annotations

import torch

from kvformats.codec import registry
from kvformats.codec.model_family import ModelOpFamily
from kvformats.codec.op import Op
from kvformats.errors import InputError
from kvformats.runtime import deferred
from kvformats.validation import FLOAT_DTYPES, INDEX_DTYPES, check_tensor

# The family: the registry key its ops dispatch under, and the prefix of their torch.library ops
# (torch.ops.kvformats.example_scaled_gather).
FAMILY = ModelOpFamily("example_ops", torch_prefix="example_")


def _example(rows: int, g: torch.Generator) -> dict:
    """One valid call of ``rows`` rows (CPU tensors; the harness moves them to the device)."""
    x = torch.randn(rows + 3, 64, generator=g).to(torch.bfloat16)
    return {"x": x, "slots": torch.randperm(rows + 3, generator=g)[:rows], "scale": 0.5}


SCALED_GATHER = Op(
    FAMILY, "scaled_gather", sites=("slots",), example=_example,
    fake=lambda x, slots, *_: x.new_empty((slots.shape[0], x.shape[1]), dtype=torch.float32))


@SCALED_GATHER.public
def scaled_gather(x: torch.Tensor, slots: torch.Tensor, scale: float, *, backend: str = "auto",
                  check: bool | str = True) -> torch.Tensor:
    """float32 ``[S, D]``: row i is ``x[slots[i]] * scale``, a zero row where ``slots[i] < 0``.

    ``x``: float ``[N, D]``, rows contiguous; ``slots``: int ``[S]``. A slot >= N raises before
    anything is computed on CPU tensors and in strict mode; on a GPU it is not read on the host:
    its row is zero and the violation is recorded for ``kvformats.raise_pending``.
    """
    check_tensor("x", x, dtypes=FLOAT_DTYPES, shape=(None, None))
    if x.stride(1) != 1:
        raise InputError(f"x must have contiguous rows, got strides {x.stride()}")
    check_tensor("slots", slots, dtypes=INDEX_DTYPES, shape=(None,), device=x.device)
    fn = SCALED_GATHER.resolve(backend, x.device)
    if deferred.on_host(check, slots):
        if slots.numel() and int(slots.max()) >= x.shape[0]:
            raise InputError(f"slots must be below the {x.shape[0]} rows of x, got {int(slots.max())}")
    elif not registry.is_kernel(fn):  # a kernel records it itself
        deferred.record_where(slots >= x.shape[0], slots, x.shape[0], deferred.Check.SLOT_RANGE,
                              SCALED_GATHER.site("slots"))
    return fn(x, slots, float(scale))


@SCALED_GATHER.reference
def scaled_gather_reference(x, slots, scale):
    s = slots.long()
    ok = (s >= 0) & (s < x.shape[0])
    rows = x[s.clamp(0, max(x.shape[0] - 1, 0))].float() * scale if x.shape[0] else x.new_zeros(
        (s.shape[0], x.shape[1]), dtype=torch.float32)
    return torch.where(ok[:, None], rows, 0.0)


# ----- the Triton kernel: registered as the op's "triton" backend --------------------------------
try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the reference serves every device
    triton = None

if triton is not None:
    from kvformats_kernels.launch import fast
    from kvformats_kernels.record_jit import record_scalar

    @triton.jit
    def _scaled_gather_kernel(x, slots, out, err, n_rows, d, x_stride, slot_stride, scale, BLOCK_D: tl.constexpr,
                              SITE: tl.constexpr):
        i = tl.program_id(0)
        slot = tl.load(slots + i * slot_stride).to(tl.int64)
        ok = (slot >= 0) & (slot < n_rows)
        cols = tl.arange(0, BLOCK_D)
        # a row of an invalid slot reads nothing (its columns end at 0) and is stored as zeros
        v = tl.load(x + tl.where(ok, slot, 0) * x_stride + cols, mask=cols < tl.where(ok, d, 0), other=0.0)
        tl.store(out + i.to(tl.int64) * d + cols, v.to(tl.float32) * scale, mask=cols < d)
        record_scalar(err, slot >= n_rows, i, slot, n_rows, 1, SITE)  # check 1: Check.SLOT_RANGE

    @registry.register_model_op(FAMILY.name, "scaled_gather", "triton")
    def scaled_gather_kernel(x, slots, scale):
        """The kernel: one program a row; takes the reference's arguments, never synchronizes."""
        s, d = slots.shape[0], x.shape[1]
        out = torch.empty((s, d), dtype=torch.float32, device=x.device)
        if s:
            fast(_scaled_gather_kernel)[(s,)](
                x, slots, out, deferred.error_record(x.device), x.shape[0], d, x.stride(0), slots.stride(0), scale,
                BLOCK_D=triton.next_power_of_2(max(d, 1)), SITE=SCALED_GATHER.site("slots"))
        return out
