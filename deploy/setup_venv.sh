#!/usr/bin/env bash
# Creates deploy/.venv with the pinned packages of deploy/requirements.txt (Ray for the Ray adapter,
# the kubernetes client, PyYAML and jsonschema for the manifest tests, pytest). Idempotent: when the
# venv already holds exactly these pins it returns at once. Called at the end of scripts/setup.sh.
#   deploy/setup_venv.sh               # python3 from PATH (3.10+; 3.11 was used)
#   PYTHON=python3.12 deploy/setup_venv.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
req="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "deploy/setup_venv: deploy/.venv is up to date"
  exit 0
fi
py="${PYTHON:-python3}"
if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
  # Debian splits venv/ensurepip into python3-venv.
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "deploy/setup_venv: installing python3-venv"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi
rm -f "$stamp"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
"$venv/bin/python" -c "import ray, kubernetes, yaml, jsonschema; print('deploy/setup_venv: ray', ray.__version__, 'kubernetes', kubernetes.__version__)"
echo "$want" > "$stamp"
