#!/usr/bin/env bash
# Everything the GPU half of the issues needs, in time-boxed parts, for one short device lease.
#
#   tools/gpu_session.sh tests        # the GPU tests, compiled (pytest-xdist)
#   tools/gpu_session.sh bench        # codec, deepseek_v4 and custom-op benchmarks
#   tools/gpu_session.sh sanitize     # compute-sanitizer: one warm-up run, then the four tools in parallel
#   tools/gpu_session.sh fuzz         # tools/fuzz_at_scale.py for FUZZ_SECONDS (default 300)
#   tools/gpu_session.sh checks       # tests, fuzz and sanitize at the same time (none of them times anything)
#   tools/gpu_session.sh all          # checks, then bench (alone on the GPU)
#   tools/gpu_session.sh v41          # the V4.1 and nvfp4_ds_mla kernels: tests compiled, bandwidth, and the
#                                     # released tokenspeed / vLLM writers compiled (carry .engines/released)
#   tools/gpu_session.sh compat       # the tokenspeed drop-ins on CUDA: tests/compat against the seed's files
#                                     # (the released kernels compiled: RELEASED_DEVICE=cuda, the default here)
#                                     # (carry .tokenspeed and .engines: .engines/ts-shims, and the released
#                                     # wheels in .engines/cache/wheels for the tests that read them), the V4.1
#                                     # model ops and the ape-halves save, compiled; tokenspeed's own test file
#                                     # against the drop-in is the `own` part (tools/tokenspeed_own_tests.py)
#   tools/gpu_session.sh own          # tokenspeed's own test/runtime/test_deepseek_v4_attention_ops.py (main at
#                                     # f4d8ec6e, files in .tokenspeed/main: carry .tokenspeed) run against
#                                     # kvformats.compat.tokenspeed by tools/tokenspeed_own_tests.py
#
# Logs go to $OUT (the device tool's folder) or ./gpu-logs; each part prints a short summary,
# failures first, so a truncated console still shows what matters. Knobs (environment):
# time boxes TESTS_S, BENCH_S, SANITIZE_S, FUZZ_SECONDS; TEST_PATHS and TEST_WORKERS (pytest);
# FUZZ_WORKERS and FUZZ_EXAMPLES; SANITIZE_QUICK=1 for the driver's quick set; SANITIZE_TOOLS (default
# all four, e.g. "initcheck"); BENCH_DSV4_PARTS. Compose parts with `checks` (it waits on its own
# jobs): a hand-made `while pgrep -f NAME` loop also matches the shell running it and never ends.
set -u
case "${1:-all}" in
  tests|bench|sanitize|fuzz|checks|all|v41|compat|own) ;;
  *) echo "usage: $0 tests|bench|sanitize|fuzz|checks|all|v41|compat|own" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=${OUT:-gpu-logs}
mkdir -p "$LOG"

tests() {
  # shellcheck disable=SC2086  # TEST_PATHS is a list of paths
  timeout "${TESTS_S:-420}" python3 -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-12}" --timeout 240 -rfE \
    --tb=line ${TEST_PATHS:-tests/kernels tests/reliability tests/interop} > "$LOG/tests.log" 2>&1
  echo "== tests (exit $?)"; grep -E "^(FAILED|ERROR)|^/.*Error|passed|failed" "$LOG/tests.log" | tail -40
}

bench() {
  timeout "${BENCH_S:-420}" bash -c "python3 -m benchmarks kernels_gpu --sizes 64,131072 --no-reference \
    > '$LOG/bench_codecs.log' 2>&1; python3 -m benchmarks dsv4_gpu --parts ${BENCH_DSV4_PARTS:-compress,query,indices} \
    > '$LOG/bench_dsv4.log' 2>&1; python3 -m benchmarks custom_ops_gpu > '$LOG/bench_custom_ops.log' 2>&1"
  echo "== bench (exit $?)"; grep -h -E "131072|prefill|decode 64|largest" "$LOG"/bench_*.log | tail -60
}

