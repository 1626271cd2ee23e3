#!/usr/bin/env bash
# The GPU check (docs/gpu.md), run on the GPU machine from the bundle that
# scripts/gpu-bundle.sh made here: nothing fetched, and no build step unless the target's
# CUDA major is not the bundle's (then the two CUDA plugins are first rebuilt with the
# target's nvcc: "plugins for this machine's CUDA", below). Steps (KEY: what), in order; the
# hang-prone one last, with its own short limit:
#   environment     the GPU, python (the first of python3, /opt/torch/.venv/bin/python3,
#                   /usr/bin/python3 that imports torch) and its torch, CUDA's libraries
#                   (nvidia-* wheels of that python, or /usr/local/cuda), and an ldd audit:
#                   every library resolves into the bundle, the system's glibc/libstdc++ or
#                   CUDA's folders found here
#   cpu-ddp         phalanx-train alone vs 2 workers over Gloo under phalanx-run (CPU)
#   cpu-example     lr_scaling_study --check (CPU)
#   cpu-side        the CUDA plugin's behaviour without a usable device (no GPU only)
#   gpu-suite       tests/cuda's suite less the cases of the steps below (ops and gradients vs
#                   CPU, optimizers, conversions, NCCL world of one)
#   conv            every conv/pool/im2col/col2im/channel-bias kernel against the CPU
#   nccl-reducer    the bucketed reducer on NCCL at world size 1 (small buckets, plain/fp16/
#                   bf16 hooks, bit-equal to the plain model; the step flag on a bad label) and
#                   out-of-place collectives right after a long kernel that writes their input
#   memcheck, racecheck, initcheck   compute-sanitizer's tools over kernel cases
#   gpu-ddp         phalanx-train on CUDA alone vs W=1 over NCCL and W=2 over Gloo on one GPU
#   gpu-example     lr_scaling_study --device cuda --check
#   gpu-exact       lr_scaling_study --device cuda --exact --micro-batch 16 --check
#   gpu-bench       bench_mlp_step --device cuda against PyTorch CUDA
#   nccl-hang       last, limit 60 s: a watchdog timeout with a collective queued behind a long
#                   kernel (TimeoutError, abort, clean exit); a peer that never joins
# Without a GPU (or with PHALANX_CHECK_NO_GPU=1) every GPU step reports "skipped (no GPU)".
# Writes gpu-check.log and gpu-check.json (figures) to $PHALANX_CHECK_OUT, else $OUT, else
# ./gpu-check-out; exits non-zero when any step fails. Finishes within 6 minutes (360 s).
#
#   gpu-bundle/gpu-check.sh [--only KEY] [--list]   (the copy inside the bundle)
#   scripts/gpu-check.sh               (finds gpu-bundle/ or unpacks gpu-bundle.tar.gz beside it)
#   PHALANX_BUNDLE=DIR scripts/gpu-check.sh
# --only KEY runs that step alone (the environment is still found; its audit only picks
# lib/fallback where needed); --list prints the keys.
set -uo pipefail

STEP_KEYS="environment cpu-ddp cpu-example cpu-side gpu-suite conv nccl-reducer memcheck racecheck initcheck gpu-ddp gpu-example gpu-exact gpu-bench nccl-hang"
ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --only) ONLY=${2:-}; shift 2 || shift
            case " $STEP_KEYS " in *" $ONLY "*) ;; *) echo "gpu-check: --only needs one of: $STEP_KEYS"; exit 2 ;; esac ;;
    --list) echo "$STEP_KEYS"; exit 0 ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (usage: gpu-check.sh [--only KEY] [--list])"; exit 2 ;;
  esac
done

START=$(date +%s)  # before the bundle's unpacking: the 6 minutes count from here

# ---- the bundle ----
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
unpacked=""
if [ -n "${PHALANX_BUNDLE:-}" ]; then B=$PHALANX_BUNDLE
elif [ -f "$here/MANIFEST" ]; then B=$here
elif [ -f "$here/../gpu-bundle/MANIFEST" ]; then B=$here/../gpu-bundle
elif [ -f "$here/../gpu-bundle.tar.gz" ]; then
  unpacked=$(mktemp -d /tmp/phalanx-gpu-bundle.XXXXXX)
  tar xzf "$here/../gpu-bundle.tar.gz" -C "$unpacked" || { echo "gpu-check: cannot unpack $here/../gpu-bundle.tar.gz"; exit 2; }
  B=$(dirname "$(find "$unpacked" -maxdepth 2 -name MANIFEST | head -1)")
else
  echo "gpu-check: no bundle beside $here: run scripts/gpu-bundle.sh first (or set PHALANX_BUNDLE)"; exit 2
