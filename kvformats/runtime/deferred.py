"""Value checks without host synchronization: the check modes and the per-device error record.

A check that needs tensor values (a slot beyond the cache, a position beyond the cos/sin table,
``cu_seq_lens`` that decrease, ...) would have to copy those values to the host, which stalls the
CPU until the GPU has caught up. So on CUDA tensors the default mode never does that: the kernels
skip the offending rows (they never write outside the cache) and record the first violation
they meet in a small sticky record of the device. The caller turns it into the typed error when
it chooses, once per engine step::

    layout.encode(x, cache, slots)        # no synchronization
    ...
    kvformats.raise_pending(cache.device) # one synchronization: InputError if a call recorded one

Check modes (the ``check`` argument of every op):

* ``True`` (default): metadata checks on the host, always before any write. Value checks on the
  host before any write for CPU tensors; on the device, through the record, for the others.
* ``"strict"``: value checks on the host before any write on every device (synchronizes; for
  debugging). ``strict_checks()`` turns it on for every call in a block, as does the environment
  variable ``KVFORMATS_STRICT=1``.
* ``False``: metadata checks only; invalid rows are skipped and recorded on every device.

The record is int64 ``[8]``: ``[state, check, site, index, value, bound, 0, 0]``; ``state`` is 0
while clear and 1 once set, and a set record keeps its first violation until it is read.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import os
import threading
import zlib

import torch

from kvformats.errors import BackendUnavailableError, InputError, InputTypeError, KVFormatError

WORDS = 8
STATE, CHECK, SITE, INDEX, VALUE, BOUND = range(6)


class Check(enum.IntEnum):
    """What a recorded violation broke; each has its message in MESSAGES."""

    SLOT_RANGE = 1
    POSITION_RANGE = 2
    GATHER_LEN = 3
    WORKSPACE_WIDTH = 4
    CU_ORDER = 5
    WORKSPACE_ROWS = 6


MESSAGES = {
    Check.SLOT_RANGE: "{arg}[{index}] = {value} is beyond the cache's capacity of {bound} slots "
                      "(valid slots are 0..{last}, or negative for 'no row'); the row was not written",
    Check.POSITION_RANGE: "{arg}[{index}] = {value} is outside [0, {bound}) (the rows of cos_sin_cache); "
                          "build a longer table with kvformats.deepseek_v4.rope.cos_sin_cache; the row was not written",
    Check.GATHER_LEN: "{arg}[{index}] = {value} is not in [0, seq_lens[{index}]] = [0, {bound}]; "
                      "the request's rows were not written",
    Check.WORKSPACE_WIDTH: "request {index} needs offset + gather_len = {value} rows of {arg}, which has {bound}; "
                           "rows beyond the workspace were not written: widen it",
    Check.CU_ORDER: "{arg} must never decrease (and cu_seq_lens start at 0): {arg}[{index}] = {value} after "
                    "{bound}; the output rows these offsets place are unspecified (gather_paged: workspace rows "
                    "below the largest entry may hold any request's records or zeros), nothing outside the "
                    "outputs was written",
    Check.WORKSPACE_ROWS: "{arg}[-1] = {value} rows requested, but the workspaces hold {bound}; "
                          "rows beyond them were not copied: pass larger workspaces",
}

# ----- sites: the (op, argument) a violation is recorded for ----------------------------------
# Registered by the layers above as they declare their ops (kvformats.codec.op.Op's ``sites``);
# this layer knows no op. A site's id is a hash of its names, not a position in a table: a kernel
# names the site the same way and gets the same id whichever module is imported first, and the
# ids (constexprs of the kernels: part of what Triton compiles) are the same in every process.
SITES: dict[int, tuple[str, str]] = {}  # id -> (op, argument), every site named in this process
_SITE_IDS: dict[tuple[str, str], int] = {}
_SITE_LOCK = threading.Lock()


def site(op: str, arg: str) -> int:
    """The id naming (op, argument) in the record (a 31-bit int, a constexpr of the kernels),
    registered on first use: the declaration of ``op`` registers its sites, and a kernel or
    reference asking by the same names gets the same id."""
    key = (op, arg)
    index = _SITE_IDS.get(key)
    if index is None:
        index = zlib.crc32(f"{op}\x00{arg}".encode()) & 0x7FFFFFFF
        with _SITE_LOCK:  # two threads naming a new site at once must register it once
            other = SITES.setdefault(index, key)
            if other != key:  # a programming error: two sites may not share an id
                raise KVFormatError(f"sites {other} and {key} hash to the same id {index}; rename one")
            _SITE_IDS[key] = index
    return index


def check_site(value, what: str = "site", *, arg_suffix: str = "") -> int:
    """``value`` if it is a site (an exact int among SITES) whose argument ends with
    ``arg_suffix``; InputTypeError for a non-int (a float would be truncated and blame another
    op), InputError for an id no site has or a site of another kind of argument."""
    if type(value) is not int:  # noqa: E721 - bools and floats are refused on purpose
        raise InputTypeError(f"{what} must be an int from kvformats.runtime.deferred.site(op, arg), "
                             f"got {type(value).__name__} {value!r}")
    if value not in SITES:
        raise InputError(f"{what} must be a site id from kvformats.runtime.deferred.site(op, arg), got {value}")
    if not SITES[value][1].endswith(arg_suffix):
        raise InputError(f"{what} {value} names {SITES[value][0]}'s {SITES[value][1]!r}; it must name an "
                         f"argument ending in {arg_suffix!r}")
    return value


# ----- check modes ------------------------------------------------------------------------------
# Per context (each thread starts with the process default, KVFORMATS_STRICT): one thread's
# strict block never changes another's calls, and blocks nest.
_STRICT = contextvars.ContextVar("kvformats_strict", default=os.environ.get("KVFORMATS_STRICT", "0") not in ("", "0"))
strict_on = _STRICT.get  # whether check=True means "strict" here (the replay key holds it)


@contextlib.contextmanager
def strict_checks(enabled: bool = True):
    """Within the block (in this thread or task only; blocks nest), ``check=True`` means
    ``check="strict"``: value checks run on the host before any write on every device (and
    synchronize)."""
    token = _STRICT.set(bool(enabled))
    try:
        yield
    finally:
        _STRICT.reset(token)


# Device types whose values are checked on the host by default (their reads cost no stall).
# Tests empty it to run the device path on CPU tensors.
HOST_CHECKED = {"cpu"}


def on_host(check, t: torch.Tensor) -> bool:
    """Whether value checks read ``t``'s values on the host before the op writes (CPU tensors and
    strict mode; never inside CUDA-graph capture, where no host read can happen)."""
    if check is True:
        if t.device.type in HOST_CHECKED:
            return True
        if not _STRICT.get():
            return False
    elif check is False:
        return False
    elif not isinstance(check, str) or check != "strict":
        raise InputTypeError(f"check must be True, False or 'strict', got {check!r}")
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


# ----- the record -------------------------------------------------------------------------------
_RECORDS: dict[torch.device, torch.Tensor] = {}


def as_device(device, what: str = "device") -> torch.device:
    """``device`` (a torch.device, a string such as ``"cuda:0"``, or a device index) as a
    torch.device. InputTypeError for anything else: ``Tensor.to`` would read a bool or a float
    as a dtype. InputError for a string that names no device or a negative index;
    BackendUnavailableError for an index where this torch has no accelerator."""
    if isinstance(device, torch.device):
        return device
    if not (isinstance(device, str) or isinstance(device, int) and not isinstance(device, bool)):
        raise InputTypeError(f"{what} must be a torch.device, a device string such as 'cuda:0' or a device "
                             f"index, got {type(device).__name__} {device!r}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as err:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if isinstance(device, int) and device >= 0:  # torch reads an index as the current accelerator's
            raise BackendUnavailableError(f"{what} {device!r}: no device is available here ({text})") from None
        raise InputError(f"{what} {device!r} is not a device ({text})") from None


def unavailable(device: torch.device) -> str | None:
    """Why tensors cannot be made on ``device`` here (this torch has no CUDA, no such index, ...),
    or None when they can. Asks torch about availability; reads no tensor."""
    if device.type in ("cpu", "meta"):
        return None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            built = "built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            return f"no CUDA device is available here (torch {torch.__version__}, {built})"
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return f"this machine has {count} CUDA device{'s' if count != 1 else ''}"
        return None
    try:
        torch.empty(0, device=device)
    except Exception as err:  # noqa: BLE001 - each backend raises its own type (AssertionError, RuntimeError)
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def available_device(device, what: str = "device") -> torch.device:
    """``as_device(device)``, and BackendUnavailableError (naming the device and why) when it is
    not available here."""
    dev = as_device(device, what)
    why = unavailable(dev)
    if why is not None:
        raise BackendUnavailableError(f"{what} {str(dev)!r} is not available: {why}")
    return dev


def _key(device) -> torch.device | None:
    """The record's key of ``device`` (None: the current CUDA device), or None when the device is
    not available here: no record can exist there."""
    device = torch.device("cuda") if device is None else as_device(device)
    if unavailable(device) is not None:
        return None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def error_record(device) -> torch.Tensor:
    """The device's record (int64 ``[8]``, zero while clear), allocated on first use. Allocate it
    before capturing a CUDA graph (any eager call of an op on the device does, or call this): an
    allocation inside capture would belong to the graph. BackendUnavailableError for a device
    that is not available here."""
    rec = _RECORDS.get(device) if isinstance(device, torch.device) else None
    if rec is not None:
        return rec
    key = _key(device)
    if key is None:
        key = available_device(device, "error_record's device")  # raises, naming why
    rec = _RECORDS.get(key)
    if rec is None:
        if key.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise InputError(f"no error record exists on {key} yet, and none can be allocated inside CUDA-graph "
                             f"capture; call kvformats.error_record({str(key)!r}) (or run the op once) "
                             f"before capturing")
        rec = torch.zeros(WORDS, dtype=torch.int64, device=key)
        _RECORDS[key] = rec
    if isinstance(device, torch.device):
        _RECORDS[device] = rec  # the caller's spelling too: one dict lookup per call after this
    return rec


def describe_record(words) -> str | None:
    """The message of a record read to the host (a list of 8 ints), or None when it is clear."""
    if not words[STATE]:
        return None
    known = words[CHECK] in Check._value2member_map_ and words[SITE] in SITES
    if not known:  # never raise here: the message is all that is left of the violation
        return (f"a violation of unknown kind (check {words[CHECK]}, site {words[SITE]}) was recorded: "
                f"index {words[INDEX]}, value {words[VALUE]}, bound {words[BOUND]} "
                f"(recorded on the device by a call that did not synchronize)")
    op, arg = SITES[words[SITE]]
    body = MESSAGES[Check(words[CHECK])].format(arg=arg, index=words[INDEX], value=words[VALUE],
                                                bound=words[BOUND], last=words[BOUND] - 1)
    return f"{op}: {body} (recorded on the device by a call that did not synchronize)"


def pending_error(device=None) -> InputError | None:
    """Read and clear the device's record (one synchronization): the InputError it holds, or None.
    None too for a device that is not available here (a CPU-only torch and the default device):
    no record can exist there."""
    key = _key(device)
    rec = None if key is None else _RECORDS.get(key)
    if rec is None:
        return None
    words = rec.tolist()
    if not words[STATE]:
        return None
    message = describe_record(words)  # before clearing: the record is the only copy
    rec.zero_()
    return InputError(message)


def raise_pending(device=None) -> None:
    """Raise the first value error that an op recorded on ``device`` (default: the current CUDA
    device) since the last read, and clear the record; return None when there is none. One
    synchronization: call it at a step boundary, not per op."""
    err = pending_error(device)
    if err is not None:
        raise err


def record_where(bad: torch.Tensor, values: torch.Tensor, bound, check: Check, where: int) -> None:
    """Record the first ``bad`` element (flat order) with torch operations on its device, without
    a host read: the record path of the reference backend on a GPU. ``bound`` is an int or a
    tensor of ``bad``'s shape."""
    if bad.numel() == 0:
        return
    rec = error_record(bad.device)
    flat = bad.reshape(-1)
    first = flat.to(torch.uint8).argmax().reshape(1)  # the first True (argmax keeps the first maximum)
    value = values.reshape(-1).to(torch.int64).gather(0, first)
    if isinstance(bound, torch.Tensor):
        bound_t = bound.reshape(-1).to(torch.int64).gather(0, first)
    else:
        bound_t = torch.full((1,), int(bound), dtype=torch.int64, device=bad.device)
    # made by fill kernels, not copied from a host tensor: a copy from pageable host memory is
    # refused inside CUDA-graph capture
    head = torch.cat([torch.full((1,), v, dtype=torch.int64, device=bad.device) for v in (1, int(check), where)])
    new = torch.cat([head, first, value, bound_t, rec[6:]])
    take = flat.any() & (rec[STATE] == 0)
    rec.copy_(torch.where(take, new, rec))


def record_decrease(offsets: torch.Tensor, where: int, *, start_zero: bool) -> None:
    """Record where cumulative ``offsets`` decrease (or, with ``start_zero``, do not start at 0)
    as ``Check.CU_ORDER``, with torch operations and no host read (the reference's device path)."""
    if offsets.numel() == 0:
        return
    first = offsets.new_zeros(1) if start_zero else offsets[:1]
    prev = torch.cat([first, offsets[:-1]])
    bad = offsets < prev
    if start_zero:
        bad[0] = offsets[0] != 0
    record_where(bad, offsets, prev, Check.CU_ORDER, where)
