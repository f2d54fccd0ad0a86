"""One module per format; importing this package registers them all."""

from kvformats.formats.compressor_state import CompressorState
from kvformats.formats.fp8_ds_mla import Fp8DsMla
from kvformats.formats.fp8_ds_mla_v32 import Fp8DsMlaV32
from kvformats.formats.fp8_indexer import Fp8Indexer
from kvformats.formats.mxfp4_indexer import Mxfp4Indexer

__all__ = ["CompressorState", "Fp8DsMla", "Fp8DsMlaV32", "Fp8Indexer", "Mxfp4Indexer"]
