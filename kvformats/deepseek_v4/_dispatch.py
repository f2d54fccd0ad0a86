"""Backend dispatch for the DeepSeek V4 operations.

Each operation ``op`` is registered in ``kvformats.codec.registry`` under the model-op family
``OpFamily("deepseek_v4")``, a key no format name equals, so a kernel package adds a backend
with ``register_model_op("deepseek_v4", op, "triton")(fn)`` (the Triton kernels come from the
kernel package's table); ``fn`` receives exactly the arguments the reference receives, already
validated.
"""

from __future__ import annotations

from kvformats.codec.model_family import ModelOpFamily
from kvformats.dsv4_constants import FAMILY

_FAMILY = ModelOpFamily(FAMILY)
MODEL_OPS: list[str] = _FAMILY.ops  # every model op with a reference, in registration order
KEY = _FAMILY.key
reference = _FAMILY.reference  # decorator: register fn as the reference of deepseek_v4.op
resolve = _FAMILY.resolve  # the implementation of deepseek_v4.op that backend selects for device
