"""Kept for one release: this module moved to ``kvformats.codec.torch_ops``; this name is that module."""

import sys
import warnings

import kvformats.codec.torch_ops

warnings.warn("kvformats.torch_ops moved to kvformats.codec.torch_ops; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.codec.torch_ops
