"""What the CLI's commands share: ``--param`` parsing into a layout, and writing an output file,
each failing as one-line UsageError (kvformats.cli and kvformats.cli.caches use them)."""

from __future__ import annotations

import kvformats as kvf
from kvformats.errors import KVFormatError, UsageError

PARAM_HELP = "layout parameter, typed as the format declares it (page_size=2, profile=vllm); repeatable"
# show and diagram refuse larger pages: engines page these caches in KiB-sized pages (the defaults
# are 4 KiB to 41 KiB), so a multi-GiB page is a mistyped page_size, not a layout to draw.
MAX_PAGE_BYTES = 1 << 31


def _param_types(name: str) -> dict[str, type]:
    """Parameter name -> its declared type (int or str) for format ``name``."""
    import attrs

    try:
        cls = type(kvf.get_format(name))
    except KVFormatError as err:
        raise UsageError(str(err).splitlines()[0]) from None
    return {a.name: int if a.type in (int, "int") else str for a in attrs.fields(cls)}


def _parse_params(name: str, items: list[str] | None) -> dict[str, int | str]:
    """``KEY=VALUE`` items -> keyword arguments of format ``name``, each value parsed by its
    parameter's declared type (``page_size=2`` an int, ``profile=vllm`` a string)."""
    types = _param_types(name)
    params: dict[str, int | str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param takes KEY=VALUE, got {item!r}")
        if key not in types:
            raise UsageError(f"{name} has no parameter {key!r}; its parameters: {', '.join(types)}")
        if types[key] is int:
            try:
                params[key] = int(value)
            except ValueError:
                raise UsageError(f"--param {key} must be an integer, got {value!r}") from None
        else:
            params[key] = value
    return params


def layout_arg(name: str, items: list[str] | None):
    """The layout ``name`` with the ``--param`` items applied (UsageError if it cannot be built)."""
    params = _parse_params(name, items)
    try:
        layout = kvf.get_format(name, **params)
    except (KVFormatError, TypeError, ValueError) as err:
        raise UsageError(str(err).splitlines()[0]) from None
    if layout.page_bytes > MAX_PAGE_BYTES:
        raise UsageError(f"page_size={layout.page_size} gives {name} pages of {layout.page_bytes} B "
                         f"({layout.page_bytes / 2**30:.1f} GiB); show and diagram take pages of at most 2 GiB")
    return layout


def write_output(path: str, text: str, what: str) -> str:
    """Write ``text`` to the output file ``path``; UsageError (one line) if it cannot be written."""
    from kvformats.caches.files import write_text

    try:
        return write_text(path, text, what)
    except KVFormatError as err:
        raise UsageError(str(err).splitlines()[0]) from None
