#!/usr/bin/env bash
# The libFuzzer harnesses (tests/fuzz; docs/reliability.md, "Fuzzing").
#   scripts/fuzz.sh build             install clang's libFuzzer if missing, configure and build
#                                     build-fuzz/ (clang, -DPHALANX_FUZZ=ON: ASan + UBSan)
#   scripts/fuzz.sh run [SECONDS]     fuzz every harness for an equal share of SECONDS (default 60),
#                                     each on a copy of its seed corpus; exits 1 on a finding
#   scripts/fuzz.sh ci                build, then run 60 (what scripts/test.sh runs after ctest)
# Environment: PHALANX_FUZZ_BUILD_DIR (build-fuzz), PHALANX_JOBS (nproc),
#   PHALANX_FUZZ_RSS_MB (2048: memory limit, and the largest single allocation),
#   PHALANX_FUZZ_ONLY ("npy idx": only these harnesses),
#   PHALANX_FUZZ_KEEP (a folder: keep each harness's grown corpus and log there),
#   PHALANX_FUZZ_KEEP_GOING (1: do not stop at the first finding; for long campaigns).
# A finding's input is copied to build-fuzz/findings/<name>/; replay it with
#   build-fuzz/fuzz/fuzz_<name> build-fuzz/findings/<name>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${PHALANX_FUZZ_BUILD_DIR:-build-fuzz}
# Only the fuzz step needs these (the main build uses g++): clang and its runtime libraries
# (libFuzzer, ASan, UBSan).
FUZZ_PACKAGES=(clang libclang-rt-dev)

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
}

install_packages() {
  local missing=() p
  for p in "${FUZZ_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "fuzz: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

build() {
  install_packages
  local start=$SECONDS
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD_DIR" -DCMAKE_CXX_COMPILER=clang++ -DPHALANX_FUZZ=ON \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j "${PHALANX_JOBS:-$(nproc)}" -- --no-print-directory
  echo "fuzz: build-fuzz ready in $((SECONDS - start)) s"
}

harness_names() {
  local f name
  for f in tests/fuzz/fuzz_*.cpp; do
    name=$(basename "$f" .cpp)
    name=${name#fuzz_}
    if [ -n "${PHALANX_FUZZ_ONLY:-}" ] && [[ " $PHALANX_FUZZ_ONLY " != *" $name "* ]]; then continue; fi
    echo "$name"
  done
}

# The last libFuzzer status line's value of a field ("cov:", "ft:"), or "?".
status_field() {
  grep -E '^#[0-9]+' "$1" | tail -n 1 | grep -oE "$2 [0-9]+" | awk '{print $2}' || true
}

run() {
  local total=${1:-60}
  if ! [[ "$total" =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz: run takes a number of seconds, got '$total'" >&2
    exit 2
  fi
  local names
  mapfile -t names < <(harness_names)
  [ ${#names[@]} -gt 0 ] || { echo "fuzz: no harness to run (PHALANX_FUZZ_ONLY='${PHALANX_FUZZ_ONLY:-}')" >&2; exit 2; }
  local share=$((total / ${#names[@]}))
  [ "$share" -ge 1 ] || share=1
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/phalanx-fuzz.XXXXXX")
  # shellcheck disable=SC2064  # expand now: $work is local
  trap "rm -rf '$work'" EXIT
  local findings=0 name
  echo "fuzz: ${#names[@]} harness(es), ${share} s each"
  for name in "${names[@]}"; do
    local bin="$BUILD_DIR/fuzz/fuzz_$name"
    if [ ! -x "$bin" ]; then
      echo "fuzz: $bin is missing; run scripts/fuzz.sh build first" >&2
      exit 2
    fi
    local dir="$work/$name"
    mkdir -p "$dir/corpus" "$dir/tmp" "$dir/artifacts"
    [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$dir/corpus/"
    local seeds
    seeds=$(find "$dir/corpus" -type f | wc -l)
    local args=(-max_total_time="$share" -rss_limit_mb="${PHALANX_FUZZ_RSS_MB:-2048}" -timeout=10
                -print_final_stats=1 -artifact_prefix="$dir/artifacts/")
    [ -f "tests/fuzz/fuzz_$name.dict" ] && args+=(-dict="tests/fuzz/fuzz_$name.dict")
    # Long campaigns: go on after a finding (in forked jobs), collecting every one.
    [ -n "${PHALANX_FUZZ_KEEP_GOING:-}" ] && args+=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
    local rc=0
    TMPDIR="$dir/tmp" ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}" \
      UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
      "$bin" "${args[@]}" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
    local runs cov ft corpus
    runs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$dir/log" | awk '{print $2}' || true)
    [ -n "$runs" ] || runs=$(grep -oE '^#[0-9]+' "$dir/log" | tail -n 1 | tr -d '#' || true)
    cov=$(status_field "$dir/log" "cov:")
    ft=$(status_field "$dir/log" "ft:")
    corpus=$(find "$dir/corpus" -type f | wc -l)
    local crashes
    crashes=$(find "$dir/artifacts" -type f | wc -l)
    printf 'fuzz_%-16s %10s runs  cov %-6s ft %-7s corpus %3s -> %-5s' \
      "$name" "${runs:-?}" "${cov:-?}" "${ft:-?}" "$seeds" "$corpus"
    if [ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ]; then
      echo " no finding"
    else
      findings=$((findings + 1))
      echo " FINDING (exit $rc, $crashes input(s))"
      local keep="$BUILD_DIR/findings/$name"
      mkdir -p "$keep"
      cp "$dir"/artifacts/* "$keep/" 2>/dev/null || true
      cp "$dir/log" "$keep/log"
      # What happened (each kind once, with its count), then the first frame in Phalanx.
      { grep -hE 'fuzz finding|runtime error|ERROR: ' "$dir/log" || true; } \
        | sed -E 's/==[0-9]+==//; s/0x[0-9a-f]+//g; s/\(BuildId: [0-9a-f]+\)//; s/[0-9]{5,}/N/g; s/: [0-9N]+ ([-+*]) [0-9N]+ /: a \1 b /; s/^ +//' \
        | sort | uniq -c | sort -rn | sed -n '1,6s/^ */    /p'
      { grep -m 1 -hE '^ +#[0-9]+ .* in phalanx::' "$dir/log" || true; } | sed 's/^ */    first Phalanx frame: /'
      echo "    inputs and log kept in $keep/ (replay one: $bin $keep/<file>)"
    fi
    if [ -n "${PHALANX_FUZZ_KEEP:-}" ]; then
      mkdir -p "$PHALANX_FUZZ_KEEP/$name"
      cp -r "$dir/corpus" "$PHALANX_FUZZ_KEEP/$name/"
      cp "$dir/log" "$PHALANX_FUZZ_KEEP/$name/log"
    fi
  done
  if [ "$findings" -gt 0 ]; then
    echo "fuzz: $findings harness(es) found a problem"
    return 1
  fi
  echo "fuzz: no finding"
}

case "${1:-}" in
  build) build ;;
  run) run "${2:-60}" ;;
  ci) build && run 60 ;;
  *) usage ;;
esac
