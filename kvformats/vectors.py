"""Kept for one release: this module moved to ``kvformats.spec.vectors``; this name is that module."""

import sys
import warnings

import kvformats.spec.vectors

warnings.warn("kvformats.vectors moved to kvformats.spec.vectors; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.spec.vectors
