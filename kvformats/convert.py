"""Kept for one release: this module moved to ``kvformats.codec.convert``; this name is that module."""

import sys
import warnings

import kvformats.codec.convert

warnings.warn("kvformats.convert moved to kvformats.codec.convert; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.codec.convert
