"""kvformats: the quantized KV-cache formats of DeepSeek V4 serving, byte-exact.

    import kvformats as kvf
    layout = kvf.get_format("fp8_ds_mla", page_size=64)
    cache = layout.allocate(num_pages=16)
    layout.encode(x, cache, slots)          # x [N, 512] bf16/fp16/fp32, slots [N] int
    y = layout.decode(cache, slots)         # bf16 [N, 512], zero rows for slot < 0

Importing kvformats never imports Triton; kernels load on the first CUDA call.
"""

import kvformats.codec  # noqa: F401  (registers the formats, binds the layouts' ops)
from kvformats.codec.registry import get_format, list_formats
from kvformats.errors import (
    BackendUnavailableError,
    CacheFileError,
    CacheWriteError,
    ConversionError,
    InputError,
    InputTypeError,
    KVFormatError,
    LayoutError,
    OutputError,
    SettingsError,
    UnsupportedError,
    UsageError,
)
from kvformats.formats import CompressorState, Fp4DsMlaV41, Fp8DsMla, Fp8DsMlaV32, Fp8DsMlaV41, Fp8Indexer, Mxfp4Indexer
from kvformats.layout import Field, Layout, Region, Segment
from kvformats.numerics.profiles import PROFILE_NAMES, Profile, supported_profiles
from kvformats.runtime.deferred import error_record, pending_error, raise_pending, strict_checks

__version__ = "0.1.0"
SPEC_VERSION = "1"

__all__ = [
    "BackendUnavailableError", "CacheFileError", "CacheWriteError", "CompressorState", "ConversionError", "Field", "Fp4DsMlaV41", "Fp8DsMla", "Fp8DsMlaV32", "Fp8DsMlaV41", "Fp8Indexer", "InputError",
    "InputTypeError", "KVFormatError", "Layout", "LayoutError", "Mxfp4Indexer", "OutputError", "PROFILE_NAMES", "Profile",
    "Region", "Segment", "SettingsError", "UnsupportedError", "UsageError", "error_record", "get_format", "list_formats", "pending_error", "raise_pending",
    "strict_checks", "supported_profiles", "SPEC_VERSION", "__version__",
]
