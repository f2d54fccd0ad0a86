"""Kept for one release: this module moved to ``kvformats.deepseek_v4.rope``; this name is that module."""

import sys
import warnings

import kvformats.deepseek_v4.rope

warnings.warn("kvformats.rope moved to kvformats.deepseek_v4.rope; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.deepseek_v4.rope