fi
[ -f "$B/MANIFEST" ] || { echo "gpu-check: $B is not a bundle (no MANIFEST): run scripts/gpu-bundle.sh"; exit 2; }
B=$(cd "$B" && pwd)
BIN=$B/bin
DATA=$B/data/seed_case_study.npz

RESULTS=${PHALANX_CHECK_OUT:-${OUT:-$PWD/gpu-check-out}}
mkdir -p "$RESULTS" || { echo "gpu-check: cannot create $RESULTS"; exit 2; }
RESULTS=$(cd "$RESULTS" && pwd)
LOG=$RESULTS/gpu-check.log
JSON=$RESULTS/gpu-check.json
WORK=$(mktemp -d /tmp/phalanx-gpu-check.XXXXXX)
finished=0  # a script that dies half-way (bash can exit 0 on some errors) must not pass
trap 'rc=$?; rm -rf "$WORK" ${unpacked:+"$unpacked"}; [ "$finished" = 1 ] || { echo "gpu-check: stopped before the summary" >&2; exit 1; }; exit $rc' EXIT
exec > >(tee "$LOG") 2>&1
TEE_PID=$!
cd "$WORK"

BUDGET_S=${PHALANX_CHECK_BUDGET_S:-280}  # steps not started after this many seconds fail
HANG_S=60                                  # the last step's own limit (nccl-hang)
HARD_END=$((START + BUDGET_S + HANG_S))    # and no command runs past this (+10 s to kill one
# that ignores SIGTERM: timeout --kill-after): 340 s (350 s), within 6 minutes
# (the hang-prone step, last, has its own HANG_S seconds after the others' BUDGET_S)
failures=0
steps_json=()
figures_json=()

