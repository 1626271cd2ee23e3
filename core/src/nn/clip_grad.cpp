#include "phalanx/core/nn/clip_grad.hpp"

#include <cmath>
#include <limits>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/ops.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx::nn {

namespace {
std::vector<Tensor> grads_of(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> gs;
  for (const Tensor& p : params) {
    if (!p.defined()) throw ValueError(detail::concat(op, ": a parameter is undefined"));
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.dtype() != DType::Float32)
      throw TypeError(detail::concat(op, ": gradients must be float32, got ", g.str()));
    gs.push_back(g);
  }
  return gs;
}
}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  timeline::Span span("clip grad norm", "optim");
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  if (!inf && !(norm_type > 0))
    throw ValueError(detail::concat("clip_grad_norm_: norm_type must be > 0 or infinity, got ", norm_type));
  std::vector<Tensor> gs = grads_of(params, "clip_grad_norm_");
  if (gs.empty()) return 0.0;
  NoGradGuard ng;
  const Device dev = gs[0].device();
  double total = 0;
  if (inf) {
    Tensor m = zeros({1}, DType::Float32, dev);  // the largest |g| over every tensor, on the device
    for (const Tensor& g : gs) kernels_for(dev).abs_max_into(g.device() == dev ? g : g.to(dev), m, 0);
    total = m.item();
  } else {
    // Per-tensor norm^p summed on the device; one read at the end.
    Tensor acc;
    for (const Tensor& g0 : gs) {
      const Tensor g = g0.device() == dev ? g0 : g0.to(dev);
      Tensor part;
      if (norm_type == 2.0)
        part = sum(mul(g, g));
      else if (norm_type == 1.0)
        part = sum(add(relu(g), relu(neg(g))));
      else
        part = sum(exp(mul(log(add(relu(g), relu(neg(g)))), static_cast<float>(norm_type))));
      acc = acc.defined() ? add(acc, part) : part;
    }
    const double s = acc.item();
    total = norm_type == 2.0 ? std::sqrt(s) : norm_type == 1.0 ? s : std::pow(s, 1.0 / norm_type);
  }
  if (error_if_nonfinite && !std::isfinite(total))
    throw ValueError(detail::concat("clip_grad_norm_: the total norm of order ", norm_type, " of the gradients is ",
                                    total, "; find the non-finite gradient, or pass error_if_nonfinite=false"));
  const double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1.0))  // PyTorch multiplies by min(coef, 1); a NaN total spreads, as there
    for (const Tensor& g : gs) Tensor(g).mul_(static_cast<float>(coef));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  timeline::Span span("clip grad value", "optim");
  if (!(clip_value >= 0))
    throw ValueError(detail::concat("clip_grad_value_: clip_value must be >= 0, got ", clip_value));
  const float v = static_cast<float>(clip_value);
  for (const Tensor& g0 : grads_of(params, "clip_grad_value_")) {
    Tensor g = g0;
    kernels_for(g.device()).clamp(g, -v, v, g);
  }
}

}  // namespace phalanx::nn
