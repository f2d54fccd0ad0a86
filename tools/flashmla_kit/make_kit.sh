#!/usr/bin/env bash
# Assemble the FlashMLA SM90 sparse fp8 decode build kit (git-ignored; FlashMLA and CUTLASS code
# never enter the repository). Usage, from the project root:
#   tools/flashmla_kit/make_kit.sh <FlashMLA git dir> <CUTLASS git dir> [dest, default .flashmla]
# The git dirs are bare mirrors or clones of github.com/deepseek-ai/FlashMLA and
# github.com/NVIDIA/cutlass; the files are taken at the pinned commits below.
set -euo pipefail
FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0   # 2026-04-29, "Swap FlashMLA combine grid dimensions (#182)"
CUTLASS_COMMIT=147f5673d0c1c3dcf66f78d677fd647e4a020219    # FlashMLA's csrc/cutlass submodule pin at that commit
FM=${1:?FlashMLA git dir}; CT=${2:?CUTLASS git dir}; DEST=${3:-.flashmla}
HERE=$(cd "$(dirname "$0")" && pwd)

pin=$(git --git-dir="$FM" ls-tree "$FLASHMLA_COMMIT" csrc/cutlass | awk '{print $3}')
[ "$pin" = "$CUTLASS_COMMIT" ] || { echo "submodule pin is $pin, expected $CUTLASS_COMMIT" >&2; exit 1; }

rm -rf "$DEST"; mkdir -p "$DEST/src" "$DEST/cutlass"
# FlashMLA: only what the SM90 sparse fp8 decode, the scheduler-metadata and combine kernels and
# the sparse-decode API need (sparse_decode.h also declares, but does not define, the SM100
# decode entry points: sm100_stubs.cpp defines them to raise).
FM_PATHS=(
  LICENSE
  flash_mla/__init__.py flash_mla/flash_mla_interface.py
  csrc/api/common.h csrc/api/sparse_decode.h
  csrc/params.h csrc/defines.h csrc/utils.h
  csrc/kerutils
  csrc/sm90/decode/sparse_fp8
  csrc/smxx/decode
  csrc/sm100/decode/head64/kernel.h
  csrc/sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h
)
git --git-dir="$FM" archive --format=tar "$FLASHMLA_COMMIT" "${FM_PATHS[@]}" | tar -x -C "$DEST/src"
# CUTLASS: headers only (include/; tools/util/include is not used by these sources).
git --git-dir="$CT" archive --format=tar "$CUTLASS_COMMIT" include LICENSE.txt | tar -x -C "$DEST/cutlass"

cp "$HERE"/setup_sparse_decode.py "$HERE"/api_sparse_decode.cpp "$HERE"/sm100_stubs.cpp \
   "$HERE"/build.sh "$HERE"/run_gpu.sh "$DEST/"
chmod +x "$DEST/build.sh" "$DEST/run_gpu.sh"
cat > "$DEST/KIT.txt" <<TXT
FlashMLA SM90 sparse fp8 decode build kit, assembled by tools/flashmla_kit/make_kit.sh
FlashMLA  github.com/deepseek-ai/FlashMLA  $FLASHMLA_COMMIT  (src/, MIT, see src/LICENSE)
CUTLASS   github.com/NVIDIA/cutlass        $CUTLASS_COMMIT  (cutlass/include, BSD-3, see cutlass/LICENSE.txt)
Ours: setup_sparse_decode.py api_sparse_decode.cpp sm100_stubs.cpp build.sh run_gpu.sh
TXT
du -sh "$DEST"
