"""Backend dispatch for the DeepSeek V4.1 model ops, under ``OpFamily("deepseek_v41")`` (as
``kvformats.deepseek_v4._dispatch`` does for V4's).

Each op is declared with ``kvformats.codec.op.Op`` in its module, in ``MODEL_FAMILY``: a kernel
package adds its "triton" backend through its table; an implementation receives exactly the
reference's arguments, validated. Its torch.library op is ``kvformats::dsv41_<op>``."""

from __future__ import annotations

from kvformats.codec.model_family import ModelOpFamily
from kvformats.dsv41_constants import FAMILY

MODEL_FAMILY = ModelOpFamily(FAMILY, torch_prefix="dsv41_")
MODEL_OPS: list[str] = MODEL_FAMILY.ops  # every model op with a reference, in registration order
KEY = MODEL_FAMILY.key
reference = MODEL_FAMILY.reference
resolve = MODEL_FAMILY.resolve
