// Fused optimizer updates. Each follows PyTorch 1.13's single-tensor code path operation by
// operation (same float rounding order), in one pass over the parameter.
#include <algorithm>
#include <cmath>

#include "cpu/cpu_kernels.hpp"

namespace phalanx {

void CpuKernels::sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdUpdate& u) {
  float* __restrict p = param.data<float>();
  const float* __restrict g = grad.data<float>();
  float* __restrict b = u.momentum != 0.f ? buf.data<float>() : nullptr;
  const std::int64_t n = param.numel();
  const float neg_lr = -u.lr, damp = 1.f - u.dampening;
  for (std::int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (u.weight_decay != 0.f) d = d + u.weight_decay * p[i];  // d_p.add(p, alpha=wd)
    if (b) {
      if (u.first_step)
        b[i] = d;  // buf = clone(d_p)
      else
        b[i] = b[i] * u.momentum + damp * d;  // buf.mul_(m).add_(d_p, alpha=1-dampening)
      d = u.nesterov ? d + u.momentum * b[i] : b[i];
    }
    p[i] = p[i] + neg_lr * d;  // p.add_(d_p, alpha=-lr)
  }
}

void CpuKernels::adam_update(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                             Tensor& exp_avg_sq, Tensor& max_exp_avg_sq, const AdamUpdate& u) {
  float* __restrict p = param.data<float>();
  const float* __restrict g = grad.data<float>();
  float* __restrict m = exp_avg.data<float>();
  float* __restrict v = exp_avg_sq.data<float>();
  float* __restrict vmax = u.amsgrad ? max_exp_avg_sq.data<float>() : nullptr;
  const std::int64_t n = param.numel();
  const float neg_step = -u.step_size;
  for (std::int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (u.decoupled) {
      if (u.weight_decay != 0.f) p[i] = p[i] * u.decay_factor;  // param.mul_(1 - lr * wd)
    } else if (u.weight_decay != 0.f) {
      gi = gi + u.weight_decay * p[i];  // grad.add(param, alpha=wd)
    }
    m[i] = m[i] * u.beta1 + u.one_minus_beta1 * gi;         // mul_(b1).add_(g, alpha=1-b1)
    v[i] = v[i] * u.beta2 + u.one_minus_beta2 * gi * gi;    // mul_(b2).addcmul_(g, g, value=1-b2)
    float second = v[i];
    if (vmax) {
      vmax[i] = std::max(vmax[i], v[i]);                    // torch.maximum(max, v, out=max)
      second = vmax[i];
    }
    const float denom = std::sqrt(second) / u.bias_correction2_sqrt + u.eps;
    p[i] = p[i] + neg_step * m[i] / denom;                 // addcdiv_(m, denom, value=-step)
  }
}

}  // namespace phalanx
