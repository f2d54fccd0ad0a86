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


def available_memory(device: str = "cpu") -> int | None:
    """Bytes a run may still allocate on ``device``: the kernel's estimate of the memory available
    without swapping (MemAvailable of /proc/meminfo; the free pages where there is none) for
    "cpu", the free memory of the current CUDA device for "cuda"; None where it cannot be read
    (the run then goes ahead, and an allocator's refusal is still one line: ``out_of_memory``)."""
    if device == "cuda":
        import torch

        try:
            return int(torch.cuda.mem_get_info()[0])  # a driver query: nothing on a stream waits
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(need: int, device: str, what: str, fix: str) -> None:
    """UsageError (one line) when ``what`` needs about ``need`` bytes on ``device``, more than
    ``available_memory`` says is there: checked before the run, so that an oversized one neither
    dies in the allocator with a traceback nor pushes the machine into swap."""
    have = available_memory(device)
    if have is not None and need > have:
        raise UsageError(f"{what} needs about {_gib(need)} of {device} memory, more than the {_gib(have)} "
                         f"available here; {fix}")


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocator's refusal: Python's MemoryError, torch's OutOfMemoryError
    (CUDA), or the RuntimeError of torch's CPU allocator ("can't allocate memory")."""
    import torch

    if isinstance(err, (MemoryError, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))):
        return True
    return isinstance(err, RuntimeError) and ("can't allocate memory" in str(err) or "not enough memory" in str(err))
