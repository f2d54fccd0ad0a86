"""The torch.library custom-op wrappers refuse sparse tensors and negative-bit views with
InputTypeError before torch's dispatcher meets them (issue 44 item 11: the dispatcher's own
errors are untyped), as the Python functions do (tests/test_tensor_forms.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import kvformats.codec.torch_ops as kops
import kvformats.deepseek_v4.torch_ops as dops
import kvformats.deepseek_v41.torch_ops as d41
from kvformats.errors import InputTypeError
from kvformats.formats import Fp8DsMla


def _sparse(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return t.to_sparse()


FORMS = {"negative": lambda t: torch._neg_view(-t), "sparse": _sparse}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_codec_wrappers(form):
    lay = Fp8DsMla(page_size=4)
    cache, slots, x = lay.allocate(2), torch.tensor([0, 5]), torch.randn(2, 512)
    before = cache.clone()
    bad = FORMS[form]
    with pytest.raises(InputTypeError, match="x"):
        kops.encode(lay, bad(x), cache, slots)
    with pytest.raises(InputTypeError, match="slots"):
        kops.decode(lay, cache, bad(slots))
    with pytest.raises(InputTypeError, match="cache"):
        kops.gather(lay, bad(cache.float()).to(torch.uint8) if form == "sparse" else bad(cache), slots)
    assert torch.equal(cache, before)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_model_op_wrappers(form):
    bad = FORMS[form]
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    with pytest.raises(InputTypeError, match="x"):
        dops.hadamard_transform(bad(x))
    q = torch.randn(2, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(InputTypeError, match="q"):
        d41.index_q_quantize(bad(q))
