"""Kept for one release: this module moved to ``kvformats.dsv4_layer.pipeline_config``; this name is that module."""

import sys
import warnings

import kvformats.dsv4_layer.pipeline_config

warnings.warn("kvformats.deepseek_v4.pipeline_config moved to kvformats.dsv4_layer.pipeline_config; "
              "import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kvformats.dsv4_layer.pipeline_config
