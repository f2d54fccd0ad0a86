#!/usr/bin/env bash
# Everything the GPU half of the issues needs, in time-boxed parts, for one short device lease.
#
#   tools/gpu_session.sh tests        # every GPU test, compiled (pytest-xdist, 12 workers)
#   tools/gpu_session.sh bench        # codec, deepseek_v4 and custom-op benchmarks
#   tools/gpu_session.sh sanitize     # compute-sanitizer, the four tools in parallel
#   tools/gpu_session.sh fuzz         # tools/fuzz_at_scale.py for FUZZ_SECONDS (default 300)
#   tools/gpu_session.sh all          # all four, in that order
#
# Logs go to $OUT (the device tool's folder) or ./gpu-logs; each part prints a short summary,
# failures first, so a truncated console still shows what matters. Time boxes (seconds) come
# from TESTS_S, BENCH_S, SANITIZE_S, FUZZ_SECONDS.
set -u
case "${1:-all}" in
  tests|bench|sanitize|fuzz|all) ;;
  *) echo "usage: $0 tests|bench|sanitize|fuzz|all" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=${OUT:-gpu-logs}
mkdir -p "$LOG"

tests() {
  timeout "${TESTS_S:-420}" python3 -m pytest -q -p no:cacheprovider -n 12 --timeout 240 -rfE --tb=line \
    tests/kernels tests/reliability tests/interop > "$LOG/tests.log" 2>&1
  echo "== tests (exit $?)"; grep -E "^(FAILED|ERROR)|^/.*Error|passed|failed" "$LOG/tests.log" | tail -40
}

bench() {
  timeout "${BENCH_S:-420}" bash -c "python3 benchmarks/bench_kernels_gpu.py --sizes 64,131072 --no-reference \
    > '$LOG/bench_codecs.log' 2>&1; python3 benchmarks/bench_dsv4_gpu.py > '$LOG/bench_dsv4.log' 2>&1; \
    python3 benchmarks/bench_custom_ops_gpu.py > '$LOG/bench_custom_ops.log' 2>&1"
  echo "== bench (exit $?)"; grep -h -E "131072|prefill|decode 64|largest" "$LOG"/bench_*.log | tail -60
}

sanitize() {
  for t in memcheck initcheck racecheck synccheck; do
    timeout "${SANITIZE_S:-420}" python3 tools/sanitize.py --quick --tools "$t" --cache-dir "/tmp/tc_$t" \
      --logs "/tmp/sanitize_$t" > "$LOG/sanitize_$t.log" 2>&1 &
  done
  wait
  echo "== sanitize"; grep -h -E "^(memcheck|initcheck|racecheck|synccheck) " "$LOG"/sanitize_*.log
}

fuzz() {
  timeout $(( ${FUZZ_SECONDS:-300} + 60 )) python3 tools/fuzz_at_scale.py --examples 100000 \
    --seconds "${FUZZ_SECONDS:-300}" > "$LOG/fuzz.log" 2>&1
  echo "== fuzz (exit $?)"; grep -E "Error|FAIL|stopped|total|outside|launches" "$LOG/fuzz.log" | tail -20
}

case "${1:-all}" in
  tests) tests ;; bench) bench ;; sanitize) sanitize ;; fuzz) fuzz ;;
  all) tests; bench; sanitize; fuzz ;;
esac
