#!/usr/bin/env bash
# The README's test command: set-up, build, then every test, then a bounded fuzzing run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd "${PHALANX_BUILD_DIR:-build}" && ctest --output-on-failure -j "${PHALANX_TEST_JOBS:-2}" --timeout 600)
# The GPU bundle's rehearsal (docs/gpu.md): made from this build, run from a copy with the
# repository out of reach; the GPU steps report skipped here.
scripts/gpu-rehearsal.sh "${PHALANX_BUILD_DIR:-build}"
# Then bounded fuzzing (docs/reliability.md, "Fuzzing"): the clang ASan/UBSan build in
# build-fuzz/ and 60 s over all harnesses. PHALANX_SKIP_FUZZ=1 leaves it out.
if [ -z "${PHALANX_SKIP_FUZZ:-}" ]; then
  scripts/fuzz.sh ci
fi