json_str() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n\t' '  ')"; }
figure() { # NAME VALUE [string]: a figure for the JSON
  if [ "${3:-}" = string ] || ! [[ $2 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then figures_json+=("$(json_str "$1"): $(json_str "$2")")
  else figures_json+=("$(json_str "$1"): $2"); fi
}
record() { # NAME STATUS SECONDS DETAIL
  steps_json+=("{\"name\": $(json_str "$1"), \"status\": $(json_str "$2"), \"seconds\": $3, \"detail\": $(json_str "$4")}")
  printf -- '-- %s: %s (%ss)%s\n' "$1" "$2" "$3" "${4:+ $4}"
}
elapsed() { echo $(( $(date +%s) - START )); }
# tmo SECONDS CMD...: CMD with a time limit, cut to what the budget leaves (exit 124 when it
# runs out).
STEP_END=$((START + BUDGET_S + HANG_S))  # step() sets it: the budget's end, or the hang step's
tmo() {
  local s=$1 left=$((STEP_END - $(date +%s))); shift
  [ "$left" -lt "$s" ] && s=$(( left > 5 ? left : 5 ))
  timeout --kill-after=10 "$s" "$@"
}

# step NAME FUNCTION [ARGS...]: runs a check; it passes when FUNCTION returns 0. FUNCTION may
# set DETAIL (one line for the summary).
# step KEY NAME FUNCTION [ARGS...] (KEY: --only's name for it).
step() {
  local key=$1 name=$2; shift 2
  [ -z "$ONLY" ] || [ "$ONLY" = "$key" ] || return 0
  echo; echo "== $name"
  if [ "$key" != nccl-hang ] && [ "$(elapsed)" -ge "$BUDGET_S" ]; then
    failures=$((failures + 1)); record "$name" failed 0 "not started: the ${BUDGET_S}s budget is spent"; return
  fi
  DETAIL=""
  if [ "$key" = nccl-hang ]; then STEP_END=$(( $(date +%s) + HANG_S )); [ "$STEP_END" -le "$HARD_END" ] || STEP_END=$HARD_END
  else STEP_END=$((START + BUDGET_S + 10)); fi
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$@"; rc=$?
  t1=$(date +%s.%N)
  local dt
  dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
  if [ $rc -eq 0 ]; then record "$name" passed "$dt" "$DETAIL"
  elif [ $rc -eq 77 ]; then record "$name" "skipped (${DETAIL:-no reason given})" "$dt" ""
  else
    failures=$((failures + 1))
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && DETAIL="timed out${DETAIL:+; $DETAIL}"
    record "$name" failed "$dt" "exit $rc${DETAIL:+; $DETAIL}"
  fi
}
skip() { # KEY NAME WHY
  [ -z "$ONLY" ] || [ "$ONLY" = "$1" ] || return 0
  echo; echo "== $2"; record "$2" "skipped ($3)" 0 ""
}

# ---- environment: the GPU, python3, CUDA's libraries ----
echo "gpu-check: bundle $B"
sed -n '1,9p' "$B/MANIFEST"
echo "results: $RESULTS"

HAVE_GPU=0
gpu_name=""
if [ -z "${PHALANX_CHECK_NO_GPU:-}" ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >"$WORK/smi" 2>&1 && grep -q '^GPU ' "$WORK/smi"; then
  HAVE_GPU=1
  gpu_name=$(sed -n '1s/^GPU 0: \(.*\) (UUID.*/\1/p' "$WORK/smi")
  cat "$WORK/smi"
  nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/driver, memory: /'
  figure gpu "$gpu_name" string
  figure driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)" string
else
  echo "no GPU here${PHALANX_CHECK_NO_GPU:+ (PHALANX_CHECK_NO_GPU is set)}: the GPU steps are skipped"
fi
figure host "$(uname -n)" string
figure glibc "$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/^glibc //')" string

# Python: the first of python3 (PATH), /opt/torch/.venv/bin/python3, /usr/bin/python3 that
# imports torch (its nvidia-* wheels are CUDA's libraries too); else the first that runs.
PY=""
torch_line=""
for cand in "$(command -v python3 || true)" /opt/torch/.venv/bin/python3 /usr/bin/python3; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  [ -n "$PY" ] || PY=$cand
  line=$("$cand" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null) || continue
  PY=$cand; torch_line=$line; break
done
if [ -n "$PY" ]; then
  echo "python: $PY (torch: ${torch_line:-not importable from any of python3, /opt/torch/.venv/bin/python3, /usr/bin/python3})"
  figure python3 "$PY" string
  figure torch "${torch_line:-none}" string
fi

# CUDA's libraries: $PHALANX_CUDA_LIB_DIRS, python3's nvidia-* wheels, the CUDA toolkit, the driver.
cuda_dirs=()
add_dir() { local d; for d in "$@"; do [ -d "$d" ] && cuda_dirs+=("$(cd "$d" && pwd)"); done; }
IFS=: read -r -a extra <<<"${PHALANX_CUDA_LIB_DIRS:-}"
add_dir "${extra[@]}"
if [ -n "$PY" ]; then
  while read -r sp; do
    for d in "$sp"/nvidia/*/lib "$sp"/nvidia/cu*/lib64; do ls "$d"/lib*.so* >/dev/null 2>&1 && add_dir "$d"; done
  done < <("$PY" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
fi
add_dir /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib
cuda_path=$(IFS=:; echo "${cuda_dirs[*]}")
cuda_needs=$(sed -n 's/^cuda-needs: //p' "$B/MANIFEST")
missing_cuda=""
for lib in $cuda_needs; do
  found=""
  for d in "${cuda_dirs[@]}"; do [ -e "$d/$lib" ] && { found=$d; break; }; done
  echo "  $lib: ${found:-NOT FOUND}"
  [ -n "$found" ] || missing_cuda="$missing_cuda $lib"
done

# ---- CUDA built here vs CUDA there ----
# The two CUDA plugins need the CUDA major they were built with (MANIFEST: cuda-built-with),
# and a driver for it; nothing else in the bundle uses CUDA. Where the target offers another
# major (PyTorch's wheels for CUDA 12, a driver for CUDA 12 only), libphalanx_cuda.so and
# libphalanx_nccl.so are rebuilt from the bundle's src/ with the target's nvcc, against its
# CUDA and NCCL and the bundle's libphalanx.so.0, into a copy of the bundle (about a minute).
# PHALANX_CHECK_REBUILD_PLUGINS=1 forces this, =0 forbids it; PHALANX_CUDA_ARCH (default 90).
built_major=$(sed -n 's/^cuda-built-with: \([0-9]*\).*/\1/p' "$B/MANIFEST")
driver_cuda=""
[ "$HAVE_GPU" = 1 ] && driver_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -1)
[ -n "$driver_cuda" ] && figure driver_cuda "$driver_cuda" string
rebuild_reason=""
case "${PHALANX_CHECK_REBUILD_PLUGINS:-auto}" in
  1) rebuild_reason="PHALANX_CHECK_REBUILD_PLUGINS=1" ;;
  0) ;;
  *) if [ "$HAVE_GPU" = 1 ] && [ -n "$missing_cuda" ]; then
       rebuild_reason="CUDA ${built_major}'s libraries are not here:$missing_cuda"
     elif [ "$HAVE_GPU" = 1 ] && [ -n "$driver_cuda" ] && [ -n "$built_major" ] && [ "${driver_cuda%%.*}" -lt "$built_major" ]; then
       rebuild_reason="the driver supports CUDA $driver_cuda, the plugins were built with CUDA $built_major"
     fi ;;
