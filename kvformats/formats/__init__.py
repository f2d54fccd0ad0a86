"""One module per format. ``FORMATS`` lists them; the codec layer (``kvformats.codec``) registers
each with its reference ops when it is imported."""

from kvformats.formats.compressor_state import CompressorState
from kvformats.formats.compressor_state_v41 import CompressorStateV41
from kvformats.formats.fp4_ds_mla_v41 import Fp4DsMlaV41, Fp4DsMlaV41Interleaved
from kvformats.formats.fp8_ds_mla import Fp8DsMla
from kvformats.formats.fp8_ds_mla_v32 import Fp8DsMlaV32
from kvformats.formats.fp8_ds_mla_v41 import Fp8DsMlaV41, Fp8DsMlaV41Interleaved
from kvformats.formats.fp8_indexer import Fp8Indexer
from kvformats.formats.mxfp4_indexer import Mxfp4Indexer
from kvformats.formats.nvfp4_ds_mla import Nvfp4DsMla

FORMATS = (CompressorState, CompressorStateV41, Fp4DsMlaV41, Fp4DsMlaV41Interleaved, Fp8DsMla, Fp8DsMlaV32,
           Fp8DsMlaV41, Fp8DsMlaV41Interleaved, Fp8Indexer, Mxfp4Indexer, Nvfp4DsMla)

__all__ = ["FORMATS", "CompressorState", "CompressorStateV41", "Fp4DsMlaV41", "Fp4DsMlaV41Interleaved", "Fp8DsMla",
           "Fp8DsMlaV32", "Fp8DsMlaV41", "Fp8DsMlaV41Interleaved", "Fp8Indexer", "Mxfp4Indexer", "Nvfp4DsMla"]
