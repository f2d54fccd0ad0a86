"""Tensors whose memory does not hold their values (issue 44 item 11): sparse tensors and views with
the negative or conjugate bit set are refused with InputTypeError by every public op, on its full
path (``kvformats.validation.check_tensor`` / ``check_cache``) and before the replay key reads
their addresses (``kvformats.runtime.replay._signature``). A kernel reads a tensor's memory as it
lies: a sparse tensor has none (``data_ptr`` raised an untyped RuntimeError), and a view with the
negative bit (``x.conj().imag``) holds its values unnegated, which a kernel would silently take."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from kvformats.errors import InputTypeError, memory_problem
from kvformats.runtime import replay
from kvformats.validation import check_tensor
from tests.harness.calls import public_calls

CALLS = public_calls("cpu", 8)
NAMES = sorted(CALLS)


def _negative(t: torch.Tensor) -> torch.Tensor:
    """A view of ``t``'s values with the negative bit set: its memory holds -t."""
    return torch._neg_view(-t if t.dtype != torch.bool else t)


def _sparse(t: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():  # sparse CSR's "beta" warning
        warnings.simplefilter("ignore")
        return t.to_sparse_csr() if t.dim() == 2 else t.to_sparse()


FORMS = {"negative": (_negative, "negative bit"), "sparse": (_sparse, "sparse")}


@functools.cache
def _op_tensors(name: str) -> tuple[int, ...]:
    """Indices (in ``rebuild`` order) of the tensors that the prepared call ``name`` passes to
    the public op: the ones the replay key reads (a prepared call's closure holds others too)."""
    from replay_fuzz import stub_with_replay, tensors_of

    held = tensors_of(CALLS[name])
    seen: set[int] = set()
    real = replay._signature

    def spy(args, tensors, *rest):
        out = real(args, tensors, *rest)
        seen.update(id(t) for t in tensors)
        return out

    replay._signature = spy
    try:
        with stub_with_replay():
            CALLS[name]()
    finally:
        replay._signature = real
    return tuple(i for i, t in enumerate(held) if id(t) in seen)


def _with(name: str, index: int, make):
    """The prepared call ``name`` with its ``index``-th tensor replaced by ``make(tensor)``."""
    from replay_fuzz import rebuild, tensors_of

    target = tensors_of(CALLS[name])[index]
    bad = make(target)
    return rebuild(CALLS[name], lambda path, v: bad if v is target else v, {}), target


@pytest.mark.parametrize("path", ["full", "replayed"])
@pytest.mark.parametrize("name", NAMES)
def test_every_public_op_refuses_tensors_whose_memory_is_not_their_values(name, path):
    pytest.importorskip("triton")
    from replay_fuzz import stub_with_replay

    indices = _op_tensors(name)
    assert indices, f"{name}: no tensor reached the op"
    for index in indices:
        for form, (make, words) in FORMS.items():
            fn, target = _with(name, index, make)
            if path == "full":  # CPU tensors: the reference, after the argument checks
                with pytest.raises(InputTypeError, match=words):
                    fn()
            else:  # the launchers' path, whose replay key reads every tensor argument first
                with stub_with_replay(), pytest.raises(InputTypeError, match=words) as info:
                    fn()
                assert "a tensor argument" in str(info.value)  # refused by the key, not later


def test_check_tensor_names_the_argument_and_the_fix():
    x = torch.randn(4, 8)
    cases = [(_negative(x), "negative bit", "resolve_neg"), (x.to_sparse(), "sparse_coo", "to_dense"),
             (torch.complex(x, x).conj(), "conjugate bit", "resolve_conj")]
    for t, words, fix in cases:  # said before the dtype of the conjugate view (complex64) is
        with pytest.raises(InputTypeError, match=words) as info:
            check_tensor("x", t, dtypes=(torch.float32,), shape=(4, 8))
        assert str(info.value).startswith("x is a ") and fix in str(info.value)
    assert memory_problem(x) is None and memory_problem(x.conj()) is None  # a real tensor has no conjugate bit


def test_the_replay_key_refuses_them_before_reading_an_address(monkeypatch):
    """A sparse tensor has no data pointer: the key raised torch's untyped RuntimeError."""
    monkeypatch.setattr(replay.SWITCHES, "any_device", True)  # CPU tensors are keyed too
    x = torch.randn(4, 8)
    for bad, words in ((x.to_sparse(), "sparse"), (_sparse(x), "sparse_csr"), (_negative(x), "negative bit"),
                       (torch.complex(x, x).conj(), "conjugate bit")):
        with pytest.raises(InputTypeError, match=words):
            replay._signature((1, (x, bad)), [], [], [], {})
    assert replay._signature((x, torch.complex(x, x)), [], [], [], {}) is not None  # no bit: keyed as ever