esac
rebuild_plugins() {
  echo "rebuilding the CUDA plugins: $rebuild_reason"
  local s=$B/src out=$WORK/plugins nvcc home ver maj d
  [ -d "$s/core/cuda" ] || { DETAIL="the bundle has no src/ (made by an older scripts/gpu-bundle.sh)"; return 1; }
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || ls -d /usr/local/cuda-*/bin/nvcc 2>/dev/null | sort -V | tail -1)
  [ -n "$nvcc" ] || { DETAIL="no nvcc on the PATH or in /usr/local/cuda*/bin: put the CUDA toolkit's bin/ on the PATH"; return 1; }
  home=$(cd "$(dirname "$nvcc")/.." && pwd)
  ver=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p'); maj=${ver%%.*}
  local dirs=("$home/lib64" "$home/lib" "$home/targets/x86_64-linux/lib" "${cuda_dirs[@]}")
  find_lib() { local d; for d in "${dirs[@]}"; do [ -e "$d/$1" ] && { echo "$d/$1"; return; }; done; }
  local cudart cublas nccl nccl_inc=""
  cudart=$(find_lib "libcudart.so.$maj"); cublas=$(find_lib "libcublas.so.$maj"); nccl=$(find_lib libnccl.so.2)
  for d in "$home/include" "${dirs[@]/%//../include}" /usr/include; do [ -f "$d/nccl.h" ] && { nccl_inc=$d; break; }; done
  echo "  nvcc $nvcc (CUDA $ver); cudart ${cudart:-NOT FOUND}; cublas ${cublas:-NOT FOUND}; nccl ${nccl:-NOT FOUND}; nccl.h in ${nccl_inc:-NOT FOUND}"
  [ -n "$cudart" ] && [ -n "$cublas" ] || { DETAIL="CUDA $ver's libcudart.so.$maj or libcublas.so.$maj not found"; return 1; }
  local arch=${PHALANX_CUDA_ARCH:-90}
  local inc=(-I"$s/include" -I"$s/core/include" -I"$s/backends/include" -I"$s/core/cuda" -I"$home/include")
  local cxx=(g++ -O3 -std=c++17 -fPIC "${inc[@]}")
  local cu=("$nvcc" -O3 -std=c++17 -allow-unsupported-compiler -Xcompiler=-fPIC -gencode "arch=compute_$arch,code=sm_$arch"
            -gencode "arch=compute_$arch,code=compute_$arch" "${inc[@]}")
  mkdir -p "$out" && cd "$out" || return 1
  tmo 240 "${cu[@]}" -c "$s/core/cuda/cuda_kernels.cu" -o kernels.o & local k=$!
  tmo 240 "${cu[@]}" -c "$s/core/cuda/label_check.cu" -o labels.o & local l=$!
  local rc=0
  tmo 120 "${cxx[@]}" -c "$s/core/cuda/cuda_allocator.cpp" -o allocator.o || rc=1
  tmo 120 "${cxx[@]}" -c "$s/core/cuda/plugin_entry.cpp" -o cuda_entry.o || rc=1
  wait $k || rc=1; wait $l || rc=1
  [ $rc = 0 ] && g++ -shared -Wl,--no-undefined -Wl,-rpath-link,"$B/lib" -o libphalanx_cuda.so kernels.o labels.o allocator.o cuda_entry.o "$B/lib/libphalanx.so.0" \
    "$cudart" "$cublas" -Wl,-rpath,'$ORIGIN' || rc=1
  local plugins="cuda"
  if [ $rc = 0 ] && [ -n "$nccl" ] && [ -n "$nccl_inc" ]; then
    if tmo 120 "${cxx[@]}" -I"$nccl_inc" -c "$s/backends/nccl/nccl_process_group.cpp" -o nccl_pg.o &&
       tmo 120 "${cxx[@]}" -I"$nccl_inc" -c "$s/backends/nccl/plugin_entry.cpp" -o nccl_entry.o &&
       g++ -shared -Wl,--no-undefined -Wl,-rpath-link,"$B/lib" -o libphalanx_nccl.so nccl_pg.o nccl_entry.o "$B/lib/libphalanx.so.0" "$cudart" "$nccl" -Wl,-rpath,'$ORIGIN'; then
      plugins="cuda nccl"
    else rc=1; fi
  elif [ $rc = 0 ]; then
    echo "  NCCL (libnccl.so.2 and nccl.h) not found: the NCCL plugin is left out"
  fi
  cd "$WORK" || return 1
  [ $rc = 0 ] || { DETAIL="building the plugins with CUDA $ver failed (see the log)"; return 1; }
  # A copy of the bundle with these plugins (the programs find lib/ by their run paths).
  cp -a "$B" "$WORK/bundle" || return 1
  rm -f "$WORK/bundle/lib/libphalanx_cuda.so" "$WORK/bundle/lib/libphalanx_nccl.so"
  for p in $plugins; do cp "$out/libphalanx_$p.so" "$WORK/bundle/lib/"; done
  B=$WORK/bundle; BIN=$B/bin; DATA=$B/data/seed_case_study.npz
  cuda_needs=$(objdump -p "$B"/lib/libphalanx_*.so | awk '/NEEDED/ {print $2}' | grep -E '^lib(cudart|cublas|nccl)' | sort -u)
  cuda_needs="$cuda_needs libcublasLt.so.$maj"
  missing_cuda=""
  local lib found
  for lib in $cuda_needs; do
    found=""; for d in "${cuda_dirs[@]}"; do [ -e "$d/$lib" ] && { found=$d; break; }; done
    [ -n "$found" ] || missing_cuda="$missing_cuda $lib"
  done
  figure plugins "rebuilt here with CUDA $ver (sm_$arch): $plugins" string
  DETAIL="built with CUDA $ver for sm_$arch: $plugins (${rebuild_reason})"
}
if [ -n "$rebuild_reason" ]; then
  add_dir "${PHALANX_CUDA_HOME:-/usr/local/cuda}/lib64"
  step "${ONLY:+$ONLY}" "plugins for this machine's CUDA" rebuild_plugins
  cuda_path=$(IFS=:; echo "${cuda_dirs[*]}")
