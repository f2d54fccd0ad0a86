"""Backend dispatch for the DeepSeek V4 operations.

Each operation is declared with ``kvformats.codec.op.Op`` in its module, in the model-op family
``MODEL_FAMILY``: registered in ``kvformats.codec.registry`` under ``OpFamily("deepseek_v4")``,
a key no format name equals, so a kernel package adds a backend with
``register_model_op("deepseek_v4", op, "triton")(fn)`` (the Triton kernels come from the kernel
package's table); ``fn`` receives exactly the arguments the reference receives, already
validated. Its torch.library op is ``kvformats::dsv4_<op>``.
"""

from __future__ import annotations

from kvformats.codec.model_family import ModelOpFamily
from kvformats.dsv4_constants import FAMILY

MODEL_FAMILY = ModelOpFamily(FAMILY, torch_prefix="dsv4_")
MODEL_OPS: list[str] = MODEL_FAMILY.ops  # every model op with a reference, in registration order
KEY = MODEL_FAMILY.key
reference = MODEL_FAMILY.reference  # decorator: register fn as the reference of deepseek_v4.op
resolve = MODEL_FAMILY.resolve  # the implementation of deepseek_v4.op that backend selects for device
