// The CPU's vectorised optimizer kernels (core/src/cpu/cpu_optim_kernels.cpp) against the
// scalar loops they replaced (copied below as the reference), bit for bit: every flag
// combination of SGD (weight decay, momentum, first step, dampening, Nesterov) and Adam
// (none / L2 / decoupled decay, amsgrad), lengths with every tail, on each instruction set
// (PHALANX_OPTIM_SIMD=scalar caps dispatch to the baseline build, avx2 to AVX2, unset: the best
// this CPU has), through the per-tensor and the group entries of the table, and whole
// optimizers on each path.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <phalanx/core/kernels.hpp>

#include "support/optim_cases.hpp"

using namespace phalanx;

namespace {

// ---- the reference: the kernels as they were before vectorisation (commit 698b841) ----
void ref_sgd(float* p, const float* g, float* b, std::int64_t n, const SgdUpdate& u) {
  const float neg_lr = -u.lr, damp = 1.f - u.dampening;
  for (std::int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (u.weight_decay != 0.f) d = d + u.weight_decay * p[i];
    if (u.momentum != 0.f) {
      if (u.first_step)
        b[i] = d;
      else
        b[i] = b[i] * u.momentum + damp * d;
      d = u.nesterov ? d + u.momentum * b[i] : b[i];
    }
    p[i] = p[i] + neg_lr * d;
  }
}

void ref_adam(float* p, const float* g, float* m, float* v, float* vmax, std::int64_t n, const AdamUpdate& u) {
  const float neg_step = -u.step_size;
  for (std::int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (u.decoupled) {
      if (u.weight_decay != 0.f) p[i] = p[i] * u.decay_factor;
    } else if (u.weight_decay != 0.f) {
      gi = gi + u.weight_decay * p[i];
    }
    m[i] = m[i] * u.beta1 + u.one_minus_beta1 * gi;
    v[i] = v[i] * u.beta2 + u.one_minus_beta2 * gi * gi;
    float second = v[i];
    if (u.amsgrad) {
      vmax[i] = std::max(vmax[i], v[i]);
      second = vmax[i];
    }
    const float denom = std::sqrt(second) / u.bias_correction2_sqrt + u.eps;
    p[i] = p[i] + neg_step * m[i] / denom;
  }
}
// ---- end of the reference ----

/// Sets PHALANX_OPTIM_SIMD for one scope ("" = unset: the best path).
struct SimdCap {
  explicit SimdCap(const char* level) {
    if (*level) ::setenv("PHALANX_OPTIM_SIMD", level, 1);
    else ::unsetenv("PHALANX_OPTIM_SIMD");
  }
  ~SimdCap() { ::unsetenv("PHALANX_OPTIM_SIMD"); }
};
const char* const kLevels[] = {"scalar", "avx2", ""};

/// Values of every kind: normal of several magnitudes and both signs, zeros of both signs,
/// subnormals, and (where `specials`) infinities and a NaN.
std::vector<float> values(std::uint64_t seed, std::int64_t n, bool specials, bool non_negative = false) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const int kind = static_cast<int>(s % 64);
    const float u = static_cast<float>((s >> 11) % 1000003) / 1000003.f - 0.5f;
    const float mag = std::ldexp(1.f, static_cast<int>((s >> 40) % 24) - 16);
    x = u * mag;
    if (kind == 0) x = 0.f;
    if (kind == 1) x = -0.f;
    if (kind == 2) x = std::numeric_limits<float>::denorm_min() * static_cast<float>(s % 1000);
    if (specials && kind == 3) x = std::numeric_limits<float>::infinity();
    if (specials && kind == 4) x = -std::numeric_limits<float>::infinity();
    if (specials && kind == 5) x = std::numeric_limits<float>::quiet_NaN();
    if (non_negative) x = std::fabs(x);
  }
  return v;
}

Tensor from(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

/// The same bits (two NaNs of any payload count as equal: x86 quiets a NaN operand the same
/// way in scalar and vector code, but an operation of two NaNs keeps the first operand's).
bool same_bits(const Tensor& t, const std::vector<float>& want) {
  const float* got = t.data<float>();
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) return false;
  }
  return true;
}

