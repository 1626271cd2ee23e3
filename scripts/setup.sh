#!/usr/bin/env bash
# Installs the Debian packages Phalanx needs (only those missing; quiet when all are there),
# then configures and builds in Release under build/. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  cmake g++ make pkg-config
  libopenblas-dev libxtensor-dev xtl-dev libxtensor-blas-dev
  libgloo-dev libopenmpi-dev openmpi-bin
  doctest-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libzip-dev zlib1g-dev
  patchelf
  slurmd slurmctld slurm-client munge
  python3 python3-venv
  dataset-fashion-mnist
  fortunes
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${PHALANX_BUILD_DIR:-build}
JOBS=${PHALANX_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS" -- --no-print-directory

# TensorBoard's own reader, for the test that reads phalanx-train's event files with it
# (tests/tools/check_tensorboard.py); in a venv of the build folder, never used by the
# library. From PyPI: where it cannot be reached the test says SKIPPED. PHALANX_SKIP_PYTHON=1
# leaves it out.
PYENV="$BUILD_DIR/pyenv"
if [ -z "${PHALANX_SKIP_PYTHON:-}" ] && ! "$PYENV/bin/python" -c "import tensorboard" 2>/dev/null; then
  echo "setup: installing tensorboard (PyPI) into $PYENV for the tests"
  if ! { python3 -m venv "$PYENV" && "$PYENV/bin/pip" install -q --disable-pip-version-check --timeout 20 --retries 1 tensorboard; } >"$BUILD_DIR/pyenv.log" 2>&1; then
    echo "setup: could not install tensorboard ($(tail -1 "$BUILD_DIR/pyenv.log")); its test will be skipped"
    rm -rf "$PYENV"
  fi
fi
