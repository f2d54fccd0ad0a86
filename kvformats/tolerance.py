"""Kept for one release: this module moved to ``kvformats.testing.tolerance``; this name is that module."""

import sys
import warnings

import kvformats.testing.tolerance

warnings.warn("kvformats.tolerance moved to kvformats.testing.tolerance; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.testing.tolerance
