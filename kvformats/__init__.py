"""kvformats: the quantized KV-cache formats of DeepSeek V4 serving, byte-exact.

    import kvformats as kvf
    layout = kvf.get_format("fp8_ds_mla", page_size=64)
    cache = layout.allocate(num_pages=16)
    layout.encode(x, cache, slots)          # x [N, 512] bf16/fp16/fp32, slots [N] int
    y = layout.decode(cache, slots)         # bf16 [N, 512], zero rows for slot < 0

Importing kvformats never imports Triton; kernels load on the first CUDA call.
"""

import warnings

# torch warns "Failed to initialize NumPy" on import when numpy is absent, as in a base install
# (torch, attrs): nothing kvformats runs there converts to numpy (the io extra, which does, brings
# numpy), so the warning was noise on every command. Ignored for torch's import only.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch  # noqa: F401

# The composition root: every format registered with its reference ops, the layouts' public ops and
# record property bound from the codec layer above them. Here, at the package front, and nowhere
# else (tests/test_layers.py), so no layer reaches up into another while it is imported.
from kvformats import layout as _layout  # noqa: E402
from kvformats.codec import paged_ops as _paged_ops, records as _records, registry as _registry  # noqa: E402
from kvformats.codec import slot_ops as _slot_ops  # noqa: E402
from kvformats.formats import FORMATS as _FORMATS  # noqa: E402
from kvformats.report.layout_html import layout_html as _layout_html  # noqa: E402
from kvformats.runtime import replay as _replay  # noqa: E402

for _cls in _FORMATS:
    _registry.register_format(_cls)
    _slot_ops.register_reference_ops(_cls.name)
del _cls
# A layout is frozen and kept alive by the plans that key it, so replay keys layouts by identity.
_replay.by_id(_layout.Layout)
_layout.bind_codec(_slot_ops, _paged_ops)
_records.bind_records()
_layout.bind_html(_layout_html)  # a layout's rich display in notebooks: its byte map and region table

from kvformats.codec.records import Record, identify, identify_one, list_records  # noqa: E402
from kvformats.codec.registry import get_format, list_formats  # noqa: E402
from kvformats.errors import (  # noqa: E402
    AmbiguousRecordError,
    BackendUnavailableError,
    CacheFileError,
    CacheWriteError,
    ConversionError,
    HandshakeError,
    InputError,
    InputTypeError,
    IntegrityError,
    KVFormatError,
    LayoutError,
    OutputError,
    RecordMismatchError,
    SettingsError,
    TransferError,
    UnsupportedError,
    UsageError,
)
from kvformats.formats import (  # noqa: E402
    CompressorState,
    CompressorStateV41,
    Fp4DsMlaV41,
    Fp4DsMlaV41Interleaved,
    Fp8DsMla,
    Fp8DsMlaV32,
    Fp8DsMlaV41,
    Fp8DsMlaV41Interleaved,
    Fp8Indexer,
    Mxfp4Indexer,
    Nvfp4DsMla,
)
from kvformats.layout import Field, Layout, Region, Segment  # noqa: E402
from kvformats.numerics.profiles import PROFILE_NAMES, Profile, supported_profiles  # noqa: E402
from kvformats.report.inspection import Inspection, inspect  # noqa: E402
from kvformats.runtime.deferred import error_record, pending_error, raise_pending, strict_checks  # noqa: E402

from kvformats.version import SPEC_VERSION, __version__  # noqa: E402

__all__ = [
    "BackendUnavailableError", "CacheFileError", "CacheWriteError", "CompressorState", "CompressorStateV41",
    "ConversionError",
    "Field", "Fp4DsMlaV41", "Fp4DsMlaV41Interleaved", "Fp8DsMla", "Fp8DsMlaV32", "Fp8DsMlaV41",
    "Fp8DsMlaV41Interleaved", "Fp8Indexer", "HandshakeError",
    "InputError", "InputTypeError", "Inspection", "IntegrityError", "KVFormatError", "Layout", "LayoutError",
    "Mxfp4Indexer", "Nvfp4DsMla", "OutputError", "PROFILE_NAMES", "Profile", "Region", "Segment", "SettingsError",
    "TransferError", "UnsupportedError", "UsageError", "error_record", "get_format", "inspect", "list_formats",
    "pending_error", "raise_pending", "strict_checks", "supported_profiles", "SPEC_VERSION", "__version__",
    "AmbiguousRecordError", "Record", "RecordMismatchError", "identify", "identify_one", "list_records",
]


def __dir__() -> list[str]:
    """The public names and the loaded subpackages; not the names the imports above bind
    (``torch``, ``warnings``)."""
    subpackages = {n for n, v in globals().items() if getattr(v, "__name__", None) == f"{__name__}.{n}"
                   and not n.startswith("_")}
    return sorted({*__all__, *subpackages, "__all__", "__doc__", "__file__", "__name__", "__path__"})
