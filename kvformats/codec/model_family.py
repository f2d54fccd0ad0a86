"""One model-op family's registration and dispatch (``deepseek_v4``, ``deepseek_v41``).

A family's public ops validate their arguments, then call the implementation its backend selects
under ``OpFamily(name)`` in ``kvformats.codec.registry``. The reference is registered here; a
kernel package adds its backend through its table (``("model op", family, op)`` keys). Ops
declared with ``kvformats.codec.op.Op`` list themselves in ``declared``; their torch.library ops
are named ``kvformats::<torch_prefix><op>``.
"""

from __future__ import annotations

from typing import Any

from kvformats.codec import registry


class ModelOpFamily:
    """The registration of one family: ``reference(op)`` (a decorator), ``resolve(op, backend,
    device)``, ``ops`` (every op with a reference, in registration order) and ``declared`` (op
    name -> its ``Op`` declaration, in declaration order)."""

    def __init__(self, name: str, torch_prefix: str | None = None):
        self.name = name
        self.torch_prefix = f"{name}_" if torch_prefix is None else torch_prefix
        self.ops: list[str] = []
        self.declared: dict[str, Any] = {}
        self.key = registry.OpFamily(name)  # built once: the call path resolves under it

    def reference(self, op: str):
        """Decorator: register ``fn`` as the reference implementation of ``op``."""

        def deco(fn):
            self.ops.append(op)
            return registry.register_model_op(self.name, op, "reference")(fn)

        return deco

    def resolve(self, op: str, backend: str, device):
        """The implementation of ``op`` that ``backend`` selects for tensors on ``device``."""
        return registry.resolve(self.key, op, backend, device)
