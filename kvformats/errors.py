"""Error types: every exception kvformats raises is one of these classes (tests/test_errors.py
scans the source for any other). Each is also a builtin exception so callers can catch
ValueError/TypeError/RuntimeError."""

from __future__ import annotations


class KVFormatError(Exception):
    """Base class of every error kvformats raises on purpose."""


class LayoutError(KVFormatError, ValueError):
    """A layout was declared with impossible parameters, or a cache does not fit its layout."""


class InputError(KVFormatError, ValueError):
    """An argument has the wrong shape, device or value. Nothing was written."""


class InputTypeError(InputError, TypeError):
    """An argument has the wrong type or dtype. Nothing was written."""


class BackendUnavailableError(KVFormatError, RuntimeError):
    """The requested backend cannot run these inputs here; the message names the fix."""


class ConversionError(KVFormatError, ValueError):
    """A conversion cannot be done (or cannot be exact) as asked. Nothing was written."""


class CacheFileError(KVFormatError, ValueError):
    """A cache file is missing, not a regular file, truncated, corrupt, foreign, disagrees with
    its format, or cannot be written."""


class AmbiguousRecordError(LayoutError):
    """A bytes-per-token count (with the head size and hint given) fits more than one record ABI
    (``kvformats.identify_one``): the message names every candidate and what tells them apart;
    nothing is guessed. Pass a ``hint`` (a layout kind, an engine, a format or record name)."""


class RecordMismatchError(CacheFileError):
    """A cache file's metadata records another record ABI (name, version, layout kind, bytes per
    token, head size) than the format it claims has: the message names both identities. Nothing
    is loaded."""


class UnsupportedError(KVFormatError, NotImplementedError):
    """The library does not handle this case (yet): a format without a demo error bound, a
    big-endian host reading the golden vectors. NotImplementedError is a RuntimeError."""


class SettingsError(KVFormatError, TypeError):
    """A launch-settings table was edited directly (kvformats_kernels.settings): settings change
    through ``settings.change``, which also drops the recorded replay plans."""


class UsageError(KVFormatError):
    """A bad command line: the CLI prints one line on stderr and exits with status 2."""


class OutputError(KVFormatError, OSError):
    """An output file cannot be written: its directory is missing, a directory stands in its
    place, or the file system refuses. The message names the path."""


class CacheWriteError(CacheFileError, OutputError):
    """A cache file cannot be written (both a CacheFileError and an OutputError)."""


class TransferError(KVFormatError, RuntimeError):
    """A page transfer failed: the engine reported an error or a hand-off timed out. The pages
    it was moving are not valid on the destination."""


class HandshakeError(TransferError, ValueError):
    """The two sides of a transfer describe their caches differently (format, parameters,
    profile, page stride or fingerprint); the message names the cache and the difference.
    Nothing was moved."""


class IntegrityError(TransferError, ValueError):
    """Pages arrived with other bytes than were sent: the message names the cache, page and
    region whose checksum differs. The pages are not valid on the destination."""


def __getattr__(name: str):
    """``StrategyArgumentError`` is made on first use: it is also hypothesis's InvalidArgument (the
    error hypothesis users expect from a strategy), and ``import kvformats`` must not import
    hypothesis, which only ``kvformats.testing.strategies`` needs."""
    if name == "StrategyArgumentError":
        from hypothesis.errors import InvalidArgument

        class StrategyArgumentError(KVFormatError, InvalidArgument):
            """A strategy of kvformats.testing.strategies was called with an invalid argument."""

        StrategyArgumentError.__module__, StrategyArgumentError.__qualname__ = __name__, name
        globals()[name] = StrategyArgumentError
        return StrategyArgumentError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def describe(t: object) -> str:
    """Short description of an argument for error messages: dtype, shape and device of a tensor."""
    import torch

    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return f"{type(t).__name__} {t!r}"


def memory_problem(t) -> str | None:
    """Why a kernel cannot take tensor ``t``'s memory as its values, as the end of a sentence
    that names the argument ("x is a sparse_coo tensor ..."), or None when it can. Kernels read
    and write a strided tensor's memory as it lies: a sparse (or mkldnn) tensor has no such
    memory, and a view with the conjugate or negative bit set (``x.conj()``, ``x.conj().imag``)
    holds its values unconjugated or unnegated, the bit being applied lazily by torch, so a
    kernel would silently read (or write) the other values."""
    import torch

    if t.layout != torch.strided:
        return (f"is a {str(t.layout).replace('torch.', '')} tensor ({describe(t)}); kvformats ops take strided "
                f"(dense) tensors: pass .to_dense()")
    if t.is_conj():
        return (f"is a view with the conjugate bit set ({describe(t)}): its memory holds the values "
                f"unconjugated; pass .resolve_conj()")
    if t.is_neg():
        return (f"is a view with the negative bit set ({describe(t)}, e.g. the .imag of a conjugated complex "
                f"tensor): its memory holds the values unnegated; pass .resolve_neg()")
    return None
