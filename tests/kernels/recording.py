"""Helpers of the error-record kernel tests: read the device record, and the words a violation
must leave there (kvformats.runtime.deferred: [state, check, site, index, value, bound, 0, 0])."""

from __future__ import annotations

import torch

from kvformats.runtime import deferred

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def take_record() -> list[int]:
    """The record's words, then clear it."""
    rec = deferred.error_record(DEV)
    words = rec.tolist()
    rec.zero_()
    return words


def expect(check, op: str, arg: str, index: int, value: int, bound: int) -> list[int]:
    return [1, int(check), deferred.site(op, arg), index, value, bound, 0, 0]


def check_words(kernel: list[int], reference: list[int], want, op: str, arg: str | None = None) -> None:
    """The kernel recorded what the reference recorded, and that is ``want``: None (nothing), or
    (check, index, value, bound) at (op, arg), or (check, arg, index, value, bound) at op."""
    assert kernel == reference
    if want is None:
        assert kernel == [0] * deferred.WORDS
    elif arg is None:
        check, arg_name, index, value, bound = want
        assert kernel == expect(check, op, arg_name, index, value, bound)
    else:
        assert kernel == expect(want[0], op, arg, *want[1:])
