#!/usr/bin/env bash
# Builds the torchtitan environment: a Python 3.11 virtualenv with torch 2.13.0 (CPU), torchtitan 0.3.0 and its
# dependencies, and taskdata (editable), in .venv-torchtitan at the repository root (or $TASKDATA_TORCHTITAN_VENV).
#
#   bash deploy/torchtitan_env.sh          # build, or reuse when nothing it is built from changed
#
# Why a second environment: torchtitan 0.3.0 needs datasets < 4.8, and every such datasets release needs
# fsspec <= 2026.2.0, while the project's environment holds fsspec 2026.9.0 (with gcsfs 2026.10.1). taskdata is
# its light core here (no Beam, TensorFlow or server), with torch and torchdata: 'taskdata[torch]'. Every version
# is pinned (deploy/torchtitan-requirements.txt) and installed without resolving, then checked with 'pip check'.
# tests/test_torchtitan_loader.py and tests/test_readme_torch.py run torchtitan from here as a subprocess.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${TASKDATA_TORCHTITAN_VENV:-.venv-torchtitan}
REQUIREMENTS=deploy/torchtitan-requirements.txt
PYTHON=${TASKDATA_PYTHON311:-python3.11}

stamp=$(cat "$REQUIREMENTS" deploy/torchtitan_env.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.taskdata-env" ] && [ "$(cat "$VENV/.taskdata-env")" = "$stamp" ]; then
  echo "torchtitan_env.sh: $VENV is up to date"
  exit 0
fi

echo "torchtitan_env.sh: building $VENV with $("$PYTHON" --version)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# Exact versions, no resolving: what was tested together.
"$VENV/bin/python" -m pip install --quiet --no-deps -r "$REQUIREMENTS"
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
"$VENV/bin/python" -m pip check
"$VENV/bin/python" -c "import torch, torchtitan.components.dataloader, trainer_client.pytorch.torchtitan; print('torchtitan_env.sh: torch', torch.__version__, 'torchtitan 0.3.0')"
echo "$stamp" > "$VENV/.taskdata-env"
