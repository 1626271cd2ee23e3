#!/usr/bin/env bash
# Builds the GPU bundle (docs/gpu.md): everything scripts/gpu-check.sh runs on a GPU machine
# that has a driver, the CUDA runtime, cuBLAS and NCCL (PyTorch's nvidia-* wheels or a CUDA
# toolkit) but none of our Debian -dev packages and no network. The bundle is relocatable:
#
#   bin/    the GPU suite, phalanx-run, phalanx-train, lr_scaling_study, bench_mlp_step
#           (run path $ORIGIN/../lib)
#   lib/    libphalanx.so.0, its plugins (gloo, cuda, nccl) and every shared library they
#           need except glibc's, libstdc++/libgcc_s and CUDA's (run path $ORIGIN)
#   lib/fallback/  this machine's libstdc++ and libgcc_s, used by gpu-check only when the
#           target's are too old for the bundle
#   data/, peers/  the examples' data and the PyTorch peers (found beside bin/)
#   src/    the CUDA and NCCL plugins' sources (gpu-check rebuilds them for another CUDA major)
#   gpu-check.sh, MANIFEST
#
# usage: scripts/gpu-bundle.sh [BUILD_DIR] [--out DIR] [--no-build] [--archive]
#   BUILD_DIR  a build to reuse ($PHALANX_BUNDLE_BUILD_DIR; default build-bundle, configured
#              in Release if new); --no-build takes its files as they are
#   --out DIR  where the bundle goes ($PHALANX_BUNDLE_DIR; default gpu-bundle/, git-ignored)
#   --archive  also DIR.tar.gz (a third of the size; scripts/gpu-check.sh unpacks
#              gpu-bundle.tar.gz when it finds no gpu-bundle/)
# Needs patchelf (apt-get install patchelf). Refuses a bundle over 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BUILD=${PHALANX_BUNDLE_BUILD_DIR:-build-bundle}
OUT_DIR=${PHALANX_BUNDLE_DIR:-gpu-bundle}
BUILD_STEP=1
ARCHIVE=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT_DIR=${2:?--out needs a folder}; shift 2 ;;
    --no-build) BUILD_STEP=0; shift ;;
    --archive) ARCHIVE=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "gpu-bundle: unknown option $1 (usage: scripts/gpu-bundle.sh [BUILD_DIR] [--out DIR] [--no-build] [--archive])" >&2; exit 2 ;;
    *) BUILD=$1; shift ;;
  esac
done
MAX_BYTES=$((60 * 1024 * 1024))

die() { echo "gpu-bundle: $*" >&2; exit 1; }
command -v patchelf >/dev/null || die "patchelf is missing: apt-get install patchelf (scripts/setup.sh installs it)"

# What the check runs. The GPU suite's binaries are tests/cuda's (tests/CMakeLists.txt).
EXECUTABLES=(bin/phalanx-run bin/phalanx-train examples/lr_scaling_study bench/bench_mlp_step
             tests/cuda_tests tests/cuda_cpu_side_tests)
PLUGINS=(gloo cuda nccl)
# Provided by every target: glibc's libraries and the loader. libstdc++ and libgcc_s too, but
# a copy goes to lib/fallback (gpu-check uses it when the target's is older than ours).
SYSTEM_LIBS='^(linux-vdso\.so|ld-linux.*|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|libresolv\.so|libanl\.so|libmvec\.so)'
FALLBACK_LIBS='^(libstdc\+\+\.so|libgcc_s\.so)'
# From the target (the nvidia-* wheels, the CUDA toolkit, the driver): never bundled.
CUDA_LIBS='^(libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvidia-|libnvrtc|libnvJitLink|libcudnn)'

