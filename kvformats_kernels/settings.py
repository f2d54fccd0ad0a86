"""The launch settings: every table, switch and environment fact a launcher reads on the host.

Why one object: a public call's launches are recorded once and replayed for later calls with the
same argument metadata (``kvformats.runtime.replay``). Anything else a launcher reads while
working out its launches (program sizes, the hardware-cast switch, the interpreter) must either
be in the replay key or, when it changes, throw away every recorded plan. The settings do the
latter: they change only through ``change`` / ``changed``, which forget the plans; a table is
read-only (an item assignment raises ``SettingsError``), and a module that declares one refuses
to have the name rebound. So an edit either takes effect on the next call or raises; it is never
silently ignored by a plan recorded before it.

The environment is read once, here, at import: ``TRITON_INTERPRET`` (Triton itself binds kernels
to the interpreter when their module is imported, so a later change could not take effect
anyway) and ``KVFORMATS_TRITON_LAUNCH`` (every launch through Triton's own path).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator, Mapping

from kvformats.errors import SettingsError
from kvformats.runtime import replay


def _freeze(value):
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


class Table(Mapping):
    """One named table of launch settings (key -> value, values frozen); read like a dict."""

    def __init__(self, name: str, values: Mapping):
        self.name = name
        self._values = {k: _freeze(v) for k, v in values.items()}

    def __getitem__(self, key):
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __setitem__(self, key, value):
        raise SettingsError(f"launch settings {self.name!r} are read-only: change them with "
                            f"kvformats_kernels.settings.change({self.name!r}, ...) so that recorded "
                            f"replay plans are dropped")

    def __delitem__(self, key):
        self.__setitem__(key, None)

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {dict(self._values)!r})"


class Settings:
    """Every launch setting (the one state object): ``tables`` by name, the environment facts,
    and ``generation``, which counts the changes."""

    def __init__(self):
        self.tables: dict[str, Table] = {}
        self.interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
        self.triton_launch = os.environ.get("KVFORMATS_TRITON_LAUNCH", "0") not in ("", "0")
        self.generation = 0

    def declare(self, name: str, values: Mapping) -> Table:
        """Register a table (once, by the module that owns its defaults)."""
        if name in self.tables:
            raise SettingsError(f"launch settings {name!r} are declared twice")
        table = self.tables[name] = Table(name, values)
        return table


SETTINGS = Settings()
_MERGE = object()


def declare(name: str, values: Mapping) -> Table:
    """``SETTINGS.declare``: the table a launcher module reads (keep the returned object)."""
    return SETTINGS.declare(name, values)


def change(name: str, key=_MERGE, value=None, **entries) -> None:
    """Change table ``name``: ``change(name, key, value)`` replaces one entry (a value of None
    removes it), ``change(name, **entries)`` replaces entries by keyword; then every recorded
    replay plan is dropped. SettingsError for an unknown table."""
    table = SETTINGS.tables.get(name)
    if table is None:
        raise SettingsError(f"no launch settings named {name!r}; known: {', '.join(sorted(SETTINGS.tables))}")
    updates = dict(entries) if key is _MERGE else {key: value}
    for k, v in updates.items():
        if v is None:
            table._values.pop(k, None)
        else:
            table._values[k] = _freeze(v)
    SETTINGS.generation += 1
    replay.clear()


def snapshot(name: str) -> dict:
    """A plain copy of table ``name`` (nested entries as dicts), for ``restore``."""
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in SETTINGS.tables[name].items()}


def restore(name: str, saved: dict) -> None:
    """Put table ``name`` back to a ``snapshot`` (entries it did not have are removed)."""
    table = SETTINGS.tables[name]
    table._values = {k: _freeze(v) for k, v in saved.items()}
    SETTINGS.generation += 1
    replay.clear()


@contextlib.contextmanager
def changed(name: str, key=_MERGE, value=None, **entries) -> Iterator[Table]:
    """``change`` for the block, then the table as it was (benchmarks' sweeps, tests)."""
    saved = snapshot(name)
    change(name, key, value, **entries)
    try:
        yield SETTINGS.tables[name]
    finally:
        restore(name, saved)


class _Guarded(types.ModuleType):
    """A module whose settings names cannot be rebound (a rebinding would not drop the plans)."""

    def __setattr__(self, attr, value):
        if attr in self.__dict__.get("_SETTINGS_NAMES", ()):
            raise SettingsError(f"{self.__name__}.{attr} is a launch-settings table: change it with "
                                f"kvformats_kernels.settings.change(...) instead of rebinding it")
        super().__setattr__(attr, value)

    def __delattr__(self, attr):
        if attr in self.__dict__.get("_SETTINGS_NAMES", ()):
            raise SettingsError(f"{self.__name__}.{attr} is a launch-settings table: it cannot be deleted")
        super().__delattr__(attr)


def guard(module_name: str, *names: str) -> None:
    """Refuse rebinding ``names`` in module ``module_name`` (call at the end of that module)."""
    module = sys.modules[module_name]
    module.__dict__["_SETTINGS_NAMES"] = frozenset(module.__dict__.get("_SETTINGS_NAMES", ())) | set(names)
    module.__class__ = _Guarded
