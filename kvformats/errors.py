"""Error types. Each is also a builtin exception so callers can catch ValueError/TypeError."""

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


def describe(t: object) -> str:
    """Short description of an argument for error messages: dtype, shape and device of a tensor."""
    import torch

    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return f"{type(t).__name__} {t!r}"
