"""Backend dispatch for the DeepSeek V4 operations.

Each operation ``op`` is registered in ``kvformats.codec.registry`` under the model-op family
``OpFamily("deepseek_v4")``, a key no format name equals, so a kernel package adds a backend
with ``register_model_op("deepseek_v4", op, "triton")(fn)`` (the Triton kernels come from the
kernel package's table); ``fn`` receives exactly the arguments the reference receives, already
validated.
"""

from __future__ import annotations

from kvformats.codec import registry
from kvformats.dsv4_constants import FAMILY

MODEL_OPS: list[str] = []  # every model op with a reference, in registration order
KEY = registry.OpFamily(FAMILY)  # built once: the call path resolves under it


def reference(op: str):
    """Decorator: register ``fn`` as the reference implementation of ``deepseek_v4.op``."""

    def deco(fn):
        MODEL_OPS.append(op)
        return registry.register_model_op(FAMILY, op, "reference")(fn)

    return deco


def resolve(op: str, backend: str, device):
    """The implementation of ``deepseek_v4.op`` that ``backend`` selects for ``device``."""
    return registry.resolve(KEY, op, backend, device)
