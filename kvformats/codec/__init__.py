"""The codec layer: argument checks run, the registry picks a backend, rows move.

The package front (``kvformats/__init__.py``) is the composition root: it registers every format
of ``kvformats.formats`` here with its reference ops and hands the layouts their public methods
(``layout.encode`` ...) and record property, so neither the formats nor the declaration import
anything from here.
"""
