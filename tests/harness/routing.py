"""Test routing: ``backend="auto"`` resolving to the Triton kernels on CPU tensors (under the
interpreter) with the GPU's check path, so that a test compares what a CUDA call would run."""

from __future__ import annotations


def auto_resolves_to_triton(monkeypatch) -> None:
    """Every op with a Triton implementation resolves to it under ``backend="auto"`` on any
    device; the host value checks are off (the device-record path); resolutions made before are
    forgotten (the caller clears ``registry._RESOLVED`` again when done)."""
    from kvformats.codec import registry
    from kvformats.runtime import deferred

    registry._load_kernels()
    real = registry._resolve

    def resolve(fmt, op, backend, device):
        impl = registry._OPS.get((fmt, op), {}).get("triton") if backend == "auto" else None
        return impl if impl is not None else real(fmt, op, backend, device)

    monkeypatch.setattr(registry, "_resolve", resolve)
    monkeypatch.setattr(deferred, "HOST_CHECKED", set())
    registry._RESOLVED.clear()
