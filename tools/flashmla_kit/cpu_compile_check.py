"""Compile (no link) every source of the kit on a machine without a GPU or a CUDA build of torch.

    python tools/flashmla_kit/cpu_compile_check.py [KIT, default .flashmla] [--jobs N] [--only SUBSTR]

Uses the kit's own source list and flags (setup_sparse_decode.py) plus the defines and include
paths torch.utils.cpp_extension adds; torch's headers come from whatever torch is installed (the
CUDA headers of c10/ATen ship in CPU wheels too). It proves the kit is complete and compiles
with this nvcc; it cannot link (a CPU torch has no libc10_cuda) or run. Prints each unit's time.
"""

import argparse
import concurrent.futures as cf
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from torch.utils import cpp_extension

ap = argparse.ArgumentParser()
ap.add_argument("kit", nargs="?", default=".flashmla")
ap.add_argument("--jobs", type=int, default=2)
ap.add_argument("--only", default="")
args = ap.parse_args()
kit = Path(args.kit).resolve()
spec = importlib.util.spec_from_file_location("kit_setup", kit / "setup_sparse_decode.py")
ks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ks)

nvcc = shutil.which("nvcc")
assert nvcc, "no nvcc on PATH"
incs = [f"-I{p}" for p in ks.INCLUDES] + [f"-I{p}" for p in cpp_extension.include_paths()]
incs.append(f"-I{sysconfig.get_paths()['include']}")
cuda_home = Path(os.environ.get("CUDA_HOME") or ("/usr/local/cuda" if Path("/usr/local/cuda/include").is_dir()
                                                  else Path(nvcc).resolve().parents[1]))
incs.append(f"-I{cuda_home / 'include'}")
# api_sparse_decode.cpp includes ATen/cuda/CUDAContext.h, which needs a CUDA build of torch (its
# generated c10/cuda/impl/cuda_cmake_macros.h) and the cuBLAS/cuSPARSE/cuSOLVER headers; where
# those are absent that unit fails here and only the GPU machine's build checks it.
defs = ["-DTORCH_EXTENSION_NAME=cuda", "-DTORCH_API_INCLUDE_EXTENSION_H", "-D_GLIBCXX_USE_CXX11_ABI=1"]
out = Path(tempfile.mkdtemp(prefix="flashmla_cpu_check_"))


def compile_one(src: str):
    obj = out / (src.replace("/", "_") + ".o")
    if src.endswith(".cu"):
        cmd = [nvcc, "-c", str(kit / src), "-o", str(obj), *incs, *defs, "--compiler-options", "-fPIC",
               "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", *ks.NVCC_ARGS]
    else:
        cmd = ["g++", "-c", str(kit / src), "-o", str(obj), "-fPIC", *incs, *defs, *ks.CXX_ARGS]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return src, r.returncode, time.time() - t, r.stderr


sources = [s for s in ks.SOURCES if args.only in s]
print(f"{len(sources)} units, {args.jobs} at a time, objects in {out}", flush=True)
failed = 0
with cf.ThreadPoolExecutor(args.jobs) as ex:
    for src, rc, dt, err in ex.map(compile_one, sources):
        spills = [ln for ln in err.splitlines() if "spill" in ln.lower() and " 0 bytes spill" not in ln]
        print(f"{'ok  ' if rc == 0 else 'FAIL'} {dt:7.1f} s  {src}" + (f"  ({len(spills)} spill lines)" if spills else ""),
              flush=True)
        if rc:
            failed += 1
            print("\n".join([ln for ln in err.splitlines() if "error" in ln][:20] or err.splitlines()[-20:]))
sys.exit(1 if failed else 0)
