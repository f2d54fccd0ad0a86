"""Kept for one release: this module moved to ``kvformats.codec.registry``; this name is that module."""

import sys
import warnings

import kvformats.codec.registry

warnings.warn("kvformats.registry moved to kvformats.codec.registry; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.codec.registry
