#pragma once
// Finite-difference gradient check. L = sum(f(inputs) * R) for a fixed random R; the analytic
// gradient comes from backward(R), the numeric one from central differences in float32 with
// L accumulated in double.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <vector>

#include <phalanx/phalanx.hpp>

namespace phalanx::test {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

inline double weighted_sum(const Tensor& y, const std::vector<float>& r) {
  const auto v = y.to_vector<float>();
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * r[i];
  return s;
}

inline void gradcheck(const Fn& f, std::vector<Tensor> inputs, float eps = 3e-3f,
                      double atol = 2e-3, double rtol = 2e-2) {
  for (auto& t : inputs)
    if (t.dtype() == DType::Float32) t.requires_grad_(true);
  Tensor y = f(inputs);
  Generator g(1234);
  std::vector<float> r(static_cast<std::size_t>(y.numel()));
  for (auto& v : r) v = g.normal();
  y.backward(tensor(r, y.shape()));
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (x.dtype() != DType::Float32) continue;
    REQUIRE_MESSAGE(x.grad().defined(), "no gradient for input " << k);
    const auto analytic = x.grad().to_vector<float>();
    float* p = x.data<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const float saved = p[i];
      double lp, lm;
      {
        NoGradGuard ng;
        p[i] = saved + eps;
        lp = weighted_sum(f(inputs), r);
        p[i] = saved - eps;
        lm = weighted_sum(f(inputs), r);
      }
      p[i] = saved;
      const double numeric = (lp - lm) / (2.0 * eps);
      const double a = analytic[i];
      INFO("input " << k << " element " << i << ": analytic " << a << " numeric " << numeric);
      CHECK(std::abs(a - numeric) <= atol + rtol * std::abs(numeric));
    }
  }
}

/// Values in [lo, hi) with |v| >= gap (keeps relu and friends away from their kink).
inline Tensor away_from_zero(const Shape& s, std::uint64_t seed, float gap = 0.1f) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    float v = g.normal();
    if (std::abs(v) < gap) v = v < 0 ? v - gap : v + gap;
    p[i] = v;
  }
  return t;
}

/// Relative error of `a` against the reference `b`: max |a - b| / max |b| (the scale of the
/// tensor, so that elements near zero are judged by the tensor's magnitude, not their own).
inline double max_rel_err(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  double worst = 0, scale = 1e-30;
  for (std::size_t i = 0; i < va.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(va[i]) - vb[i]));
    scale = std::max(scale, std::abs(static_cast<double>(vb[i])));
  }
  return worst / scale;
}

}  // namespace phalanx::test
