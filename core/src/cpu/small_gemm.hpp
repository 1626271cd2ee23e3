#pragma once
// Phalanx's own GEMM: 4 x 16 register blocks (AVX-512 / AVX2 / SSE clones chosen at load
// time) over packed 16-column slabs of B. Used (see gemm_policy()):
//  - for tiny products (at most kSmallGemmMacs multiply-adds, the textbook's 64-32-10 MLP),
//    where OpenBLAS's per-call overhead dominates;
//  - for every size when OpenBLAS fell back to a generic pre-AVX core on a CPU it does not
//    know (OpenBLAS 0.3.21 picks "Prescott" on Sapphire Rapids) while the CPU has AVX2, and
//    OpenBLAS runs single-threaded (as every data-parallel worker does): then this kernel is
//    2-2.5x faster than OpenBLAS.
// PHALANX_GEMM=blas|own|auto overrides the choice (auto, or unset/empty, is the default; any
// other value is a ConfigError at the first large product or blas_info()).
#include <cstdint>

namespace phalanx::cpu {

constexpr std::int64_t kSmallGemmMacs = 1 << 18;

/// Whether large products also use small_gemm (decided once, see above).
bool own_gemm_for_all_sizes();
/// One line for logs: "own kernel (OpenBLAS core Prescott is generic)" or "OpenBLAS".
const char* gemm_policy();

/// Row-major C = alpha * op(A) op(B) + beta * C (CBLAS semantics).
void small_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc);

}  // namespace phalanx::cpu