# ---- build (or reuse) ----
if [ "$BUILD_STEP" = 1 ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    echo "gpu-bundle: configuring $BUILD (Release)"
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  targets=(phalanx phalanx-run phalanx-train lr_scaling_study bench_mlp_step cuda_tests cuda_cpu_side_tests)
  for p in "${PLUGINS[@]}"; do
    grep -q "^PHALANX_HAVE_$(echo "$p" | tr a-z A-Z):INTERNAL=ON" "$BUILD/CMakeCache.txt" && targets+=("phalanx_$p")
  done
  echo "gpu-bundle: building ${targets[*]} in $BUILD"
  cmake --build "$BUILD" -j "${PHALANX_JOBS:-$(nproc)}" --target "${targets[@]}" >/dev/null ||
    die "the build in $BUILD failed: run cmake --build $BUILD to see why"
fi
[ -f "$BUILD/libphalanx.so.0" ] || die "$BUILD has no libphalanx.so.0: build it first, or drop --no-build"
cuda_version=$(sed -n 's/^CMAKE_CUDA_COMPILER_VERSION:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null | head -1)
[ -n "$cuda_version" ] || cuda_version=$(grep -ho 'CMAKE_CUDA_COMPILER_VERSION "[0-9.]*"' "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | grep -o '[0-9.]*' | head -1 || true)

# ---- assemble in a fresh folder, then move it into place ----
STAGE="$OUT_DIR.tmp.$$"
rm -rf "$STAGE"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,lib/fallback,data,peers}
for e in "${EXECUTABLES[@]}"; do
  [ -x "$BUILD/$e" ] || die "$BUILD/$e is missing: build it (or run without --no-build)"
  cp "$BUILD/$e" "$STAGE/bin/"
done
cp -L "$BUILD/libphalanx.so.0" "$STAGE/lib/libphalanx.so.0"
plugins=()
for p in "${PLUGINS[@]}"; do
  if [ -f "$BUILD/libphalanx_$p.so" ]; then cp "$BUILD/libphalanx_$p.so" "$STAGE/lib/"; plugins+=("$p"); fi
done
chmod u+w "$STAGE"/bin/* "$STAGE"/lib/*.so*
strip --strip-unneeded "$STAGE"/bin/* "$STAGE"/lib/*.so*
patchelf --set-rpath '$ORIGIN/../lib' "$STAGE"/bin/*
for f in "$STAGE"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$f"; done

# Every shared library the bundle needs, found with ldd, until nothing new turns up. The
# copies keep their soname as file name and get $ORIGIN as run path.
cuda_needs=()
while :; do
  added=0
  for f in "$STAGE"/bin/* "$STAGE"/lib/*.so*; do
    while read -r name _ path _; do
      [ -n "$name" ] || continue
      [[ $name == /* ]] && continue  # the loader itself
      if [[ $name =~ $SYSTEM_LIBS ]]; then continue; fi
      if [[ $name =~ $CUDA_LIBS ]]; then cuda_needs+=("$name"); continue; fi
      [ "$path" != "not" ] || die "$f needs $name, which is not found here"
      if [[ $name =~ $FALLBACK_LIBS ]]; then
        [ -f "$STAGE/lib/fallback/$name" ] || cp -L "$path" "$STAGE/lib/fallback/$name"
        continue
      fi
      [ -f "$STAGE/lib/$name" ] && continue
      [ -f "$path" ] || die "$f needs $name, resolved to $path, which is not a file"
      cp -L "$path" "$STAGE/lib/$name"
      chmod u+w "$STAGE/lib/$name"
      patchelf --set-rpath '$ORIGIN' "$STAGE/lib/$name"
      added=1
    done < <(ldd "$f" 2>/dev/null | awk '/=>/ {print $1, $2, $3, $4} !/=>/ && NF {print $1}')
  done
  [ "$added" = 1 ] || break
done

# No path of this machine may be compiled in: the bundle runs where neither tree exists.
for tree in "$ROOT" "$(cd "$BUILD" && pwd)"; do
  if found=$(grep -l -a -F "$tree/" "$STAGE"/bin/* "$STAGE"/lib/libphalanx*.so*); then
    die "the path $tree/ is compiled into $(echo "$found" | xargs -n1 basename | paste -sd, -): take it relative to the executable or from an environment variable (examples/support/relocatable_paths.hpp)"
  fi
done

cp examples/data/seed_case_study.npz "$STAGE/data/"
cp bench/peers/*.py "$STAGE/peers/"
cp scripts/gpu-check.sh "$STAGE/gpu-check.sh"
# The CUDA plugins' sources and the headers they include (about 300 KiB): gpu-check rebuilds
# the two plugins with the target's nvcc where its CUDA major is not the one built with here.
mkdir -p "$STAGE/src"
cp -r --parents include core/include backends/include core/cuda backends/nccl "$STAGE/src/"
chmod +x "$STAGE/gpu-check.sh"

# What the target must offer: the highest glibc and libstdc++ symbol versions used, and CUDA's
# libraries by soname.
max_version() { # PREFIX FILES...: the highest PREFIX_x.y.z any file asks for
  local prefix=$1; shift
  objdump -T "$@" 2>/dev/null | grep -o "${prefix}_[0-9][0-9.]*" | sed "s/^${prefix}_//" | sort -uV | tail -1
}
elves=("$STAGE"/bin/* "$STAGE"/lib/*.so*)
{
  echo "phalanx-gpu-bundle 1"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(getconf GNU_LIBC_VERSION)"
  echo "build-dir: $(cd "$BUILD" && pwd)"
  echo "plugins: ${plugins[*]}"
  echo "cuda-built-with: ${cuda_version:-none}"
  echo "cuda-needs: $(printf '%s\n' "${cuda_needs[@]}" | sort -u | tr '\n' ' ' | sed 's/ $//')"
  echo "glibc-needs: $(max_version GLIBC "${elves[@]}")"
  echo "glibcxx-needs: $(max_version GLIBCXX "${elves[@]}")"
  echo "files:"
  (cd "$STAGE" && find . -type f ! -name MANIFEST | sort | while read -r f; do printf '  %9d %s\n' "$(stat -c %s "$f")" "${f#./}"; done)
} >"$STAGE/MANIFEST"

bytes=$(du -sb "$STAGE" | cut -f1)
[ "$bytes" -le "$MAX_BYTES" ] || die "the bundle is $((bytes / 1024 / 1024)) MiB, over the 60 MiB the GPU machine's transfer leaves it (see $STAGE/MANIFEST)"
rm -rf "$OUT_DIR"
mv "$STAGE" "$OUT_DIR"
trap - EXIT
if [ "$ARCHIVE" = 1 ]; then
  tar czf "$OUT_DIR.tar.gz.tmp" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"
  mv "$OUT_DIR.tar.gz.tmp" "$OUT_DIR.tar.gz"
  echo "gpu-bundle: $OUT_DIR.tar.gz: $(du -m "$OUT_DIR.tar.gz" | cut -f1) MiB"
fi
echo "gpu-bundle: $OUT_DIR: $(awk "BEGIN {printf \"%.1f\", $bytes / 1048576}") MiB, plugins: ${plugins[*]:-none}; CUDA $cuda_version needs: $(sed -n 's/^cuda-needs: //p' "$OUT_DIR/MANIFEST")"
