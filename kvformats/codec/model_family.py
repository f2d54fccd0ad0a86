"""One model-op family's registration and dispatch (``deepseek_v4``, ``deepseek_v41``).

A family's public ops validate their arguments, then call the implementation its backend selects
under ``OpFamily(name)`` in ``kvformats.codec.registry``. The reference is registered here; a
kernel package adds its backend through its table (``("model op", family, op)`` keys).
"""

from __future__ import annotations

from kvformats.codec import registry


class ModelOpFamily:
    """The registration of one family: ``reference(op)`` (a decorator), ``resolve(op, backend,
    device)`` and ``ops``, every op with a reference, in registration order."""

    def __init__(self, name: str):
        self.name = name
        self.ops: list[str] = []
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
