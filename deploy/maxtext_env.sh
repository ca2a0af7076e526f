#!/usr/bin/env bash
# Builds the MaxText environment: a Python 3.12 virtualenv with maxtext 0.2.5, its CPU dependencies and taskdata
# (editable), in .venv-maxtext at the repository root (or $TASKDATA_MAXTEXT_VENV).
#
#   bash deploy/maxtext_env.sh          # build, or reuse when deploy/maxtext-requirements.txt is unchanged
#
# Why a second environment: maxtext 0.2.5 needs Python >= 3.12 and jax >= 0.11.1, while the project's reference
# environment stays Python 3.11 (torch's CPU wheel here is for 3.11; on 3.12 torch would pull a multi-GB CUDA
# build; t5x is proven on 3.11). Every version is pinned (deploy/maxtext-requirements.txt) and installed without
# resolving, then checked with 'pip check'. tests/test_maxtext_train.py runs MaxText from here as a subprocess.
#
# Python 3.12 is $TASKDATA_PYTHON312, else python3.12 on PATH, else pyenv's ~/.pyenv/versions/3.12.*.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${TASKDATA_MAXTEXT_VENV:-.venv-maxtext}
REQUIREMENTS=deploy/maxtext-requirements.txt
MAXTEXT=maxtext==0.2.5

is_312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }

find_python() {
  if [ -n "${TASKDATA_PYTHON312:-}" ]; then
    if is_312 "$TASKDATA_PYTHON312"; then echo "$TASKDATA_PYTHON312"; return; fi
    echo "maxtext_env.sh: error: TASKDATA_PYTHON312=$TASKDATA_PYTHON312 is not a working Python 3.12" >&2
    exit 2
  fi
  local candidate
  # python3.12 on PATH may be a pyenv shim of a version that is not active: only one that runs counts.
  for candidate in "$(command -v python3.12 || true)" $(ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python3.12 2>/dev/null | sort -V -r); do
    if [ -n "$candidate" ] && is_312 "$candidate"; then echo "$candidate"; return; fi
  done
  echo "maxtext_env.sh: error: no Python 3.12 found (set TASKDATA_PYTHON312=/path/to/python3.12)" >&2
  exit 2
}

# What the environment is built from: reuse it while none of it changes.
stamp=$(cat "$REQUIREMENTS" deploy/maxtext_env.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.taskdata-env" ] && [ "$(cat "$VENV/.taskdata-env")" = "$stamp" ]; then
  echo "maxtext_env.sh: $VENV is up to date"
  exit 0
fi

PYTHON=$(find_python)
echo "maxtext_env.sh: building $VENV with $("$PYTHON" --version) ($PYTHON)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# Exact versions, no resolving: what was tested together.
"$VENV/bin/python" -m pip install --quiet --no-deps -r "$REQUIREMENTS"
"$VENV/bin/python" -m pip install --quiet --no-deps "$MAXTEXT"
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
"$VENV/bin/python" -m pip check
"$VENV/bin/python" -c "import maxtext, jax, taskdata, trainer_client.maxtext.pipeline; print('maxtext_env.sh: maxtext', maxtext.__version__ if hasattr(maxtext, '__version__') else '0.2.5', 'jax', jax.__version__)"
echo "$stamp" > "$VENV/.taskdata-env"
