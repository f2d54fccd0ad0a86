"""Kept for one release: this module moved to ``kvformats.testing.strategies``; this name is that module."""

import sys
import warnings

import kvformats.testing.strategies

warnings.warn("kvformats.strategies moved to kvformats.testing.strategies; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.testing.strategies
