#pragma once
#include <string>

namespace phalanx {

/// Threads used by CPU kernels (OpenBLAS GEMM). Launchers set OPENBLAS_NUM_THREADS=1 per
/// worker; this is the programmatic equivalent.
void set_num_threads(int n);
int get_num_threads();
/// The BLAS build and the CPU kernel it chose, e.g. "OpenBLAS 0.3.21 ... (core: SkylakeX)".
/// Benchmarks print it: an old OpenBLAS can fall back to a generic kernel on a CPU it does
/// not know (OPENBLAS_CORETYPE overrides the choice at process start).
std::string blas_info();

}  // namespace phalanx
