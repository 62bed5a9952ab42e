#!/usr/bin/env bash
# Installs every Debian package the slicetrain build and its tests need. Idempotent: packages that
# are already present are left alone, and apt is only asked when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  libopenblas-openmp-dev libdnnl-dev
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libsentencepiece-dev sentencepiece libcurl4-openssl-dev libssl-dev libcpp-httplib-dev
  libgloo-dev iproute2
  libthrift-dev libboost-dev libsnappy-dev libzstd-dev zlib1g-dev libyaml-cpp-dev  # data formats
  libjpeg-dev libpng-dev libwebp-dev  # images
  clang libclang-rt-14-dev  # libFuzzer targets of fuzz/ (scripts/fuzz.sh)
  chromium fonts-dejavu-core librsvg2-bin
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} Debian packages already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# deploy/.venv: Ray, the kubernetes client and pytest for the deploy/ adapters and their tests
# (never needed to build slicetrain or for its C++ tests; quick when already there). Without it the
# deploy tests are skipped, except under CI=true. SLICETRAIN_SKIP_DEPLOY_VENV=1 skips it (images).
if [ "${SLICETRAIN_SKIP_DEPLOY_VENV:-}" != "1" ]; then
  if ! "$(dirname "${BASH_SOURCE[0]}")/../deploy/setup_venv.sh"; then
    echo "setup: deploy/.venv could not be made; the deploy tests will be skipped"
    if [ "${CI:-}" = "true" ]; then exit 1; fi
  fi
fi
