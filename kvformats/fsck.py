"""Kept for one release: this module moved to ``kvformats.caches.check``; this name is that module."""

import sys
import warnings

import kvformats.caches.check

warnings.warn("kvformats.fsck moved to kvformats.caches.check; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.caches.check
