"""``write_rows`` stores whatever uint8 ``[N, row_bytes]`` tensor a format's ``encode_rows``
returns, a view of its input included (issue 46): where the view's storage offset or row stride
keeps it from being read as wider words, the rows are copied first, and the bytes stored are the
same. A result of another dtype or shape is a LayoutError naming the format. The format here is
a scratch one, registered for the test only, whose encode_rows returns its (bf16) input's bytes."""

from __future__ import annotations

import attrs
import pytest
import torch

from kvformats.codec import registry
from kvformats.codec.rows import read_rows, write_rows
from kvformats.codec.slot_ops import register_reference_ops
from kvformats.errors import LayoutError
from kvformats.examples import Examples
from kvformats.layout import Field, Layout, Segment, positive

NAME = "scratch_view_rows"


@attrs.frozen(kw_only=True)
class ViewRows(Layout):
    """Raw bf16 rows: encode_rows returns a view of its input's bytes, never a copy."""

    name = NAME
    quant_input_dtype = torch.bfloat16
    examples = Examples(params=(dict(head_dim=8),))

    head_dim: int = attrs.field(default=8, validator=positive)
    page_size: int = attrs.field(default=4, validator=positive)

    def _check_geometry(self):
        pass

    def _segments(self):
        return (Segment("row", (Field("values", "bfloat16", self.head_dim),)),)

    def encode_rows(self, x):
        return x.view(torch.uint8)  # a view of the input: its storage offset is the input's

    def decode_rows(self, rows):
        return rows.contiguous().view(torch.bfloat16).float()


@pytest.fixture
def layout():
    registry.register_format(ViewRows)
    register_reference_ops(NAME)
    try:
        yield ViewRows()
    finally:
        registry.unregister_format(NAME)


def _inputs(n: int, head_dim: int, lead: int) -> torch.Tensor:
    """bf16 ``[n, head_dim]`` rows that start ``lead`` elements into their storage."""
    flat = torch.randn(lead + n * head_dim, generator=torch.Generator().manual_seed(lead)).bfloat16()
    return flat[lead:].view(n, head_dim)


@pytest.mark.parametrize("lead", [1, 2, 3, 4, 8])  # byte offsets 2, 4, 6 (no int64 view), 8, 16
def test_rows_that_view_the_input_at_any_offset_are_stored(layout, lead):
    x = _inputs(6, layout.head_dim, lead)
    assert x.storage_offset() == lead and layout.encode_rows(x).storage_offset() == 2 * lead
    cache = layout.allocate(3)
    slots = torch.tensor([5, 0, 11, 2, 7, 9])
    layout.encode(x, cache, slots)  # the public path: encode_rows, then write_rows
    assert torch.equal(read_rows(layout, cache, slots), x.view(torch.uint8))
    assert torch.equal(layout.decode(cache, slots), x.float())
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots] = False
    assert not read_rows(layout, cache, untouched.nonzero().squeeze(1)).any()  # no other row written


def test_a_view_with_skipped_and_strided_rows_is_stored(layout):
    """A row stride that is not a multiple of the word (one row of bytes, then a gap of 2), a
    single row whose stride is arbitrary, and rows whose slot is skipped (negative)."""
    d = layout.row_bytes
    base = torch.randint(0, 256, (4 * (d + 2) + 3,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    rows = base.as_strided((4, d), (d + 2, 1), 3)
    cache = layout.allocate(2)
    slots = torch.tensor([1, -1, 6, 3])
    write_rows(layout, cache, slots, rows)
    assert torch.equal(read_rows(layout, cache, slots[[0, 2, 3]]), rows[[0, 2, 3]])
    one = base.as_strided((1, d), (5, 1), 1)  # contiguous in torch's sense (one row), stride 5
    write_rows(layout, cache, torch.tensor([4]), one)
    assert torch.equal(read_rows(layout, cache, torch.tensor([4])), one)


def test_rows_of_another_dtype_or_shape_name_the_format(layout):
    cache = layout.allocate(2)
    slots = torch.tensor([0, 1])
    for bad in (torch.zeros((2, layout.row_bytes), dtype=torch.int8), torch.zeros((2, layout.row_bytes + 1),
                dtype=torch.uint8), torch.zeros((3, layout.row_bytes), dtype=torch.uint8)):
        with pytest.raises(LayoutError, match=f"{NAME}: rows to store must be uint8 \\[2, {layout.row_bytes}\\]"):
            write_rows(layout, cache, slots, bad)
    assert not cache.any()
