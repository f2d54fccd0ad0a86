"""One module per format; importing this package registers them all."""

from kvformats.formats.compressor_state import CompressorState
from kvformats.formats.fp4_ds_mla_v41 import Fp4DsMlaV41
from kvformats.formats.fp8_ds_mla import Fp8DsMla
from kvformats.formats.fp8_ds_mla_v32 import Fp8DsMlaV32
from kvformats.formats.fp8_ds_mla_v41 import Fp8DsMlaV41
from kvformats.formats.fp8_indexer import Fp8Indexer
from kvformats.formats.mxfp4_indexer import Mxfp4Indexer

__all__ = ["CompressorState", "Fp4DsMlaV41", "Fp8DsMla", "Fp8DsMlaV32", "Fp8DsMlaV41", "Fp8Indexer", "Mxfp4Indexer"]
