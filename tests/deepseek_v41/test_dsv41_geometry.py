"""DeepSeek V4.1's cache geometry (kvformats/deepseek_v41/geometry.py, spec/dsv41-geometry.md):
tokenspeed's declared packing checked against the fields built from kvformats' own row widths."""

from __future__ import annotations

import pytest

from kvformats.errors import InputError

from kvformats.deepseek_v41 import geometry as g

ROWS = {"v41": {"swa": 528, "global": 288, "index": 68}, "v4": {"swa": 584, "global": 584, "index": 132}}


@pytest.mark.parametrize("name", sorted(g.CACHE_FORMATS))
def test_row_widths_are_the_kvformats_records(name):
    fmt = g.CACHE_FORMATS[name]
    assert {role: fmt.row_bytes(role) for role in ROWS[name]} == ROWS[name]


@pytest.mark.parametrize("name", sorted(g.CACHE_FORMATS))
@pytest.mark.parametrize("dspark", [0, 3])
def test_every_group_fills_the_parent_within_the_padding_bound(name, dspark):
    fmt = g.CACHE_FORMATS[name]
    packing, parent = (fmt.dspark_packing, fmt.dspark_parent_bytes) if dspark else (fmt.packing, fmt.parent_bytes)
    assert set(packing) == set(g.GROUPS)
    for group in g.GROUPS:
        used = packing[group] * fmt.group_block_bytes(group, dspark)
        assert 0.95 * parent <= used <= parent, (group, used, parent)


def test_block_bytes_of_the_spec_page():
    v41, v4 = g.CACHE_FORMATS["v41"], g.CACHE_FORMATS["v4"]
    assert [v41.group_block_bytes(x) for x in g.GROUPS] == [1_351_680, 3 * 22_784, 22_784, 3 * 8_192]
    assert [v4.group_block_bytes(x) for x in g.GROUPS] == [1_495_040, 3 * 45_824, 45_824, 3 * 8_192]
    assert v41.group_block_bytes(g.SWA, 3) - v41.group_block_bytes(g.SWA) == 3 * g.DSPARK_FIELD_BYTES
    # the SWA fields are one per layer; the tail fields one per ratio-2 owner
    assert len(v41.fields(g.SWA)) == g.NUM_LAYERS
    assert [f.field_id for f in v41.fields(g.COMPRESSOR_TAIL)] == [f"layer.{i}.compressor_tail" for i in (2, 8, 14)]


def test_two_stages_do_not_fit_the_v41_dspark_parent():
    """The DSpark figures are those of 3 stages: with 2, the v41 SWA block pads more than 5 %."""
    fmt = g.CACHE_FORMATS["v41"]
    assert fmt.group_block_bytes(g.SWA, 2) < 0.95 * fmt.dspark_parent_bytes
    assert fmt.group_block_bytes(g.SWA, 4) > fmt.dspark_parent_bytes


def test_table_widths():
    assert g.table_widths(8192, 4) == {g.SWA: 129, g.GLOBAL_R2: 65, g.GLOBAL_R1: 129, g.COMPRESSOR_TAIL: 4098}
    assert g.table_widths(128, 0) == {g.SWA: 2, g.GLOBAL_R2: 1, g.GLOBAL_R1: 2, g.COMPRESSOR_TAIL: 64}
    for bad in [(0, 0), (8, -1), (True, 0), (8.0, 0)]:
        with pytest.raises(InputError):
            g.table_widths(*bad)
