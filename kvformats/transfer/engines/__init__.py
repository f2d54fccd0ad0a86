"""Transfer engines: each adapter imports its engine only when constructed, so this package and
``kvformats.transfer`` import without them. ``make_engine("nixl" | "mooncake", **options)``."""

from __future__ import annotations

from kvformats.errors import BackendUnavailableError, InputError

ENGINES = ("nixl", "mooncake")


def _module(name: str):
    if name == "nixl":
        from kvformats.transfer.engines import nixl as module
    elif name == "mooncake":
        from kvformats.transfer.engines import mooncake as module
    else:
        raise InputError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}")
    return module


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
