#!/usr/bin/env bash
# One-shot GPU run, from the project root, with .flashmla (this kit), .sbs and .tokenspeed carried:
#   bash .flashmla/run_gpu.sh
# Builds FlashMLA's SM90 sparse fp8 decode (at most 480 s, log in $OUT/flashmla_build.log), then
# runs tests/interop/test_flashmla_consumer.py against it (log in $OUT/flashmla_test.log).
set -uo pipefail
T0=$(date +%s)
OUTD=${OUT:-/tmp/flashmla_out}; mkdir -p "$OUTD"
BUILD=${FLASHMLA_BUILD_DIR:-/tmp/flashmla_build}
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
echo "[run] nproc $(nproc); $(nvcc --version | tail -1)"

timeout 480 bash .flashmla/build.sh "$BUILD" > "$OUTD/flashmla_build.log" 2>&1
RC=$?
echo "[run] build rc=$RC after $(( $(date +%s) - T0 )) s (124 = hit the 480 s limit)"
grep -E "^\[build\]|^\[[0-9]+/[0-9]+\]" "$OUTD/flashmla_build.log" | tail -12
grep -iE "spill|local memory" "$OUTD/flashmla_build.log" | sort | uniq -c | head -8
if [ $RC -ne 0 ]; then
  echo "[run] ---- build log, errors ----"; grep -nE "error|Error|FAILED" "$OUTD/flashmla_build.log" | head -40
  echo "[run] ---- build log, tail ----"; tail -60 "$OUTD/flashmla_build.log"
fi

LEFT=$(( 555 - ($(date +%s) - T0) ))
if [ $LEFT -lt 20 ]; then echo "[run] no time left for the test ($LEFT s)"; exit 1; fi
PYTHONPATH="$BUILD/lib:." timeout $LEFT python -m pytest -q -rs -p no:cacheprovider \
  tests/interop/test_flashmla_consumer.py 2>&1 | tee "$OUTD/flashmla_test.log" | tail -40
echo "[run] total $(( $(date +%s) - T0 )) s"
