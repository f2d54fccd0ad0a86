"""See caches: ``kvformats report`` (one self-contained HTML file of a cache file's pages, and
the diff of two files) and ``kvformats.inspect`` (the same page views inline in a notebook, and
their tables as tensors).

    kvformats report cache.safetensors [other.safetensors] -o report.html [--pages 3,10-12] [--max-pages 8]

    view = kvformats.inspect(cache, layout)   # view.row_status(), view.scale_exponents(page), ...

No notebook package is needed: the views are plain HTML (``_repr_html_``), which Jupyter shows.
"""

from kvformats.report.inspection import Inspection, inspect

__all__ = ["Inspection", "inspect"]
