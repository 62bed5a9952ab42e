#!/usr/bin/env bash
# Runs one deploy/tests pytest file in deploy/.venv (made by deploy/setup_venv.sh, which
# scripts/setup.sh calls). ctest runs it with SLICETRAIN_BIN set to the built binary.
# Without the venv it exits 77 (ctest: skipped) with a message, except when CI=true: then it fails.
#   deploy/tests/run_pytest.sh test_ray_adapter.py [pytest args]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="$here/../.venv/bin/python"
if ! [ -x "$py" ] || ! "$py" -c "import ray, kubernetes, yaml, jsonschema, pytest" 2>/dev/null; then
  msg="deploy/.venv is missing or incomplete: run deploy/setup_venv.sh (scripts/setup.sh does)"
  if [ "${CI:-}" = "true" ]; then echo "FAIL: $msg"; exit 1; fi
  echo "SKIP: $msg"; exit 77
fi
file="$1"
shift
cd "$here"
export PYTHONDONTWRITEBYTECODE=1
exec "$py" -m pytest -q -p no:cacheprovider -rs "$here/$file" "$@"
