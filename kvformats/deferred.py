"""Kept for one release: this module moved to ``kvformats.runtime.deferred``; this name is that module."""

import sys
import warnings

import kvformats.runtime.deferred

warnings.warn("kvformats.deferred moved to kvformats.runtime.deferred; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.runtime.deferred
