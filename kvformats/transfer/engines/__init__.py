"""Transfer engines: each adapter imports its engine only when constructed, so this package and
``kvformats.transfer`` import without them. ``make_engine("nixl" | "mooncake", **options)``."""

from __future__ import annotations

from kvformats.errors import BackendUnavailableError, InputError

ENGINES = ("nixl", "mooncake")


def _module(name: str):
    if name == "nixl":
        from kvformats.transfer.engines import nixl

        return nixl
    if name == "mooncake":
        from kvformats.transfer.engines import mooncake

        return mooncake
    raise InputError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}")


def available(name: str) -> bool:
    """Whether engine ``name`` can be made here (its package imports)."""
    try:
        _module(name)._import()
    except BackendUnavailableError:
        return False
    return True


def make_engine(name: str, **options):
    module = _module(name)
    return module.NixlEngine(**options) if name == "nixl" else module.MooncakeEngine(**options)
