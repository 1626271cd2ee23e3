#!/usr/bin/env bash
# The README's demo command: set-up, build, then the textbook's learning-rate case study.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${PHALANX_BUILD_DIR:-build}"/examples/lr_scaling_study "$@"
