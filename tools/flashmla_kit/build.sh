#!/usr/bin/env bash
# Build the SM90 sparse fp8 decode of FlashMLA into OUT_DIR (default /tmp/flashmla_build, outside
# the repository): OUT_DIR/lib is then a PYTHONPATH entry with the package flash_mla.
# Needs torch with CUDA, nvcc (CUDA >= 12.8), ninja. Usage: build.sh [OUT_DIR]
set -euo pipefail
KIT=$(cd "$(dirname "$0")" && pwd)
OUT_DIR=$(mkdir -p "${1:-${FLASHMLA_BUILD_DIR:-/tmp/flashmla_build}}" && cd "${1:-${FLASHMLA_BUILD_DIR:-/tmp/flashmla_build}}" && pwd)
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=9.0a
# torch finds CUDA through CUDA_HOME, else `which nvcc`; where nvcc on PATH is a wrapper script
# (/usr/local/bin/nvcc -> exec /usr/local/cuda-13.0/bin/nvcc) that guess lacks the headers.
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda
  else CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
fi
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
echo "[build] CUDA_HOME=$CUDA_HOME"
# ATen/cuda/CUDAContext.h (included by FlashMLA's API header) needs cusparse.h, cublas_v2.h,
# cublasLt.h, cusolverDn.h. A toolkit with only nvcc and cudart lacks them; torch's CUDA wheels
# bring them in site-packages/nvidia/*/include: put those on CPATH (searched after -I paths).
if [ ! -f "$CUDA_HOME/include/cusparse.h" ]; then
  NV_INC=$(python - <<'PY'
import glob, os, site
dirs = []
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for h in ("cusparse.h", "cublas_v2.h", "cublasLt.h", "cusolverDn.h", "cusolver_common.h", "nvml.h"):
        for f in glob.glob(os.path.join(sp, "nvidia", "**", h), recursive=True):
            d = os.path.dirname(f)
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))
PY
)
  export CPATH="${NV_INC}${CPATH:+:$CPATH}"
  echo "[build] $CUDA_HOME/include has no cusparse.h; CPATH from torch's nvidia wheels: ${NV_INC:-none found}"
fi
start=$(date +%s)
echo "[build] kit $KIT -> $OUT_DIR; MAX_JOBS=$MAX_JOBS; nproc $(nproc)"
nvcc --version | tail -2
python -c "import torch; print('[build] torch', torch.__version__, 'cuda', torch.version.cuda)"
cd "$KIT"
python setup_sparse_decode.py build_ext --build-lib "$OUT_DIR/lib" --build-temp "$OUT_DIR/tmp"
cp src/flash_mla/__init__.py src/flash_mla/flash_mla_interface.py "$OUT_DIR/lib/flash_mla/"
ls -la "$OUT_DIR/lib/flash_mla/"
echo "[build] done in $(( $(date +%s) - start )) s: PYTHONPATH=$OUT_DIR/lib"
