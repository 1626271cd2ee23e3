#!/usr/bin/env bash
# Builds every benchmark, runs each with its peer in the same run, and writes ONE Markdown
# table of ratios into docs/benchmarks.md, between the "bench.sh: begin/end" markers (the
# prose outside them is hand-written). About 2 minutes on an idle 2-core machine with a warm build, 6 under heavy load (<= 10).
#
#   scripts/bench.sh [--no-build] [BUILD_DIR]   (default: $PHALANX_BUILD_DIR, else build)
#
# --no-build runs the benchmarks already built in BUILD_DIR (e.g. while a tree does not build).
# Every benchmark prints its environment (bench_support.hpp: CPU, BLAS and its core, thread
# counts, load average) and result rows "ROW|bench|case|Phalanx|peer|ratio|bar": medians of
# at least 5 runs with the fastest and slowest, the ratio of the medians. bench_exact_step and
# bench_mpi_allreduce print tables of their own, turned into rows here. bench_mpi_allreduce
# and the sweep's MPI columns run only where mpirun exists. One thread per process on both
# sides (OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1, torch.set_num_threads(1)).
# PHALANX_BENCH_DOC=FILE writes another file than docs/benchmarks.md (it must hold the
# markers); the logs stay in $PHALANX_BENCH_LOGS (default: a fresh /tmp folder).
# Exits non-zero, with one line saying which, when the build or a benchmark fails.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
no_build=0
[ "${1:-}" = --no-build ] && { no_build=1; shift; }
BUILD=${1:-${PHALANX_BUILD_DIR:-build}}
DOC=${PHALANX_BENCH_DOC:-docs/benchmarks.md}
LOGS=${PHALANX_BENCH_LOGS:-$(mktemp -d /tmp/phalanx-bench.XXXXXX)}
mkdir -p "$LOGS"
die() { echo "bench.sh: $*" >&2; exit 1; }
grep -q '<!-- bench.sh: begin' "$DOC" 2>/dev/null && grep -q '<!-- bench.sh: end' "$DOC" ||
  die "$DOC has no '<!-- bench.sh: begin -->' / '<!-- bench.sh: end -->' markers: add them where the table goes"
t_start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- build ----
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >"$LOGS/configure.log" 2>&1 ||
    die "configuring $BUILD failed (see $LOGS/configure.log)"
fi
known=$(cmake --build "$BUILD" --target help 2>/dev/null | sed -n 's/^\.\.\. \([a-z_-]*\).*/\1/p')
has() { grep -qx "$1" <<<"$known"; }
targets=(bench_mlp_step bench_optim_step bench_conv_step bench_gpt_step bench_loader_throughput bench_data_memory bench_ddp_step bench_trainer_step
         bench_exact_step)
targets+=(bench_attention bench_bf16_gemm)
for t in bench_allreduce_sweep bench_mpi_allreduce phalanx_shm phalanx_gloo phalanx_mpi phalanx-run phalanx-train; do
  has "$t" && targets+=("$t")
done
if [ $no_build = 0 ]; then
  echo "bench.sh: building ${targets[*]} in $BUILD"
  nice -n 5 cmake --build "$BUILD" --target "${targets[@]}" -j"$(nproc)" >"$LOGS/build.log" 2>&1 ||
    die "the build failed: $(grep -m1 -E 'error|Error' "$LOGS/build.log" | cut -c1-200) (see $LOGS/build.log)"
fi
for t in "${targets[@]}"; do
  case $t in bench_*) [ -x "$BUILD/bench/$t" ] || die "$BUILD/bench/$t is not built (run without --no-build)" ;; esac
done
B=$BUILD/bench
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PHALANX_PROGRESS=0

# ---- run ----
rows=()
# run NAME TIMEOUT CMD...: runs a benchmark (its output in $LOGS/NAME.log); any failure ends the script.
run() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  printf 'bench.sh: %-28s' "$name"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo " $((SECONDS - t0)) s (exit $rc)"
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] && die "$name timed out after ${limit}s (log: $LOGS/$name.log)"
    die "$name failed (exit $rc): $(grep -v '^\s*$' "$LOGS/$name.log" | tail -1 | cut -c1-200) (log: $LOGS/$name.log)"
  fi
  if grep -q '^peer failed\|did not run\|not run (plugin or peer missing)' "$LOGS/$name.log"; then
    die "$name: a peer or a plugin did not run: $(grep -m1 '^peer failed\|did not run\|not run (plugin' "$LOGS/$name.log" | cut -c1-200) (log: $LOGS/$name.log)"
  fi
  while IFS= read -r line; do rows+=("$line"); done < <(grep '^ROW|' "$LOGS/$name.log")
}

run bench_mlp_step 240 "$B/bench_mlp_step"
run bench_optim_step 180 "$B/bench_optim_step"
run bench_conv_step 150 "$B/bench_conv_step" --runs 5
run bench_attention 240 "$B/bench_attention" --runs 5
run bench_bf16_gemm 420 "$B/bench_bf16_gemm"
run bench_gpt_step 240 "$B/bench_gpt_step"
run bench_loader_throughput 90 "$B/bench_loader_throughput"
run bench_data_memory 120 "$B/bench_data_memory"
run bench_ddp_step_demo 150 "$B/bench_ddp_step" --runs 5 --only demo
run bench_ddp_step_mlp 200 "$B/bench_ddp_step" --runs 5 --only mlp
run bench_trainer_step 150 "$B/bench_trainer_step" --runs 5

