#!/usr/bin/env bash
# Builds the whole project and its test suite with AddressSanitizer + UndefinedBehaviorSanitizer
# (gcc, -O1, any finding fatal) in build-asan/ and runs the tests there; .ci/run runs it after the
# normal suite (see docs/reliability.md, "Sanitizers").
#   scripts/sanitize.sh [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DSLICETRAIN_SANITIZE=ON -DSLICETRAIN_BUILD_BENCH=OFF \
  -DSLICETRAIN_NATIVE=OFF >/dev/null
cmake --build build-asan
# Leaks are reported (LeakSanitizer is part of ASan on x86-64); a finding aborts the process, and
# the tests check exit codes and the output for sanitizer text.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:check_initialization_order=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Not run here: the Python deployment tests (they drive the same binary through Ray and
# Kubernetes renderings; the normal build runs them).
ctest --test-dir build-asan --output-on-failure -E "^deploy_" "$@"
