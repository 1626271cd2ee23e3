// Fused optimizer updates (docs/optim.md). Each follows PyTorch 1.13's single-tensor code path
// operation by operation (same float rounding order per element), in one pass over each
// parameter: every array is read once and the updated ones written once.
//
// The per-element arithmetic is one template per optimizer whose flags (weight decay,
// momentum, the first momentum step, Nesterov; L2 or decoupled decay, amsgrad) are template
// parameters, so each inner loop is branch-free and the compiler vectorises it. Each
// specialisation is compiled three times, for AVX-512F, AVX2 and baseline x86-64 (SSE2), and
// the best the CPU has is picked at run time (as the fixed-point kernels do); vectorising
// across elements keeps every element's operations and their order, and this file is built
// with -ffp-contract=off (no FMA contraction: the scalar code rounds after each multiply, as
// PyTorch's for-loop kernels and today's results do) and -fno-math-errno (sqrt needs no errno
// test, so it vectorises; sqrtps is correctly rounded like sqrtss). PHALANX_OPTIM_SIMD=scalar,
// avx2 or avx512 caps the choice, anything else is a ConfigError (read at each group update:
// tests/optim/test_optim_kernels.cpp compares the three bit for bit).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cpu/cpu_kernels.hpp"
#include "cpu/simd_level.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_OPTIM_X86 1
#define PHALANX_TARGET(t) __attribute__((target(t)))
#else
#define PHALANX_TARGET(t)
#endif

