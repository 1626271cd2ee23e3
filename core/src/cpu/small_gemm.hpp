#pragma once
// GEMM for tiny shapes (the textbook's 64-32-10 MLP): OpenBLAS's per-call overhead (packing,
// dispatch) dominates there, so products of at most kSmallGemmMacs multiply-adds use this
// register-blocked kernel instead. Larger ones go to CBLAS.
#include <cstdint>

namespace phalanx::cpu {

constexpr std::int64_t kSmallGemmMacs = 1 << 18;

/// Row-major C = alpha * op(A) op(B) + beta * C (CBLAS semantics).
void small_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc);

}  // namespace phalanx::cpu
