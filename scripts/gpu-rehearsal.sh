#!/usr/bin/env bash
# CI's rehearsal of the GPU check (docs/gpu.md), on a machine without a GPU: the bundle is made
# from a build (scripts/gpu-bundle.sh), copied to another folder, and its gpu-check.sh run from
# the copy under `env -i` with this repository out of reach (a private mount namespace lays an
# empty tmpfs over it; where that is not allowed, the build folder is moved away meanwhile).
# The bundle's test binary, phalanx-run, phalanx-train and lr_scaling_study run on the CPU, the
# ldd audit proves nothing resolves into the build, and the GPU steps report skipped. Then two
# broken copies (a library taken out, the data truncated) must make the check fail.
#
#   scripts/gpu-rehearsal.sh [BUILD_DIR]     (default: $PHALANX_BUILD_DIR, else build)
# PHALANX_REHEARSAL_HIDE=move moves the build folder away even where a namespace would do.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${1:-${PHALANX_BUILD_DIR:-build}}
BUILD=$(cd "$BUILD" && pwd)
T=$(mktemp -d /tmp/phalanx-rehearsal.XXXXXX)
moved=""
cleanup() {
  [ -z "$moved" ] || mv "$moved" "$BUILD"
  rm -rf "$T"
}
trap cleanup EXIT
t0=$(date +%s.%N)
say() { echo "gpu-rehearsal: $*"; }

scripts/gpu-bundle.sh "$BUILD" --out "$T/made/gpu-bundle"
mkdir "$T/probe"
if [ "${PHALANX_REHEARSAL_HIDE:-}" != move ] && unshare -m mount -t tmpfs none "$T/probe" 2>/dev/null; then how=namespace; else how=move; fi
cp -a "$T/made/gpu-bundle" "$T/copy"
rm -rf "$T/made"

# check_copy NAME: runs the copy's gpu-check.sh with the repository out of reach; its exit
# status goes to rc, its output to $T/NAME.log, its log and JSON to $T/out-NAME.
check_copy() {
  local out=$T/out-$1
  rc=0
  local cmd="exec env -i PATH=/usr/bin:/bin HOME=$T PHALANX_CHECK_OUT=$out $T/copy/gpu-check.sh"
  if [ "$how" = namespace ]; then
    unshare -m bash -c "mount -t tmpfs none '$BUILD' && mount -t tmpfs none '$ROOT' && $cmd" >"$T/$1.log" 2>&1 || rc=$?
  else
    moved="$BUILD.away.$$"
    mv "$BUILD" "$moved"
    bash -c "$cmd" >"$T/$1.log" 2>&1 || rc=$?
    mv "$moved" "$BUILD"
    moved=""
  fi
}

check_copy whole
grep -E '^(-- |gpu-check:)' "$T/whole.log" | sed 's/^/  /'
if [ "$rc" != 0 ] || ! grep -q '"verdict": "passed"' "$T/out-whole/gpu-check.json"; then
  cat "$T/whole.log"
  say "FAILED: the relocated bundle's check exited $rc"; exit 1
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  # Every GPU step is listed, skipped (no GPU); the suite skipped itself.
  for name in "conv and pool kernels" "nccl reducer at W=1" "memcheck (kernel cases)" "racecheck (kernel cases)" \
              "initcheck (kernel cases)" "gpu ddp:" "gpu example:" "gpu exact:" "gpu bench:" "nccl hang (last"; do
    grep -F "\"name\": \"$name" "$T/out-whole/gpu-check.json" | grep -q '"status": "skipped (no GPU)"' ||
      { say "FAILED: without a GPU the step \"$name...\" must be listed as skipped (no GPU)"; exit 1; }
  done
  grep -F '"name": "gpu suite' "$T/out-whole/gpu-check.json" | grep -q '"status": "skipped (no GPU)"' ||
    { say "FAILED: without a GPU the suite must skip itself"; exit 1; }
fi
# A step reruns alone (--only KEY), and the keys are listed.
keys=$("$T/copy/gpu-check.sh" --list)
for k in environment gpu-suite conv nccl-reducer memcheck racecheck initcheck gpu-exact nccl-hang; do
  case " $keys " in *" $k "*) ;; *) say "FAILED: gpu-check.sh --list lacks $k"; exit 1 ;; esac
done
mkdir "$T/only"
PHALANX_CHECK_OUT=$T/only "$T/copy/gpu-check.sh" --only environment >"$T/only.log" 2>&1 ||
  { cat "$T/only.log"; say "FAILED: gpu-check.sh --only environment"; exit 1; }
[ "$(grep -c '"status"' "$T/only/gpu-check.json")" = 1 ] ||
  { cat "$T/only.log"; say "FAILED: --only environment ran other steps too"; exit 1; }

# Every check must be able to fail: a library missing from the bundle, then damaged data.
mv "$T/copy/lib/libzip.so.4" "$T/libzip.so.4"
check_copy no-libzip
mv "$T/libzip.so.4" "$T/copy/lib/libzip.so.4"
if [ "$rc" = 0 ]; then cat "$T/no-libzip.log"; say "FAILED: the check passed with lib/libzip.so.4 taken out of the bundle"; exit 1; fi
truncate -s 100 "$T/copy/data/seed_case_study.npz"
check_copy bad-data
if [ "$rc" = 0 ]; then cat "$T/bad-data.log"; say "FAILED: the check passed with the data truncated"; exit 1; fi

out_of_reach=$([ "$how" = namespace ] && echo "$ROOT under an empty tmpfs" || echo "$BUILD moved away")
say "passed in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s: bundle $(du -sm "$T/copy" | cut -f1) MiB, run from a copy" \
    "with $out_of_reach; the broken copies failed as they must"
