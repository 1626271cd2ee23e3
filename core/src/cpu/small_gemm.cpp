#include "cpu/small_gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <cstring>
#include <vector>

#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"

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

namespace {
struct Policy {
  bool own_for_all = false;
  const char* text = "tiny products: own kernel; others: OpenBLAS";
};
Policy decide() {
  Policy p;
  const std::string mode = env::choice("PHALANX_GEMM", "auto", {"auto", "blas", "own"});
  if (mode == "own") {
    p.own_for_all = true;
    p.text = "own kernel for every size (PHALANX_GEMM=own)";
  } else if (mode == "blas") {
    p.text = "tiny products: own kernel; others: OpenBLAS (PHALANX_GEMM=blas)";
  } else {
    const std::string core = openblas_get_corename();
    static const char* generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                    "Katmai", "Coppermine", "Northwood", "Banias", "generic"};
    bool is_generic = false;
    for (const char* g : generic) is_generic = is_generic || core == g;
    if (is_generic && __builtin_cpu_supports("avx2")) {
      p.own_for_all = true;
      p.text = "own kernel for every size (OpenBLAS fell back to its generic pre-AVX core on this AVX2 CPU)";
    }
  }
  return p;
}
// Read once, at the first large product or blas_info(); a bad value throws there (and again
// at the next call: the static is only set by a decide() that returned).
const Policy& policy() {
  static const Policy p = decide();
  return p;
}
}  // namespace

bool own_gemm_for_all_sizes() { return policy().own_for_all; }
const char* gemm_policy() { return policy().text; }

void small_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  // Column slabs of op(B) outer, row blocks of op(A) inner. Each 16-column slab of op(B) is
  // packed into a contiguous k x 16 buffer (transposed and zero-padded as needed): rows of B
  // lie a whole row apart, and reading them in place maps them all to the same cache set.
  // A transposed A is packed once into 4-column panels; a plain A is read in place (four
  // contiguous row streams).
  thread_local std::vector<float> slab, apack, zero;
  slab.resize(static_cast<std::size_t>(k * kCols));
  if (zero.size() < static_cast<std::size_t>(k)) zero.assign(static_cast<std::size_t>(k), 0.f);
  const std::int64_t m4 = (m + kRows - 1) / kRows * kRows;
  if (ta) {  // once: 4-column panels of op(A), each k x 4 contiguous
    apack.resize(static_cast<std::size_t>(m4 * k));
    for (std::int64_t i = 0; i < m4; i += kRows)
      for (std::int64_t p = 0; p < k; ++p) {
        float* dst = apack.data() + i * k + p * kRows;
        for (std::int64_t r = 0; r < kRows; ++r) dst[r] = i + r < m ? a[p * lda + i + r] : 0.f;
      }
  }
  v16 acc[kRows];
  for (std::int64_t j = 0; j < n; j += kCols) {
    const std::int64_t cols = std::min<std::int64_t>(kCols, n - j);
    for (std::int64_t p = 0; p < k; ++p) {
      float* dst = slab.data() + p * kCols;
      for (std::int64_t q = 0; q < cols; ++q) dst[q] = tb ? b[(j + q) * ldb + p] : b[p * ldb + j + q];
      for (std::int64_t q = cols; q < kCols; ++q) dst[q] = 0.f;
    }
    for (std::int64_t i = 0; i < m; i += kRows) {
      const std::int64_t rows = std::min<std::int64_t>(kRows, m - i);
      if (ta) {
        block_cols(apack.data() + i * k, kRows, slab.data(), kCols, k, acc);
      } else {
        const float* rowp[kRows];
        for (int r = 0; r < kRows; ++r) rowp[r] = r < rows ? a + (i + r) * lda : zero.data();
        block_rows(rowp[0], rowp[1], rowp[2], rowp[3], slab.data(), kCols, k, acc);
      }
      for (std::int64_t r = 0; r < rows; ++r) {
        float* crow = c + (i + r) * ldc + j;
        for (std::int64_t q = 0; q < cols; ++q) crow[q] = alpha * acc[r][q] + (beta == 0.f ? 0.f : beta * crow[q]);
      }
    }
  }
}

}  // namespace phalanx::cpu
