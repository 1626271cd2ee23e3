#include "phalanx/core/threads.hpp"

#include <cblas.h>

#include "cpu/small_gemm.hpp"
#include "phalanx/core/error.hpp"

namespace phalanx {

void set_num_threads(int n) {
  if (n < 1) throw ValueError(detail::concat("set_num_threads: need at least 1, got ", n));
  openblas_set_num_threads(n);
}

int get_num_threads() { return openblas_get_num_threads(); }

std::string blas_info() {
  return std::string(openblas_get_config()) + " (core: " + openblas_get_corename() + "); GEMM: " + cpu::gemm_policy();
}

}  // namespace phalanx
