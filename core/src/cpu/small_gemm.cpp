#include "cpu/small_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace phalanx::cpu {

namespace {

constexpr int kRows = 4;   // rows of C computed together (each B row is loaded once for 4)
constexpr int kCols = 16;  // columns per block: one AVX-512 vector, two AVX2, four SSE
typedef float v16 __attribute__((vector_size(64)));

// acc[r] = sum_p A'(r, p) * B'[p, 0:16] for a 4 x 16 block. B' is row-major with 16 readable
// columns (ldb). A' comes either as four row pointers (A not transposed: A'(r, p) = row_r[p])
// or, when A is transposed, as a column-major base (A'(r, p) = a[p * lda + r]). Four vector
// accumulators stay in registers; the clone for the running CPU is picked at load time.
__attribute__((target_clones("avx512f", "avx2", "default")))
void block_rows(const float* r0, const float* r1, const float* r2, const float* r3, const float* __restrict B,
                std::int64_t ldb, std::int64_t k, v16* out) {
  v16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (std::int64_t p = 0; p < k; ++p) {
    v16 b;
    std::memcpy(&b, B + p * ldb, sizeof b);
    a0 += r0[p] * b;
    a1 += r1[p] * b;
    a2 += r2[p] * b;
    a3 += r3[p] * b;
  }
  out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
}

__attribute__((target_clones("avx512f", "avx2", "default")))
void block_cols(const float* __restrict a, std::int64_t lda, const float* __restrict B, std::int64_t ldb,
                std::int64_t k, v16* out) {
  v16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (std::int64_t p = 0; p < k; ++p) {
    v16 b;
    std::memcpy(&b, B + p * ldb, sizeof b);
    const float* col = a + p * lda;
    a0 += col[0] * b;
    a1 += col[1] * b;
    a2 += col[2] * b;
    a3 += col[3] * b;
  }
  out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
}

}  // namespace

void small_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const std::int64_t n16 = (n + kCols - 1) / kCols * kCols;
  thread_local std::vector<float> bbuf, abuf, zero;
  // op(B) as row-major [k, n16]: used in place when it already is one, else packed once
  // (transposed and/or zero-padded to whole blocks).
  const float* B = b;
  std::int64_t lB = ldb;
  if (tb || n != n16) {
    bbuf.resize(static_cast<std::size_t>(k * n16));
    for (std::int64_t p = 0; p < k; ++p) {
      float* row = bbuf.data() + p * n16;
      for (std::int64_t j = 0; j < n; ++j) row[j] = tb ? b[j * ldb + p] : b[p * ldb + j];
      for (std::int64_t j = n; j < n16; ++j) row[j] = 0.f;
    }
    B = bbuf.data();
    lB = n16;
  }
  if (zero.size() < static_cast<std::size_t>(k)) zero.assign(static_cast<std::size_t>(k), 0.f);
  v16 acc[kRows];
  for (std::int64_t i = 0; i < m; i += kRows) {
    const std::int64_t rows = std::min<std::int64_t>(kRows, m - i);
    // A transposed with a partial last block: pack those columns (4 x k, zero-padded)
    const float* acol = a + i;
    std::int64_t lcol = lda;
    if (ta && rows < kRows) {
      abuf.assign(static_cast<std::size_t>(k * kRows), 0.f);
      for (std::int64_t p = 0; p < k; ++p)
        for (std::int64_t r = 0; r < rows; ++r) abuf[p * kRows + r] = a[p * lda + i + r];
      acol = abuf.data();
      lcol = kRows;
    }
    const float* rowp[kRows];
    if (!ta)
      for (int r = 0; r < kRows; ++r) rowp[r] = r < rows ? a + (i + r) * lda : zero.data();
    for (std::int64_t j = 0; j < n16; j += kCols) {
      if (ta)
        block_cols(acol, lcol, B + j, lB, k, acc);
      else
        block_rows(rowp[0], rowp[1], rowp[2], rowp[3], B + j, lB, k, acc);
      const std::int64_t cols = std::min<std::int64_t>(kCols, n - j);
      for (std::int64_t r = 0; r < rows; ++r) {
        float* crow = c + (i + r) * ldc + j;
        for (std::int64_t q = 0; q < cols; ++q) crow[q] = alpha * acc[r][q] + (beta == 0.f ? 0.f : beta * crow[q]);
      }
    }
  }
}

}  // namespace phalanx::cpu
