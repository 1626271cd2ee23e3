#!/usr/bin/env bash
# The README's test command: set-up, build, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd "${PHALANX_BUILD_DIR:-build}"
ctest --output-on-failure -j "${PHALANX_TEST_JOBS:-2}" --timeout 600
