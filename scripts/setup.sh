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
  dataset-fashion-mnist
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
