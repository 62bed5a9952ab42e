#!/usr/bin/env bash
# Builds the whole project and its test suite with AddressSanitizer + UndefinedBehaviorSanitizer
# (gcc, -O1, any finding fatal) and runs the tests there; .ci/run runs it after the normal suite
# (see docs/reliability.md, "Sanitizers"). The build directory ($SLICETRAIN_ASAN_BUILD, default
# build/sanitize in the checkout) sits two levels below the checkout, where the normal build sits
# one, so that CI also proves the suite does not assume where its build directory is
# (docs/install.md); inside the checkout, ccache (CCACHE_BASEDIR, set by .ci/run) serves a fresh
# clone the objects of the last one.
#   scripts/sanitize.sh [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
src="$(pwd)"
build="${SLICETRAIN_ASAN_BUILD:-$src/build/sanitize}"
echo "sanitize: building in $build"
cmake -S . -B "$build" -G Ninja -DSLICETRAIN_SANITIZE=ON -DSLICETRAIN_BUILD_BENCH=OFF \
  -DSLICETRAIN_NATIVE=OFF >/dev/null
cmake --build "$build"
# Leaks are reported (LeakSanitizer is part of ASan on x86-64); a finding aborts the process, and
# the tests check exit codes and the output for sanitizer text.
# allocator_may_return_null: an allocation too large to serve returns null as glibc's does, so the
# out-of-memory path (st::OutOfMemory, one error line) is what runs, not ASan's own abort.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:check_initialization_order=1:strict_string_checks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Not run here: the Kubernetes, Slurm and container checks (renderings and library lists that do
# not depend on where the build is) and the install test (it takes the build directory as an
# argument, and its three epochs under ASan cost minutes); the normal build runs them. The Ray
# adapter test runs: it starts the binary from elsewhere. Two long tests run in the normal build
# only (under ASan they took 169 s and 142 s of the run's 1075 s): the greedy tokens at E2B's widths
# (the same kernels as the tiny model's test, on larger matrices) and the two-host link cut for
# 2 s and 12 s (waiting on timeouts; the other network-fault tests run the same recovery code).
ctest --test-dir "$build" --output-on-failure \
  -E "^(deploy_(k8s|slurm|docker)_|install_staged_and_deb$|Generate.GreedyEqualsTransformersAtE2bWidths$|NetFault.TwoHostsRideThroughAShortCutAndRestartAfterALongOne$)" \
  "$@"
