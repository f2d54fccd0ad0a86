"""Kept for one release: this module moved to ``kvformats.caches.files``; this name is that module."""

import sys
import warnings

import kvformats.caches.files

warnings.warn("kvformats.io moved to kvformats.caches.files; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.caches.files
