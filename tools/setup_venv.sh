#!/usr/bin/env bash
# Create tools/.venv with the pinned Python packages used by tools/make_fixtures.py.
# Usage (from anywhere):  tools/setup_venv.sh            # uses python3 from PATH (3.10+; 3.11 was used)
#                         PYTHON=python3.11 tools/setup_venv.sh
# The pins in tools/requirements.txt come from `pip freeze` of the venv that generated tests/fixtures.
# torch is the default PyPI wheel (CPU is all the fixtures need).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade pip
"$venv/bin/python" -m pip install -r "$here/requirements.txt"
"$venv/bin/python" -c "import torch, transformers, safetensors; print('torch', torch.__version__, 'transformers', transformers.__version__)"