const std::int64_t kLengths[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 127, 1000, 1031};

std::vector<SgdUpdate> sgd_settings() {
  std::vector<SgdUpdate> out;
  for (const float wd : {0.f, 1e-2f})
    for (const float mom : {0.f, 0.9f})
      for (const bool first : {false, true})
        for (const float damp : {0.f, 0.1f})
          for (const bool nest : {false, true}) {
            if (mom == 0.f && (first || damp != 0.f || nest)) continue;  // flags that need momentum
            if (nest && damp != 0.f) continue;                          // the optimizer refuses it
            out.push_back(SgdUpdate{0.05f, mom, damp, wd, nest, first});
          }
  return out;
}

std::vector<AdamUpdate> adam_settings() {
  std::vector<AdamUpdate> out;
  for (const bool decoupled : {false, true})
    for (const float wd : {0.f, 0.1f})
      for (const bool ams : {false, true})
        for (const int t : {1, 7}) {
          AdamUpdate u{};
          const double lr = 1e-2, b1 = 0.9, b2 = 0.999;
          u.lr = static_cast<float>(lr);
          u.beta1 = static_cast<float>(b1);
          u.beta2 = static_cast<float>(b2);
          u.eps = 1e-8f;
          u.weight_decay = wd;
          u.decoupled = decoupled;
          u.amsgrad = ams;
          u.one_minus_beta1 = static_cast<float>(1.0 - b1);
          u.one_minus_beta2 = static_cast<float>(1.0 - b2);
          u.step_size = static_cast<float>(lr / (1.0 - std::pow(b1, t)));
          u.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, t)));
          u.decay_factor = static_cast<float>(1.0 - lr * wd);
          out.push_back(u);
        }
  return out;
}

std::string sgd_name(const SgdUpdate& u) {
  return "wd=" + std::to_string(u.weight_decay) + " momentum=" + std::to_string(u.momentum) +
         " dampening=" + std::to_string(u.dampening) + " first=" + std::to_string(u.first_step) +
         " nesterov=" + std::to_string(u.nesterov);
}
std::string adam_name(const AdamUpdate& u) {
  return std::string(u.decoupled ? "AdamW" : "Adam") + " wd=" + std::to_string(u.weight_decay) +
         " amsgrad=" + std::to_string(u.amsgrad) + " step_size=" + std::to_string(u.step_size);
}

}  // namespace

TEST_CASE("SGD kernels: every flag combination, every tail, every instruction set equals the scalar loop bit for bit") {
  DeviceKernels& k = kernels_for(Device::cpu());
  int checked = 0;
  for (const char* level : kLevels) {
    const SimdCap cap(level);
    for (const bool specials : {false, true})
      for (const SgdUpdate& u : sgd_settings())
        for (const std::int64_t n : kLengths) {
          CAPTURE(std::string(*level ? level : "best"));
          CAPTURE(sgd_name(u));
          CAPTURE(n);
          CAPTURE(specials);
          const auto p0 = values(1 + n, n, specials), g0 = values(2 + n, n, specials), b0 = values(3 + n, n, specials);
          auto p = p0, b = b0;
          ref_sgd(p.data(), g0.data(), b.data(), n, u);
          // The per-tensor entry.
          Tensor tp = from(p0), tg = from(g0), tb = u.momentum != 0.f ? from(b0) : Tensor();
          k.sgd_update(tp, tg, tb, u);
          CHECK(same_bits(tp, p));
          if (u.momentum != 0.f) CHECK(same_bits(tb, b));
          // The group entry: the same parameter three times over different arrays, each
          // with its own first-step flag (the group's u.first_step is ignored).
          std::vector<Tensor> ps, gs, bs;
          std::vector<SgdGroupEntry> entries;
          for (int j = 0; j < 3; ++j) {
            ps.push_back(from(p0));
            gs.push_back(from(g0));
            bs.push_back(u.momentum != 0.f ? from(b0) : Tensor());
          }
          SgdUpdate group_u = u;
          group_u.first_step = !u.first_step;
          for (int j = 0; j < 3; ++j) entries.push_back({&ps[j], &gs[j], &bs[j], u.first_step});
          k.sgd_update_group(entries, group_u);
          for (int j = 0; j < 3; ++j) {
            CHECK(same_bits(ps[j], p));
            if (u.momentum != 0.f) CHECK(same_bits(bs[j], b));
          }
          ++checked;
        }
  }
  CHECK(checked > 500);
}

