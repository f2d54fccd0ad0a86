"""Kept for one release: this module moved to ``kvformats.codec.paged_ops``; this name is that module."""

import sys
import warnings

import kvformats.codec.paged_ops

warnings.warn("kvformats.paged moved to kvformats.codec.paged_ops; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.codec.paged_ops
