"""Kept for one release: this module moved to ``kvformats.codec.slot_ops``; this name is that module."""

import sys
import warnings

import kvformats.codec.slot_ops

warnings.warn("kvformats.ops moved to kvformats.codec.slot_ops; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.codec.slot_ops
