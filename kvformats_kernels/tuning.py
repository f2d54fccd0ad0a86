"""The launch tuning of the byte-format kernels, as declared data: rows per program and warps per
program of each launch, keyed by ``(module, op)``: the kernel module that launches it (its name
inside ``kvformats_kernels``, ``module_name``) and the op it launches there (a function of that
module, or that function's name and a variant: ``encode_mxfp4``). ``_common.config`` reads them;
the launchers call it with their own module's name (``NAME = tuning.module_name(__name__)``).

maxnreg caps the registers per thread (0: the compiler's choice; see ``_common.launch_opts``).
Benchmarks may override entries (through ``settings.change``); tests run whatever is here. The
shapes are a sweep's fastest (benchmarks/bench_kernels_gpu.py --sweep, one- and two-warp shapes
included). They depend on the kernel bodies: re-sweep a module's ops after changing its kernels.
"""

from __future__ import annotations

from kvformats_kernels import settings

PACKAGE = "kvformats_kernels"


def module_name(module: str) -> str:
    """The tables' name of kernel module ``module`` (its ``__name__``): its name inside PACKAGE."""
    return module.removeprefix(PACKAGE + ".")


CONFIG = settings.declare("config", {  # the fastest shapes of large calls (benchmarks/)
    ("fp8_ds_mla", "encode"): {"block_m": 8, "num_warps": 4, "hw_cvt": 1, "maxnreg": 0},
    ("fp8_ds_mla", "decode"): {"block_m": 8, "num_warps": 4, "hw_cvt": 1},
    ("fp8_ds_mla", "dequantize_gather"): {"block_m": 8, "num_warps": 4, "hw_cvt": 1, "maxnreg": 0},
    # evict_first_rows: the slot gather of rows of at most this many bytes marks its loads
    # evict-first in L2 (chosen by measurement: short rows gain, fp8_ds_mla's lose; the figures
    # are in docs/explanation/measured-choices.md); max_unit: the widest unit of the byte copies
    ("rows", "gather"): {"tile_bytes": 4096, "num_warps": 1, "max_unit": 8, "evict_first_rows": 256},
    # cu_scan_max: gather_paged finds the request of a row by one compare against all of
    # cu_seq_lens up to this many requests, by binary search beyond
    ("rows", "gather_paged"): {"tile_bytes": 4096, "num_warps": 1, "max_unit": 8, "cu_scan_max": 64},
    ("indexer", "encode"): {"block_m": 8, "num_warps": 1, "hw_cvt": 1, "maxnreg": 0},  # fp8_indexer
    ("indexer", "encode_mxfp4"): {"block_m": 8, "num_warps": 1, "lane": 1, "hw_cvt": 1},  # mxfp4_indexer
    ("indexer", "decode"): {"block_m": 8, "num_warps": 2, "hw_cvt": 1},
    # mxfp4_cs_stores: the MXFP4 dequantize_gather stores its float32 rows with the streaming
    # hint (chosen by measurement; the FP8 rows and the slot decodes gain nothing from it, so
    # they store plainly: docs/explanation/measured-choices.md)
    ("indexer", "dequantize_gather"): {"block_m": 8, "num_warps": 2, "hw_cvt": 1, "mxfp4_cs_stores": 1},
    # the compressor states' row copies: encode's, and gather's (which decode and decode_topk take too)
    ("state", "encode"): {"block_m": 1, "block_w": 2048, "num_warps": 4},
    ("state", "gather"): {"block_m": 1, "block_w": 2048, "num_warps": 4},
})


# The row counts up to which calls take SMALL's and FEW's overrides (below).
BOUNDS = settings.declare("bounds", {"small_rows": 512, "few_rows": 128})
# Calls of at most BOUNDS["small_rows"] rows (decode steps) take these overrides: a decode step's
# time is one program's chain of dependent loads and instructions, which is shorter in programs
# of a few rows and one warp.
SMALL = settings.declare("small", {
    ("fp8_ds_mla", "encode"): {"block_m": 1, "num_warps": 1},
    ("fp8_ds_mla", "decode"): {"block_m": 2, "num_warps": 1},
    ("rows", "gather"): {"tile_bytes": 1024, "num_warps": 1},
    ("indexer", "encode"): {"block_m": 2, "num_warps": 1},
    ("indexer", "encode_mxfp4"): {"block_m": 8, "num_warps": 1},  # 8 x 4 blocks: one per lane (indexer.py)
    ("indexer", "decode"): {"block_m": 2, "num_warps": 1},
    ("state", "encode"): {"block_m": 1, "block_w": 1024, "num_warps": 4},
    ("state", "gather"): {"block_m": 1, "block_w": 1024, "num_warps": 4},
})
# Calls of at most BOUNDS["few_rows"] rows (and within "small_rows") take FEW's overrides on top of SMALL's:
# one row per program, so that every row has a program of its own while the grid still fits
# on the GPU's SMs; beyond the bound it lengthens the calls it shortens below it
# (docs/explanation/measured-choices.md). The MXFP4 encode then takes its layout without a
# block per lane (indexer.py).
FEW = settings.declare("few", {
    ("fp8_ds_mla", "decode"): {"block_m": 1, "num_warps": 2},
    ("indexer", "encode_mxfp4"): {"block_m": 1, "num_warps": 1},
    ("indexer", "decode"): {"block_m": 1, "num_warps": 1},
})

# launch settings change through settings.change
settings.guard(__name__, "CONFIG", "SMALL", "FEW", "BOUNDS")
