"""Kept for one release: this module moved to ``kvformats.dsv4_layer.pipeline``; this name is that module."""

import sys
import warnings

import kvformats.dsv4_layer.pipeline

warnings.warn("kvformats.deepseek_v4.pipeline moved to kvformats.dsv4_layer.pipeline; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.dsv4_layer.pipeline
