"""What the CLI's commands share: ``--param`` parsing into a layout, and writing an output file,
each failing as one-line UsageError (kvformats.cli and kvformats.cli.caches use them)."""

from __future__ import annotations

import os
import tempfile

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


def check_output(path, what: str, flag: str = "", *, regular_only: bool = False) -> str:
    """``path`` as a str if ``what`` can be written there, else UsageError (one line, led by
    ``flag``): called before a command's work so that a bad path costs nothing. Beyond
    writable_file's checks it probes the place, since a directory that looks writable may refuse
    (``/proc``, a read-only mount): it creates and removes a temporary file beside the target and
    opens an existing regular target for appending only, so no byte of anything changes.
    ``regular_only``: only a regular file (or none) is accepted (cache files: the loader reads
    regular files only, so a device or pipe would take a file that can never be read back)."""
    from kvformats.caches.files import writable_file

    lead = f"{flag}: " if flag else ""
    try:
        path = writable_file(path, what)
    except KVFormatError as err:
        raise UsageError(lead + str(err).splitlines()[0]) from None
    parent = os.path.dirname(os.path.abspath(path))
    exists, regular = os.path.exists(path), os.path.isfile(path)
    if regular_only and exists and not regular:
        raise UsageError(f"{lead}cannot write the {what} {path}: not a regular file")
    try:
        if regular:  # not a pipe: opening one waits for its reader
            open(path, "ab").close()
    except OSError as err:
        raise UsageError(f"{lead}cannot write the {what} {path}: {err.strerror or err}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".kvformats-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"{lead}cannot write the {what} {path}: {parent} refuses new files "
                         f"({err.strerror or err})") from None
    return path