fi
BASE_LD="${cuda_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH="$B/lib${BASE_LD:+:$BASE_LD}"
export PHALANX_DATA_DIR=$B/data PHALANX_PEERS_DIR=$B/peers
# PyTorch (the benchmark's peer) runs without the bundle's libraries first on its path: they
# are Debian's builds (OpenBLAS, libzip, ...), not what its wheels expect.
if [ -n "$PY" ]; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$BASE_LD" "$PY" >"$WORK/python3"
  chmod +x "$WORK/python3"
  export PHALANX_PYTHON=$WORK/python3
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# The ldd audit: every library of the bundle resolves into the bundle (by its run paths alone:
# the bundle is not on LD_LIBRARY_PATH here), the system's glibc, libstdc++ and libgcc_s, or
# CUDA's folders. A libstdc++ too old for the bundle switches to lib/fallback.
cuda_not_found='(libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so[^ ]* => not found'
system_lib='^(libc|libm|libdl|libpthread|librt|libutil|libresolv|libmvec|libstdc\+\+|libgcc_s)\.so'
cuda_lib='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-|libnvJitLink|libnvrtc)\.'
audit() {
  local path=$1 out=$WORK/ldd bad=0 f
  : >"$out"; : >"$WORK/audit"
  for f in "$BIN"/* "$B"/lib/*.so*; do
    LD_LIBRARY_PATH=$path ldd "$f" 2>&1 | sed "s|^[[:space:]]*|$(basename "$f"): |" >>"$out"
  done
  if grep -q "version \`\(GLIBCXX\|CXXABI\)_[0-9.]*' not found" "$out" && [ "$path" != "$B/lib/fallback${cuda_path:+:$cuda_path}" ]; then
    echo "the system's libstdc++ is older than the bundle's needs ($(sed -n 's/^glibcxx-needs: //p' "$B/MANIFEST")): using lib/fallback"
    export LD_LIBRARY_PATH="$B/lib:$B/lib/fallback${BASE_LD:+:$BASE_LD}"
    figure libstdcxx "the bundle's fallback" string
    audit "$B/lib/fallback${cuda_path:+:$cuda_path}"; return
  fi
  while read -r line; do
    case $line in
      *"=> $B/"*|*linux-vdso*|*ld-linux*|*"statically linked"*) ;;
      *"=> not found"*|*"not found"*)
        if [ "$HAVE_GPU" = 0 ] && [[ $line =~ $cuda_not_found ]]; then continue; fi
        echo "unresolved: ${line#*: }" >>"$WORK/audit"; bad=1 ;;
      *"=> "*)
        local lib=${line#*: }; lib=${lib%% *}
        if [[ $lib =~ $system_lib ]]; then continue; fi
        local resolved=${line#*=> }; resolved=${resolved%% (*}
        local ok=0 d
        for d in "${cuda_dirs[@]}"; do [[ $resolved == "$d"/* ]] && ok=1; done
        [[ $lib =~ $cuda_lib ]] || ok=0
        [ $ok = 1 ] || { echo "outside the bundle: ${line#*: }" | sed 's/ (0x[0-9a-f]*)$//' >>"$WORK/audit"; bad=1; } ;;
    esac
  done <"$out"
  [ $bad = 0 ] || sort -u "$WORK/audit" | sed 's/^/  /'
  return $bad
}
version_below() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
check_environment() {
  local have need
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/^glibc //'); need=$(sed -n 's/^glibc-needs: //p' "$B/MANIFEST")
  if [ -n "$have" ] && [ -n "$need" ] && version_below "$have" "$need"; then
    DETAIL="glibc $have here, the bundle needs $need: make the bundle on a system with an older glibc"; return 1
  fi
  audit "$cuda_path" || { DETAIL="a library resolves outside the bundle, or not at all (see the log)"; return 1; }
  if [ "$HAVE_GPU" = 1 ] && [ -n "$missing_cuda" ]; then
    DETAIL="CUDA libraries not found:$missing_cuda (the bundle was built with CUDA $(sed -n 's/^cuda-built-with: //p' "$B/MANIFEST"); install PyTorch's nvidia-* wheels for that CUDA major or set PHALANX_CUDA_LIB_DIRS)"
    return 1
  fi
  DETAIL="every library resolves into the bundle, the system or CUDA's folders"
}
step environment "environment" check_environment
# --only another step: the audit still runs, quietly, for its one effect (lib/fallback when
# the target's libstdc++ is too old); its verdict belongs to the environment step.
if [ -n "$ONLY" ] && [ "$ONLY" != environment ]; then audit "$cuda_path" >/dev/null 2>&1 || true; fi

# ---- CPU: the bundle's programs work from here ----
train_common=(--train-x "$DATA:x" --train-y "$DATA:y" --global-batch 64 --lr 0.1 --epochs 30 --no-shuffle --eval-train --seed 0)
final_loss() { grep -o '"final_train_loss":[-0-9.eE+]*' "$1" | tail -1 | cut -d: -f2; }
field() { grep -o "\"$2\":\"[^\"]*\"" "$1" | tail -1 | cut -d'"' -f4; }
last_words() { grep -v '^\s*$' "$1" | tail -1 | cut -c1-300; }
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t)}'; }

# ddp_vs_one LABEL DEVICE_ONE RUNS...: trains alone on DEVICE_ONE, then each RUN ("W BACKEND
# DEVICE") under phalanx-run; each final loss within 1e-5 of the one process's.
ddp_vs_one() {
  local label=$1 dev=$2; shift 2
  tmo 120 "$BIN/phalanx-train" "${train_common[@]}" --device "$dev" >"$WORK/one.out" 2>&1
  local rc=$?; cat "$WORK/one.out"
  local one; one=$(final_loss "$WORK/one.out")
  [ $rc -eq 0 ] && [ -n "$one" ] || { DETAIL="the one process failed: $(last_words "$WORK/one.out")"; return 1; }
  figure "${label}_one_process_loss" "$one"
  DETAIL="one process $one"
  local run w backend d ok=0
  for run in "$@"; do
    read -r w backend d <<<"$run"
    echo "   W=$w over $backend on $d:"
    tmo 150 "$BIN/phalanx-run" --nproc-per-node "$w" "$BIN/phalanx-train" "${train_common[@]}" --device "$d" --backend "$backend" \
      >"$WORK/w.out" 2>&1
    rc=$?; cat "$WORK/w.out"
    local loss used world
    loss=$(final_loss "$WORK/w.out"); used=$(field "$WORK/w.out" backend)
    world=$(grep -o '"world_size":[0-9]*' "$WORK/w.out" | tail -1 | cut -d: -f2)
    figure "${label}_w${w}_${backend}_loss" "${loss:-none}"
    if [ $rc -ne 0 ] || [ -z "$loss" ]; then DETAIL="$DETAIL; W=$w $backend failed (exit $rc): $(last_words "$WORK/w.out")"; ok=1; continue; fi
    if [ "$used" != "$backend" ] || [ "$world" != "$w" ]; then DETAIL="$DETAIL; W=$w ran as $used, world $world"; ok=1; continue; fi
    if within "$loss" "$one" 1e-5; then DETAIL="$DETAIL; W=$w $backend $loss"
    else DETAIL="$DETAIL; W=$w $backend $loss differs by more than 1e-5"; ok=1; fi
  done
  return $ok
}
step cpu-ddp "cpu ddp: W=2 over Gloo equals one process" ddp_vs_one cpu cpu "2 gloo cpu"

example() { # DEVICE [ARGS...]
  local dev=$1; shift
  tmo 120 "$BIN/lr_scaling_study" --device "$dev" "$@" --check >"$WORK/ex.out" 2>&1
  local rc=$?; cat "$WORK/ex.out"
  DETAIL=$(grep -o 'check: [a-zA-Z]*' "$WORK/ex.out" | tail -1)
  [ -n "$DETAIL" ] || DETAIL=$(last_words "$WORK/ex.out")
  return $rc
}
step cpu-example "cpu example: lr_scaling_study --check" example cpu

cpu_side() { tmo 60 "$BIN/cuda_cpu_side_tests"; }
if [ "$HAVE_GPU" = 1 ]; then
  skip cpu-side "cpu-side tests" "a GPU is here; the GPU suite covers the device"
else
  step cpu-side "cpu-side tests (no device)" cpu_side
fi

# ---- GPU ----
# tests/cuda's suite, split so that each step can be rerun alone (--only) and the hang-prone
# NCCL cases run last with their own limit: "cuda:*" kernel cases, "nccl:*" NCCL cases,
# "nccl reducer:*"/"nccl order:*" the reducer and stream order on NCCL, "nccl hang:*" the
# watchdog and the peer that never joins (NCCL can hang where the plugin cannot bound it,
# inside ncclCommAbort: the limit keeps that from eating the other steps' time).
SPLIT_OFF='cuda: conv2d*,cuda: max*,nccl reducer:*,nccl order:*,nccl hang:*'
suite_counts() { grep -E '^\[doctest\] (test cases|assertions):' "$1" | tr -s ' ' | sed 's/^\[doctest\] //' | paste -sd ';' -; }
# cases SECONDS OUT DOCTEST-ARGS...: a part of the suite; a skip (no usable device although
# nvidia-smi sees one) is a failure.
cases() {
  local limit=$1 out=$2; shift 2
  NCCL_DEBUG=${NCCL_DEBUG:-WARN} tmo "$limit" "$BIN/cuda_tests" "$@" >"$out" 2>&1
  local rc=$?; cat "$out"
  DETAIL=$(suite_counts "$out")
  if [ $rc -eq 77 ]; then DETAIL="the suite found no usable CUDA device: $(grep -m1 '^SKIPPED' "$out")"; return 1; fi
  return $rc
}
gpu_suite() { cases 150 "$WORK/suite.out" -tce="$SPLIT_OFF"; }
conv_cases() { cases 60 "$WORK/conv.out" -tc='cuda: conv2d*,cuda: max*'; }
reducer_cases() { cases 90 "$WORK/reducer.out" -tc='nccl reducer:*,nccl order:*'; }
hang_cases() { cases "$HANG_S" "$WORK/hang.out" -tc='nccl hang:*'; }
no_gpu_suite() { # the suite must skip itself cleanly (exit 77) where there is no GPU
  tmo 60 "$BIN/cuda_tests" >"$WORK/suite.out" 2>&1
  local rc=$?; cat "$WORK/suite.out"
  [ $rc -eq 77 ] && { echo "(the suite skipped itself: exit 77)"; DETAIL="no GPU"; return 77; }
  DETAIL="expected exit 77 without a GPU"; return 1
}

# sanitizer TOOL SECONDS CASES: compute-sanitizer --tool TOOL over some kernel cases (the NCCL
# cases and the 2^31-element tensor would take minutes under it).
sanitizer() {
  local tool=$1 limit=$2 filter=$3 cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$cs" ] || { DETAIL="compute-sanitizer not found"; return 77; }
  local extra=()
  [ "$tool" = initcheck ] && extra=(--track-unused-memory no)
  tmo "$limit" "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 86 --print-limit 20 "$BIN/cuda_tests" \
    -tc="$filter" -tce='*2^31*' >"$WORK/$tool.out" 2>&1
  local rc=$?; tail -40 "$WORK/$tool.out"
  if grep -qE 'Device not supported|Error: Target application terminated before first instrumented API call|unable to (initialize|load)' "$WORK/$tool.out"; then
    DETAIL="the tool does not work here: $(grep -m1 -E 'Device not supported|Error:|unable to' "$WORK/$tool.out")"; return 77
  fi
  DETAIL=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/$tool.out")
  return $rc
}
# memcheck over every kernel case; racecheck (shared memory: the reductions, attention, the
# conv/pool kernels) and initcheck (reads of unwritten device memory) over a smaller set.
KERNEL_SET='cuda: matmul*,cuda: conv2d*,cuda: max*,cuda: elementwise*,CUDA: scaled_dot*,CUDA: batch_norm*'

bench() {
  tmo 150 "$BIN/bench_mlp_step" --device cuda >"$WORK/bench.out" 2>&1
  local rc=$?; cat "$WORK/bench.out"
  [ $rc -eq 0 ] || { DETAIL="bench_mlp_step failed: $(last_words "$WORK/bench.out")"; return $rc; }
  local row ok=0
  for model in 784-1024-1024-10 64-32-10; do
    row=$(awk -v m="$model" '$1 == m {print $3, $4}' "$WORK/bench.out")
    read -r ours theirs <<<"$row"
    figure "mlp_${model}_phalanx_us" "${ours:-none}"
    figure "mlp_${model}_torch_us" "${theirs:-none}"
    if [ -z "$theirs" ] || ! awk -v t="$theirs" 'BEGIN {exit !(t > 0)}'; then DETAIL="$DETAIL $model: the PyTorch peer did not run;"; ok=1; continue; fi
    local ratio; ratio=$(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.3f", a / b}')
    figure "mlp_${model}_phalanx_over_torch" "$ratio"
    DETAIL="$DETAIL $model: ${ours} us vs torch ${theirs} us (${ratio}x);"
  done
  local big; big=$(awk -v m=784-1024-1024-10 '$1 == m && $4 > 0 {print ($3 / $4 <= 1.2) ? "met" : "MISSED"}' "$WORK/bench.out")
  figure mlp_bar_1_2x "${big:-unknown}" string
  DETAIL="$DETAIL bar (784-1024-1024-10 <= 1.2x torch): ${big:-unknown}"
  return $ok
}

# gpu_step KEY NAME FUNCTION [ARGS...]: a GPU step; without a GPU it reports skipped, except
# the suite, which must then skip itself (exit 77).
gpu_step() {
  if [ "$HAVE_GPU" = 1 ]; then step "$@"
  elif [ "$1" = gpu-suite ]; then step gpu-suite "$2" no_gpu_suite
  else skip "$1" "$2" "no GPU"; fi
}
gpu_step gpu-suite "gpu suite (kernels, optimizers, conversions, NCCL world of one)" gpu_suite
gpu_step conv "conv and pool kernels (im2col, col2im, channel bias, pools) vs the CPU" conv_cases
gpu_step nccl-reducer "nccl reducer at W=1 (buckets, fp16/bf16 hooks, step flag) and stream order" reducer_cases
gpu_step memcheck "memcheck (kernel cases)" sanitizer memcheck 100 'cuda:*'
gpu_step racecheck "racecheck (kernel cases)" sanitizer racecheck 60 "$KERNEL_SET"
gpu_step initcheck "initcheck (kernel cases)" sanitizer initcheck 45 "$KERNEL_SET"
gpu_step gpu-ddp "gpu ddp: W=1 over NCCL and W=2 over Gloo on one GPU equal one process" \
  ddp_vs_one cuda cuda "1 nccl cuda" "2 gloo cuda:0"
gpu_step gpu-example "gpu example: lr_scaling_study --device cuda --check" example cuda
gpu_step gpu-exact "gpu exact: lr_scaling_study --device cuda --exact --micro-batch 16 --check" \
  example cuda --exact --micro-batch 16
gpu_step gpu-bench "gpu bench: bench_mlp_step --device cuda vs PyTorch CUDA" bench
gpu_step nccl-hang "nccl hang (last, ${HANG_S} s): watchdog timeout behind a long kernel, a peer that never joins" \
  hang_cases

# ---- summary ----
total=$(elapsed)
verdict=$([ $failures -eq 0 ] && echo passed || echo failed)
{
  echo "{"
  echo "  \"verdict\": \"$verdict\", \"failures\": $failures, \"seconds\": $total, \"gpu\": $([ "$HAVE_GPU" = 1 ] && echo true || echo false),"
  echo "  \"bundle\": $(json_str "$(sed -n '2,3p' "$B/MANIFEST" | paste -sd ';' -)"),"
  echo "  \"steps\": ["
  for i in "${!steps_json[@]}"; do echo "    ${steps_json[$i]}$([ "$i" -lt $((${#steps_json[@]} - 1)) ] && echo ,)"; done
  echo "  ],"
  echo "  \"figures\": {"
  for i in "${!figures_json[@]}"; do echo "    ${figures_json[$i]}$([ "$i" -lt $((${#figures_json[@]} - 1)) ] && echo ,)"; done
  echo "  }"
  echo "}"
} >"$JSON"
echo
echo "gpu-check: $verdict ($failures failed step(s), ${total}s); log $LOG, figures $JSON"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
finished=1
[ $failures -eq 0 ]
