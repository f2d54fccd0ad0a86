"""Kept for one release: this module moved to ``kvformats.numerics.profiles``; this name is that module."""

import sys
import warnings

import kvformats.numerics.profiles

warnings.warn("kvformats.profiles moved to kvformats.numerics.profiles; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.numerics.profiles
