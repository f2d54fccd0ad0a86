"""Backend dispatch for the DeepSeek V4 operations.

Each operation ``op`` is registered in ``kvformats.codec.registry`` under the family name
``"deepseek_v4"`` (in the slot a format name takes for codec ops), so a kernel package adds a
backend with ``register_op("deepseek_v4", op, "triton")(fn)``; ``fn`` receives exactly the
arguments the reference receives, already validated.
"""

from __future__ import annotations

from kvformats.codec import registry
from kvformats.dsv4_constants import FAMILY

MODEL_OPS: list[str] = []  # every model op with a reference, in registration order


def reference(op: str):
    """Decorator: register ``fn`` as the reference implementation of ``deepseek_v4.op``."""

    def deco(fn):
        MODEL_OPS.append(op)
        return registry.register_op(FAMILY, op, "reference")(fn)

    return deco


def resolve(op: str, backend: str, device):
    """The implementation of ``deepseek_v4.op`` that ``backend`` selects for ``device``."""
    return registry.resolve(FAMILY, op, backend, device)