sanitize() {
  # one unsanitized run compiles every kernel into a shared cache; the four tools then only load them
  local quick=() cache=/tmp/kvf-sanitize-cache
  [ "${SANITIZE_QUICK:-0}" = 1 ] && quick=(--quick)
  TRITON_CACHE_DIR=$cache timeout "${SANITIZE_S:-420}" python3 tools/sanitize_driver.py "${quick[@]}" \
    > "$LOG/sanitize_warm.log" 2>&1
  for t in ${SANITIZE_TOOLS:-memcheck initcheck racecheck synccheck}; do
    timeout "${SANITIZE_S:-420}" python3 tools/sanitize.py "${quick[@]}" --tools "$t" --cache-dir "$cache" --no-warm \
      --timeout "${SANITIZE_S:-420}" --logs "/tmp/sanitize_$t" > "$LOG/sanitize_$t.log" 2>&1 &
  done
  wait
  echo "== sanitize"; tail -1 "$LOG/sanitize_warm.log"
  grep -h -E "^(memcheck|initcheck|racecheck|synccheck) " "$LOG"/sanitize_*.log
}

fuzz() {
  timeout $(( ${FUZZ_SECONDS:-300} + 150 )) python3 tools/fuzz_at_scale.py --examples "${FUZZ_EXAMPLES:-100000}" \
    --workers "${FUZZ_WORKERS:-1}" --seconds "${FUZZ_SECONDS:-300}" > "$LOG/fuzz.log" 2>&1
  echo "== fuzz (exit $?)"; grep -E "Error|FAIL|stopped|total|outside|launches|workers" "$LOG/fuzz.log" | tail -20
}

v41() {
  timeout "${TESTS_S:-250}" python3 -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-8}" -rfE --tb=line \
    tests/kernels/test_nvfp4_kernels.py tests/kernels/test_state_v41_kernels.py tests/kernels/test_kernels.py \
    tests/kernels/test_profile_kernels.py \
    tests/kernels/test_paged_kernels.py tests/test_nvfp4_ds_mla.py tests/test_v41_formats.py \
    tests/interop/test_v41_writers.py -k "v41 or V41 or nvfp4 or state" > "$LOG/v41_tests.log" 2>&1
  echo "== v41 tests (exit $?)"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOG/v41_tests.log" | tail -20
  timeout "${BENCH_S:-200}" python3 -m benchmarks kernels_gpu --sizes 64,131072 --no-reference --no-paged \
    --cache-gib 2 --formats fp8_ds_mla_v41,fp8_ds_mla_v41_interleaved,fp4_ds_mla_v41,fp4_ds_mla_v41_interleaved,nvfp4_ds_mla,compressor_state_v41 \
    --json "$LOG/v41_bandwidth.json" > "$LOG/v41_bench.log" 2>&1
  echo "== v41 bench (exit $?)"; grep -E "^\||bandwidth" "$LOG/v41_bench.log" | tail -40
  if [ -f .engines/released/gpu_check.py ]; then
    timeout 60 python3 .engines/released/gpu_check.py > "$LOG/v41_released.log" 2>&1
    echo "== released writers compiled (exit $?)"; tail -5 "$LOG/v41_released.log"
  fi
}

compat() {
  KVFORMATS_RELEASED_DEVICE=${RELEASED_DEVICE:-cuda} TOKENSPEED_SRC=.tokenspeed TOKENSPEED_SHIMS=.engines/ts-shims KVFORMATS_TEST_CACHE=.engines/cache \
    timeout "${TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-8}" -rfE --tb=line \
    tests/compat tests/deepseek_v41 tests/kernels/test_dsv4_compress_kernels.py > "$LOG/compat_tests.log" 2>&1
  echo "== compat tests (exit $?)"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOG/compat_tests.log" | tail -30
}

own() {
  # writes $OUT/tokenspeed_own_tests.txt too; exit 0 only when every failure is a declared difference
  timeout "${TESTS_S:-300}" python3 tools/tokenspeed_own_tests.py --src "${OWN_SRC:-.tokenspeed/main}" \
    > "$LOG/own_tests.log" 2>&1
  echo "== tokenspeed's own tests vs the drop-in (exit $?)"
  grep -E "^[A-Za-z_.]+ +(failed|error|difference) |^counts|^RESULT|^Traceback|^[A-Za-z]+Error" "$LOG/own_tests.log" \
    | cut -c1-240 | tail -40
}

checks() {
  local sums
  sums=$(mktemp -d)
  tests > "$sums/tests" 2>&1 &
  fuzz > "$sums/fuzz" 2>&1 &
  sanitize > "$sums/sanitize" 2>&1 &
  wait
  cat "$sums/tests" "$sums/fuzz" "$sums/sanitize"
}

case "${1:-all}" in
  tests) tests ;; bench) bench ;; sanitize) sanitize ;; fuzz) fuzz ;; checks) checks ;;
  all) checks; bench ;;
  v41) v41 ;;
  compat) compat ;;
  own) own ;;
esac
