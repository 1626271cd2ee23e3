// Exact mode's kernels (docs/exact.md): per-parameter maxima and fixed-point sums in int64.
// Integer addition is associative, so a sum of fixed-point values is the same bits in any
// order and on any number of workers; only the float -> fixed conversion rounds, and it
// rounds each value by itself.
#include <cmath>

#include "cpu/cpu_kernels.hpp"

namespace phalanx {

void CpuKernels::abs_max_into(const Tensor& x, Tensor& out, std::int64_t index) {
  const float* v = x.data<float>();
  float* slot = out.data<float>() + index;
  const std::int64_t n = x.numel();
  float m = *slot;
  bool nan = std::isnan(m);
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    m = a > m ? a : m;
    nan |= a != a;
  }
  *slot = nan ? std::nanf("") : m;
}

void CpuKernels::fixed_point_accumulate(const Tensor& x, double scale, Tensor& acc) {
  const float* __restrict v = x.data<float>();
  std::int64_t* __restrict a = acc.data<std::int64_t>();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i) a[i] += std::llrint(static_cast<double>(v[i]) * scale);
}

void CpuKernels::fixed_point_to_float(const Tensor& acc, double scale, double count, Tensor& out) {
  const std::int64_t* __restrict a = acc.data<std::int64_t>();
  float* __restrict o = out.data<float>();
  const std::int64_t n = out.numel();
  for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>((static_cast<double>(a[i]) / scale) / count);
}

}  // namespace phalanx
