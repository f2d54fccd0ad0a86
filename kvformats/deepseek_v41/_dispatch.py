"""Backend dispatch for the DeepSeek V4.1 model ops, under ``OpFamily("deepseek_v41")`` (as
``kvformats.deepseek_v4._dispatch`` does for V4's): a kernel package adds its "triton" backend
through its table; an implementation receives exactly the reference's arguments, validated."""

from __future__ import annotations

from kvformats.codec.model_family import ModelOpFamily
from kvformats.dsv41_constants import FAMILY

_FAMILY = ModelOpFamily(FAMILY)
MODEL_OPS: list[str] = _FAMILY.ops  # every model op with a reference, in registration order
KEY = _FAMILY.key
reference = _FAMILY.reference
resolve = _FAMILY.resolve
