"""CLI messages and tables (issue 35 item 18): what a reader needs to act on, in the CLI's terms."""

from __future__ import annotations

import re

import pytest

import kvformats as kvf
from kvformats.spec.diagram import layout_svg


@pytest.mark.parametrize("name", kvf.list_formats())
def test_diagram_labels_the_page_end_and_the_row_end(name):
    """The fp8_ds_mla page map once stopped at 36864: its end, 37440, collided with other labels."""
    layout = kvf.get_format(name)
    labels = re.findall(r'class="off">(\d+)<', layout_svg(layout))
    assert str(layout.page_bytes) in labels and str(layout.row_bytes) in labels, labels
