"""Moving a transfer plan's bytes in-process: what an engine does, for tests with no engine."""

from __future__ import annotations

from kvformats.layout import storage_bytes


def apply(plan, src, dst) -> None:
    """Copy each of ``plan``'s segments from the ``src`` caches' storage to the ``dst`` caches'
    (``{name: (layout, cache)}`` on both sides), byte for byte with torch."""
    for p in plan.caches.values():
        a, b = storage_bytes(src[p.caches[0]][1]), storage_bytes(dst[p.caches[0]][1])
        for (so, n), (do, m) in zip(p.src.tolist(), p.dst.tolist()):
            if n != m:
                raise AssertionError(f"segment lengths differ: {n} != {m}")
            b[do:do + n] = a[so:so + n]