# bench_exact_step prints its own table: "<kind> median X ms min Y max Z" and "exact / normal (medians): Rx".
run bench_exact_step 150 "$B/bench_exact_step" 5 6
exact_row=$(awk '
  /normal DDP step/ && /median/ {for (i = 1; i <= NF; ++i) {if ($i == "median") nm = $(i+1); if ($i == "min") nl = $(i+1); if ($i == "max") nh = $(i+1)}}
  /exact step/ && /median/      {for (i = 1; i <= NF; ++i) {if ($i == "median") em = $(i+1); if ($i == "min") el = $(i+1); if ($i == "max") eh = $(i+1)}}
  END {
    if (nm == "" || em == "") exit 1
    r = em / nm
    printf "ROW|bench_exact_step|exact step (2 x 64 micro-batches) vs the normal DDP step, 2 workers, MLP 784-1024-1024-10, global batch 256|%s [%s, %s] ms (5 runs)|normal DDP step: %s [%s, %s] ms (5 runs)|%.2f|<= 1.3: %s\n", em, el, eh, nm, nl, nh, r, (r <= 1.3 ? "met" : "NOT met")
  }' "$LOGS/bench_exact_step.log") ||
  die "bench_exact_step: its output has no 'normal DDP step ... median' / 'exact step ... median' lines (log: $LOGS/bench_exact_step.log)"
rows+=("$exact_row")

if has bench_allreduce_sweep; then
  run bench_allreduce_sweep 240 "$B/bench_allreduce_sweep" --quick --ranks 2
else
  echo "bench.sh: bench_allreduce_sweep not built here (no Gloo): skipped"
fi

# bench_mpi_allreduce (under mpirun) prints "bytes raw phalanx speed | best-raw best-phalanx speed" per size.
mpi_note=""
if has bench_mpi_allreduce && command -v mpirun >/dev/null; then
  run bench_mpi_allreduce 120 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -np 2 "$B/bench_mpi_allreduce" 1048576
  while IFS= read -r line; do rows+=("$line"); done < <(awk '
    $1 ~ /^[0-9]+$/ && $5 == "|" && ($1 == 4 || $1 == 65536 || $1 == 1048576) {
      b = $1 >= 1048576 ? ($1 / 1048576) " MiB" : $1 >= 1024 ? ($1 / 1024) " KiB" : $1 " B"
      printf "ROW|bench_mpi_allreduce|allreduce %s, 2 ranks, Phalanx mpi plugin|%s us (best %s; median of 5)|raw OpenMPI: %s us (best %s; median of 5)|%.2f|-\n", b, $3, $7, $2, $6, $3 / $2
    }' "$LOGS/bench_mpi_allreduce.log")
else
  mpi_note="bench_mpi_allreduce: not run (no mpirun or no MPI plugin here)."
  echo "bench.sh: $mpi_note"
fi
[ ${#rows[@]} -gt 0 ] || die "no result rows were printed (logs: $LOGS)"

# ---- the table ----
env_line() { grep -m1 "^# $1:" "$LOGS/bench_mlp_step.log" | sed "s/^# $1: //"; }
machine=$(env_line machine | sed 's/; load average.*//')
phalanx_blas=$(env_line phalanx)
peer_blas=$(grep -h -m1 '^# peer:' "$LOGS"/bench_mlp_step.log | sed 's/^# peer: //')
core=$(sed -n 's/.*(core: \([^)]*\)).*/\1/p' <<<"$phalanx_blas" | head -1)
gen=$LOGS/generated.md
{
  echo "<!-- bench.sh: begin (generated by scripts/bench.sh; edits here are overwritten) -->"
  echo "Generated by \`scripts/bench.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC') from commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)'), in $((  $(date +%s) - t_start )) s."
  echo
  echo "- Machine: $machine; load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end (other jobs share it)."
  echo "- BLAS core: **${core:-unknown}**. Phalanx: $phalanx_blas."
  echo "- PyTorch peers: ${peer_blas:-none ran}."
  echo "- Every cell: median [fastest, slowest] of the runs (count in brackets); the ratio is Phalanx's median over the peer's (time over time: below 1 Phalanx is faster)."
  [ -n "$mpi_note" ] && echo "- $mpi_note"
  echo
  echo "| benchmark | case | Phalanx | peer | Phalanx / peer | bar |"
  echo "|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    IFS='|' read -r _ bench what ours peer ratio bar <<<"$r"
    echo "| \`$bench\` | $what | $ours | $peer | $ratio | $bar |"
  done
  echo "<!-- bench.sh: end -->"
} >"$gen"
awk -v gen="$gen" '
  /<!-- bench.sh: begin/ {while ((getline line < gen) > 0) print line; skip = 1; next}
  /<!-- bench.sh: end/ {skip = 0; next}
  !skip' "$DOC" >"$LOGS/doc.md" && cp "$LOGS/doc.md" "$DOC" || die "could not write $DOC"
echo "bench.sh: ${#rows[@]} rows written to $DOC in $(( $(date +%s) - t_start )) s (logs: $LOGS)"
