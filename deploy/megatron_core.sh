#!/usr/bin/env bash
# Installs megatron-core 0.17.0 (the package that ships Megatron-LM's `megatron.training`, whose
# MegatronPretrainingSampler walks the global sample index from consumed_samples) into .megatron-core at the
# repository root (or $TASKDATA_MEGATRON_CORE), for tests/test_torch_datasets.py to put on sys.path.
#
#   bash deploy/megatron_core.sh          # install, or reuse when already there
#
# Why not an extra: megatron-core 0.17.0's wheel is tagged cp311 but its metadata says Requires-Python >= 3.12,
# and on Python 3.12 the registry's only torch is the CUDA build (several GB). Its core needs are torch >= 2.6,
# numpy and packaging, which the project's environment holds (torch 2.13.0 CPU), so it is installed without
# resolving (--no-deps) and without the Python check; the sampler runs on Python 3.11 as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${TASKDATA_MEGATRON_CORE:-.megatron-core}
VERSION=0.17.0
PIP=${TASKDATA_PIP:-.venv/bin/pip}

if [ -f "$TARGET/megatron_core-$VERSION.dist-info/METADATA" ]; then
  echo "megatron_core.sh: $TARGET holds megatron-core $VERSION"
  exit 0
fi
rm -rf "$TARGET"
"$PIP" install --quiet --no-deps --ignore-requires-python --target "$TARGET" "megatron-core==$VERSION"
echo "megatron_core.sh: megatron-core $VERSION in $TARGET"
