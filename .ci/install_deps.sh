#!/usr/bin/env bash
# Installs the versioned target libraries the tests import into .deps/<name>-<version>/,
# one directory each, so a subprocess picks exactly one version through PYTHONPATH.
# NVRx >= 0.5 ships only manylinux_2_39 wheels; its checkpointing code is pure Python,
# so the wheel is unpacked for that platform tag on older glibc too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEPS=${COLO_SHIM_TEST_DEPS:-$PWD/.deps}
mkdir -p "$DEPS"
plat=(--platform manylinux_2_39_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
install_one() {  # dist version dirname
  local dir="$DEPS/$3"
  [ -f "$dir/.complete" ] && return 0
  rm -rf "$dir"
  "$PY" -m pip install -q --no-deps --only-binary=:all: "${plat[@]}" --python-version 3.12 \
        --implementation cp --target "$dir" "$1==$2"
  touch "$dir/.complete"
}
for v in 0.4.1 0.5.0 0.6.0 0.7.0; do install_one nvidia-resiliency-ext "$v" "nvrx-$v"; done
for v in 0.16.1 0.19.2; do install_one megatron-core "$v" "mcore-$v"; done
echo "test deps in $DEPS: $(ls "$DEPS" | tr '\n' ' ')"
