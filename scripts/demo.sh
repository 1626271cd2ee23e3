#!/usr/bin/env bash
# The README's demo command: set-up and build, then the textbook's learning-rate case study
# on 4 CPU workers through Gloo (phalanx-run), printing the table and writing the plot.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD="${PHALANX_BUILD_DIR:-build}"
exec "$BUILD"/bin/phalanx-run --nproc-per-node 4 --backend gloo \
  "$BUILD"/examples/lr_scaling_study --plot "$BUILD"/lr_scaling_study.svg "$@"
