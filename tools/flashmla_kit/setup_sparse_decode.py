"""Build flash_mla.cuda with FlashMLA's SM90 sparse fp8 decode only (kvformats interop kit).

Run from the kit folder (build.sh does): python setup_sparse_decode.py build_ext
--build-lib <out>/lib --build-temp <out>/tmp. Compiler flags are FlashMLA's setup.py flags at
the pinned commit, with the arch list restricted to sm_90a; the sources are the four SM90 sparse
decode instantiations (V3.2 and MODEL1/V4, 64 and 128 heads: the dispatcher references all four),
the scheduler-metadata and combine kernels, our one-function binding and our SM100 stubs.
"""

import os
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

KIT = Path(__file__).resolve().parent
os.chdir(KIT)  # setuptools wants relative source paths
SRC = "src/csrc"

SOURCES = [
    "api_sparse_decode.cpp",
    "sm100_stubs.cpp",
    f"{SRC}/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    f"{SRC}/smxx/decode/combine/combine.cu",
    f"{SRC}/sm90/decode/sparse_fp8/instantiations/model1_persistent_h64.cu",
    f"{SRC}/sm90/decode/sparse_fp8/instantiations/model1_persistent_h128.cu",
    f"{SRC}/sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu",
    f"{SRC}/sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu",
]

CXX_ARGS = ["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations"]
NVCC_ARGS = [
    "-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
    "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage,"
    "--warn-on-double-precision-use",
    "-lineinfo", "--source-in-ptx",
    "-gencode", "arch=compute_90a,code=sm_90a",
    # FlashMLA passes --threads 32 (it compiles two archs); one arch gains nothing from more.
    "--threads", os.environ.get("NVCC_THREADS", "1"),
]
INCLUDES = [KIT / SRC, KIT / SRC / "api", KIT / SRC / "kerutils" / "include", KIT / SRC / "sm90",
            KIT / "cutlass" / "include"]

if __name__ == "__main__":
    missing = [s for s in SOURCES if not (KIT / s).is_file()]
    assert not missing, f"kit incomplete, missing {missing}"
    setup(
        name="flash_mla_sparse_decode_kit",
        version="0.0.0",
        ext_modules=[CUDAExtension(name="flash_mla.cuda", sources=SOURCES,
                                   extra_compile_args={"cxx": CXX_ARGS, "nvcc": NVCC_ARGS},
                                   include_dirs=[str(p) for p in INCLUDES])],
        cmdclass={"build_ext": BuildExtension},
    )