TEST_CASE("Adam kernels: L2 / decoupled decay and amsgrad, every tail, every instruction set equal the scalar loop bit for bit") {
  DeviceKernels& k = kernels_for(Device::cpu());
  for (const char* level : kLevels) {
    const SimdCap cap(level);
    for (const bool specials : {false, true})
      for (const AdamUpdate& u : adam_settings())
        for (const std::int64_t n : kLengths) {
          CAPTURE(std::string(*level ? level : "best"));
          CAPTURE(adam_name(u));
          CAPTURE(n);
          CAPTURE(specials);
          const auto p0 = values(11 + n, n, specials), g0 = values(12 + n, n, specials), m0 = values(13 + n, n, specials);
          const auto v0 = values(14 + n, n, specials, true), x0 = values(15 + n, n, specials, true);
          auto p = p0, m = m0, v = v0, x = x0;
          ref_adam(p.data(), g0.data(), m.data(), v.data(), x.data(), n, u);
          Tensor tp = from(p0), tg = from(g0), tm = from(m0), tv = from(v0), tx = u.amsgrad ? from(x0) : Tensor();
          k.adam_update(tp, tg, tm, tv, tx, u);
          CHECK(same_bits(tp, p));
          CHECK(same_bits(tm, m));
          CHECK(same_bits(tv, v));
          if (u.amsgrad) CHECK(same_bits(tx, x));
          Tensor gp = from(p0), gg = from(g0), gm = from(m0), gv = from(v0), gx = u.amsgrad ? from(x0) : Tensor();
          Tensor hp = from(p0), hm = from(m0), hv = from(v0), hx = u.amsgrad ? from(x0) : Tensor();
          k.adam_update_group({{&gp, &gg, &gm, &gv, &gx, u}, {&hp, &gg, &hm, &hv, &hx, u}});
          for (const Tensor* t : {&gp, &hp}) CHECK(same_bits(*t, p));
          for (const Tensor* t : {&gm, &hm}) CHECK(same_bits(*t, m));
          for (const Tensor* t : {&gv, &hv}) CHECK(same_bits(*t, v));
          if (u.amsgrad)
            for (const Tensor* t : {&gx, &hx}) CHECK(same_bits(*t, x));
        }
  }
}

TEST_CASE("every optimizer of the parity fixture gives the same bits on each instruction set, over odd-sized parameters") {
  // Parameters of odd sizes (vector bodies and tails), 6 steps with a parameter that has no
  // gradient in some steps (its own step count and first momentum step), on each path.
  const std::vector<std::vector<std::int64_t>> shapes = {{37, 29}, {1}, {130}, {5, 3, 7}};
  for (const char* name : test::kOptimCases) {
    CAPTURE(std::string(name));
    std::vector<std::vector<std::vector<float>>> results;
    for (const char* level : kLevels) {
      const SimdCap cap(level);
      std::vector<Tensor> ps;
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        std::int64_t n = 1;
        for (auto d : shapes[i]) n *= d;
        Tensor t = from(values(100 + i, n, false));
        ps.push_back(t.reshape(shapes[i]).clone().requires_grad_());
      }
      auto opt = test::make_optimizer(name, ps);
      for (int step = 0; step < 6; ++step) {
        for (std::size_t i = 0; i < ps.size(); ++i) {
          if (i == 2 && step % 3 == 0) {
            ps[i].set_grad(Tensor());
            continue;
          }
          ps[i].set_grad(from(values(1000 + 10 * step + i, ps[i].numel(), false)).reshape(shapes[i]));
        }
        opt->step();
      }
      std::vector<std::vector<float>> r;
      for (const auto& p : ps) r.push_back(p.to_vector<float>());
      results.push_back(std::move(r));
    }
    CHECK(results[0] == results[1]);
    CHECK(results[0] == results[2]);
  }
}