namespace phalanx {

namespace {

#define PHALANX_INLINE inline __attribute__((always_inline))

// ---- SGD ----

struct SgdScalars {
  float neg_lr, momentum, damp, weight_decay;
};

/// One parameter's SGD step; kWd: weight decay != 0, kMom: momentum != 0, kFirst: the buffer
/// starts as the gradient (first step), kNest: Nesterov. Today's scalar loop, the flags hoisted.
template <bool kWd, bool kMom, bool kFirst, bool kNest>
PHALANX_INLINE void sgd_body(float* __restrict p, const float* __restrict g, float* __restrict b, std::int64_t n,
                             const SgdScalars s) {
  for (std::int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if constexpr (kWd) d = d + s.weight_decay * p[i];  // d_p.add(p, alpha=wd)
    if constexpr (kMom) {
      float bi;
      if constexpr (kFirst)
        bi = d;  // buf = clone(d_p)
      else
        bi = b[i] * s.momentum + s.damp * d;  // buf.mul_(m).add_(d_p, alpha=1-dampening)
      b[i] = bi;
      if constexpr (kNest)
        d = d + s.momentum * bi;  // d_p.add(buf, alpha=m)
      else
        d = bi;
    }
    p[i] = p[i] + s.neg_lr * d;  // p.add_(d_p, alpha=-lr)
  }
}

using SgdFn = void (*)(float*, const float*, float*, std::int64_t, SgdScalars);

// Flag index: bit 0 weight decay, 1 momentum, 2 first step, 3 Nesterov.
#define PHALANX_SGD_LEVEL(fn, target)                                                                     \
  template <int kFlags>                                                                                 \
  target void fn(float* __restrict p, const float* __restrict g, float* __restrict b, std::int64_t n,    \
                 SgdScalars s) {                                                                        \
    sgd_body<(kFlags & 1) != 0, (kFlags & 2) != 0, (kFlags & 4) != 0, (kFlags & 8) != 0>(p, g, b, n, s); \
  }
PHALANX_SGD_LEVEL(sgd_scalar, )
#ifdef PHALANX_OPTIM_X86
PHALANX_SGD_LEVEL(sgd_avx2, PHALANX_TARGET("avx2"))
PHALANX_SGD_LEVEL(sgd_avx512, PHALANX_TARGET("avx512f"))
#endif

// ---- Adam / AdamW ----

struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, decay_factor, neg_step,
      bias_correction2_sqrt;
};

/// One parameter's Adam step; kDecay: 0 none, 1 L2 (Adam: grad + wd * p), 2 decoupled
/// (AdamW: p * (1 - lr * wd)); kAms: amsgrad.
template <int kDecay, bool kAms>
PHALANX_INLINE void adam_body(float* __restrict p, const float* __restrict g, float* __restrict m,
                              float* __restrict v, float* __restrict vmax, std::int64_t n, const AdamScalars s) {
  for (std::int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    float pi = p[i];
    if constexpr (kDecay == 2) pi = pi * s.decay_factor;           // param.mul_(1 - lr * wd)
    if constexpr (kDecay == 1) gi = gi + s.weight_decay * pi;     // grad.add(param, alpha=wd)
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;      // mul_(b1).add_(g, alpha=1-b1)
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi; // mul_(b2).addcmul_(g, g, value=1-b2)
    m[i] = mi;
    v[i] = vi;
    float second = vi;
    if constexpr (kAms) {
      const float x = vmax[i];
      second = x < vi ? vi : x;  // std::max(max, v): torch.maximum(max, v, out=max)
      vmax[i] = second;
    }
    const float denom = std::sqrt(second) / s.bias_correction2_sqrt + s.eps;
    p[i] = pi + s.neg_step * mi / denom;  // addcdiv_(m, denom, value=-step)
  }
}

using AdamFn = void (*)(float*, const float*, float*, float*, float*, std::int64_t, AdamScalars);

// Flag index: decay mode * 2 + amsgrad.
#define PHALANX_ADAM_LEVEL(fn, target)                                                                   \
  template <int kFlags>                                                                                \
  target void fn(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, \
                 float* __restrict vmax, std::int64_t n, AdamScalars s) {                              \
    adam_body<kFlags / 2, (kFlags & 1) != 0>(p, g, m, v, vmax, n, s);                                   \
  }
PHALANX_ADAM_LEVEL(adam_scalar, )
#ifdef PHALANX_OPTIM_X86
PHALANX_ADAM_LEVEL(adam_avx2, PHALANX_TARGET("avx2"))
PHALANX_ADAM_LEVEL(adam_avx512, PHALANX_TARGET("avx512f"))
#endif

// ---- dispatch ----

template <std::size_t... I>
constexpr std::array<SgdFn, sizeof...(I)> sgd_table(int level, std::index_sequence<I...>) {
#ifdef PHALANX_OPTIM_X86
  if (level == 2) return {{&sgd_avx512<static_cast<int>(I)>...}};
  if (level == 1) return {{&sgd_avx2<static_cast<int>(I)>...}};
#endif
  return {{&sgd_scalar<static_cast<int>(I)>...}};
}

template <std::size_t... I>
constexpr std::array<AdamFn, sizeof...(I)> adam_table(int level, std::index_sequence<I...>) {
#ifdef PHALANX_OPTIM_X86
  if (level == 2) return {{&adam_avx512<static_cast<int>(I)>...}};
  if (level == 1) return {{&adam_avx2<static_cast<int>(I)>...}};
#endif
  return {{&adam_scalar<static_cast<int>(I)>...}};
}

/// 2: AVX-512F, 1: AVX2, 0: baseline, capped by PHALANX_OPTIM_SIMD (once per group and step).
int simd_level() { return cpu::simd_level("PHALANX_OPTIM_SIMD"); }

SgdFn sgd_kernel(int level, bool wd, bool momentum, bool first, bool nesterov) {
  static const std::array<SgdFn, 16> t[3] = {sgd_table(0, std::make_index_sequence<16>{}),
                                             sgd_table(1, std::make_index_sequence<16>{}),
                                             sgd_table(2, std::make_index_sequence<16>{})};
  // Without momentum the buffer flags do not apply (index 0 or 1).
  const int flags = wd | (momentum ? 2 | first << 2 | nesterov << 3 : 0);
  return t[level][flags];
}

AdamFn adam_kernel(int level, const AdamUpdate& u) {
  static const std::array<AdamFn, 6> t[3] = {adam_table(0, std::make_index_sequence<6>{}),
                                            adam_table(1, std::make_index_sequence<6>{}),
                                            adam_table(2, std::make_index_sequence<6>{})};
  const int decay = u.weight_decay == 0.f ? 0 : u.decoupled ? 2 : 1;
  return t[level][decay * 2 + (u.amsgrad ? 1 : 0)];
}

SgdScalars sgd_scalars(const SgdUpdate& u) { return {-u.lr, u.momentum, 1.f - u.dampening, u.weight_decay}; }

AdamScalars adam_scalars(const AdamUpdate& u) {
  return {u.beta1, u.beta2, u.one_minus_beta1, u.one_minus_beta2, u.eps, u.weight_decay, u.decay_factor,
          -u.step_size, u.bias_correction2_sqrt};
}

void sgd_one(int level, Tensor& param, const Tensor& grad, Tensor& buf, const SgdUpdate& u, bool first) {
  const bool momentum = u.momentum != 0.f;
  sgd_kernel(level, u.weight_decay != 0.f, momentum, first, u.nesterov)(
      param.data<float>(), grad.data<float>(), momentum ? buf.data<float>() : nullptr, param.numel(), sgd_scalars(u));
}

void adam_one(int level, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax, const AdamUpdate& u) {
  adam_kernel(level, u)(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                        u.amsgrad ? vmax.data<float>() : nullptr, param.numel(), adam_scalars(u));
}

}  // namespace

void CpuKernels::sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdUpdate& u) {
  sgd_one(simd_level(), param, grad, buf, u, u.first_step);
}

void CpuKernels::adam_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                             Tensor& max_exp_avg_sq, const AdamUpdate& u) {
  adam_one(simd_level(), param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, u);
}

void CpuKernels::sgd_update_group(const std::vector<SgdGroupEntry>& params, const SgdUpdate& u) {
  const int level = simd_level();
  for (const SgdGroupEntry& e : params) sgd_one(level, *e.param, *e.grad, *e.momentum_buffer, u, e.first_step);
}

void CpuKernels::adam_update_group(const std::vector<AdamGroupEntry>& params) {
  const int level = simd_level();
  for (const AdamGroupEntry& e : params)
    adam_one(level, *e.param, *e.grad, *e.exp_avg, *e.exp_avg_sq, *e.max_exp_avg_sq, e.u);
}

}  // namespace phalanx
