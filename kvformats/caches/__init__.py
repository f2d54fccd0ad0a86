"""Caches as data: cache files (``files``), the bytes and values of any region (``regions``),
annotated hexdumps (``hexdump``), field-wise diffs (``diff``) and the page checker of
``kvformats check`` (``check``)."""
