"""Kept for one release: this module moved to ``kvformats.dsv4_layer.synthetic``; this name is that module."""

import sys
import warnings

import kvformats.dsv4_layer.synthetic

warnings.warn("kvformats.deepseek_v4.synthetic moved to kvformats.dsv4_layer.synthetic; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.dsv4_layer.synthetic
