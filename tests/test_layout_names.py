"""The object users hold shows the declaration, its geometry and its ops: ``Layout``'s public names
are exactly the lists below. A fixture for tests or docs belongs in ``Layout.examples``
(kvformats.examples.Examples), so one added to ``Layout`` itself fails here."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.errors import UsageError
from kvformats.examples import Examples
from kvformats.layout import Layout

DECLARATION = {
    "name", "page_size", "page_alignment", "container_dtype", "quant_input_dtype", "params", "record",
    "encode_rows", "decode_rows", "check_encode_input", "scale_order", "decode_dtype", "decode_dtypes",
    "examples",  # the fixtures, one declared object
}
GEOMETRY = {
    "segments", "segment_offsets", "row_bytes", "min_page_bytes", "page_bytes", "regions", "region", "row_span",
    "data_regions", "slot_offsets", "cache_shape", "page_shape", "paged_reads", "describe",
}
OPS = {
    "allocate", "byte_pages", "segment_view", "views",
    "encode", "decode", "gather", "dequantize_gather", "gather_paged", "decode_topk",
}


def test_layout_shows_declaration_geometry_and_ops_only():
    names = {n for n in dir(Layout) if not n.startswith("_")}
    assert not DECLARATION & GEOMETRY and not GEOMETRY & OPS and not DECLARATION & OPS
    assert names - (DECLARATION | GEOMETRY | OPS) == set(), "not declaration, geometry or an op: " \
        "a fixture belongs in Layout.examples (kvformats.examples.Examples)"
    assert (DECLARATION | GEOMETRY | OPS) - names == set()


def test_every_format_declares_its_examples_as_one_object():
    for name in kvf.list_formats():
        cls = type(kvf.get_format(name))
        assert isinstance(cls.examples, Examples) and cls.examples.layout is None, name
        assert {n for n in dir(cls) if not n.startswith("_")} >= {"examples"}
        for fixture in ("example_params", "small_params", "one_block_params", "worked_examples",
                        "value_idempotent", "example_encode_args", "decoded_reference", "page_size_range"):
            assert not hasattr(cls, fixture), f"{name} declares {fixture} outside its examples"


def test_examples_read_through_a_layout_are_bound_to_it():
    layout = kvf.get_format("compressor_state", head_dim=2, ratio=4)
    assert layout.examples.layout is layout and type(layout).examples.layout is None
    assert layout.examples == type(layout).examples  # the same declaration, bound
    x, kwargs, ref = layout.examples.encode_args(3, None, torch.Generator().manual_seed(0))
    assert torch.equal(layout.examples.decoded_reference(x, **kwargs), ref) and ref.shape == (3, 2 * layout.width)
    rows = kvf.get_format("fp8_indexer")
    x, kwargs, ref = rows.examples.encode_args(2, torch.ones, None)
    assert kwargs == {} and torch.equal(ref, torch.ones(2, rows.head_dim))
    with pytest.raises(UsageError, match="layout.examples"):
        type(rows).examples.encode_args(2, torch.ones, None)
