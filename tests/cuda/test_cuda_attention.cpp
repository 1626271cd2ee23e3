// scaled_dot_product_attention on CUDA equals the CPU's fused kernel within float tolerance:
// outputs and q/k/v gradients, with causal masking, float masks that broadcast, scale, L != S,
// Ev != E, and dropout (the same counter hash: the same weights dropped for the same seed);
// fully masked rows (float -inf and all-false Bool), causal with L > S, L > 128, wide heads,
// a backward where only k and v need grad, and rows masked with -1e9 or lowest().
#include <doctest/doctest.h>

#include <limits>
#include <optional>
#include <vector>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::max_rel_err;

namespace {
const Device kGpu = Device::cuda(0);

Tensor rnd(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, &g);
}

/// The CPU and CUDA outputs and the gradients of the inputs that require grad, within 1e-5.
/// `grads`: which of q, k, v require grad.
void check_like_cpu(const Shape& qs, const Shape& ks, const Shape& vs, const Tensor& mask, bool causal,
                    const bool (&grads)[3] = {true, true, true}) {
  Tensor c[3] = {rnd(qs, 1), rnd(ks, 2), rnd(vs, 3)}, g[3];
  for (int i = 0; i < 3; ++i) {
    g[i] = c[i].to(kGpu);
    if (grads[i]) {
      c[i].requires_grad_(true);
      g[i].requires_grad_(true);
    }
  }
  Tensor oc = scaled_dot_product_attention(c[0], c[1], c[2], mask, 0.f, causal);
  Tensor og = scaled_dot_product_attention(g[0], g[1], g[2], mask.defined() ? mask.to(kGpu) : mask, 0.f, causal);
  CHECK(max_rel_err(og.to(Device::cpu()), oc) < 1e-5);
  Tensor r = rnd(oc.shape(), 5);
  oc.backward(r);
  og.backward(r.to(kGpu));
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    if (!grads[i]) {
      CHECK_FALSE(g[i].grad().defined());
      continue;
    }
    CHECK(max_rel_err(g[i].grad().to(Device::cpu()), c[i].grad()) < 1e-5);
  }
}
}  // namespace

TEST_CASE("CUDA: scaled_dot_product_attention equals the CPU kernel, outputs and gradients") {
  struct Case {
    Shape q, k, v, mask;
    bool causal;
    std::optional<double> scale;
    float dropout_p;
  };
  const Case cases[] = {
      {{2, 3, 70, 16}, {2, 3, 70, 16}, {2, 3, 70, 16}, {}, true, std::nullopt, 0.f},
      {{2, 2, 33, 8}, {2, 2, 90, 8}, {2, 2, 90, 20}, {2, 1, 1, 90}, false, 0.3, 0.f},
      {{1, 4, 65, 64}, {1, 4, 65, 64}, {1, 4, 65, 64}, {65, 65}, true, std::nullopt, 0.2f},
  };
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.q));
    Tensor mask;
    if (!c.mask.empty()) mask = rnd(c.mask, 4);
    Tensor qc = rnd(c.q, 1).requires_grad_(true), kc = rnd(c.k, 2).requires_grad_(true),
           vc = rnd(c.v, 3).requires_grad_(true);
    Tensor qg = qc.detach().to(kGpu).requires_grad_(true), kg = kc.detach().to(kGpu).requires_grad_(true),
           vg = vc.detach().to(kGpu).requires_grad_(true);
    Generator g1(7), g2(7);
    Tensor oc = scaled_dot_product_attention(qc, kc, vc, mask, c.dropout_p, c.causal, c.scale, &g1);
    Tensor og = scaled_dot_product_attention(qg, kg, vg, mask.defined() ? mask.to(kGpu) : mask, c.dropout_p,
                                             c.causal, c.scale, &g2);
    CHECK(og.device() == kGpu);
    CHECK(max_rel_err(og.to(Device::cpu()), oc) < 1e-5);
    Tensor r = rnd(oc.shape(), 5);
    oc.backward(r);
    og.backward(r.to(kGpu));
    CHECK(max_rel_err(qg.grad().to(Device::cpu()), qc.grad()) < 1e-5);
    CHECK(max_rel_err(kg.grad().to(Device::cpu()), kc.grad()) < 1e-5);
    CHECK(max_rel_err(vg.grad().to(Device::cpu()), vc.grad()) < 1e-5);
  }
}

TEST_CASE("CUDA: scaled_dot_product_attention with a Bool mask equals the CPU") {
  Tensor bm = Tensor::empty({2, 1, 1, 90}, DType::Bool);
  auto* p = static_cast<unsigned char*>(bm.raw_data());
  for (int i = 0; i < 180; ++i) p[i] = (i % 90) < (i < 90 ? 80 : 50);  // padding: 80 and 50 keys
  Tensor qc = rnd({2, 2, 33, 8}, 1).requires_grad_(true), kc = rnd({2, 2, 90, 8}, 2).requires_grad_(true),
         vc = rnd({2, 2, 90, 20}, 3).requires_grad_(true);
  Tensor qg = qc.detach().to(kGpu).requires_grad_(true), kg = kc.detach().to(kGpu).requires_grad_(true),
         vg = vc.detach().to(kGpu).requires_grad_(true);
  Tensor oc = scaled_dot_product_attention(qc, kc, vc, bm, 0.f, true);
  Tensor og = scaled_dot_product_attention(qg, kg, vg, bm.to(kGpu), 0.f, true);
  CHECK(max_rel_err(og.to(Device::cpu()), oc) < 1e-5);
  Tensor r = rnd(oc.shape(), 5);
  oc.backward(r);
  og.backward(r.to(kGpu));
  CHECK(max_rel_err(qg.grad().to(Device::cpu()), qc.grad()) < 1e-5);
  CHECK(max_rel_err(kg.grad().to(Device::cpu()), kc.grad()) < 1e-5);
  CHECK(max_rel_err(vg.grad().to(Device::cpu()), vc.grad()) < 1e-5);
}

TEST_CASE("CUDA: fully masked rows (float -inf, all-false Bool) give zeros and no gradient, as the CPU") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> fm(20 * 30, 0.f);
  for (int j = 0; j < 30; ++j) fm[static_cast<std::size_t>(3 * 30 + j)] = -inf;  // row 3
  check_like_cpu({2, 20, 8}, {2, 30, 8}, {2, 30, 12}, tensor(fm, {20, 30}), false);
  Tensor bm = Tensor::empty({20, 30}, DType::Bool);
  auto* p = static_cast<unsigned char*>(bm.raw_data());
  for (int i = 0; i < 600; ++i) p[i] = i / 30 != 7;  // row 7 all false
  check_like_cpu({2, 20, 8}, {2, 30, 8}, {2, 30, 12}, bm, false);
  check_like_cpu({2, 20, 8}, {2, 30, 8}, {2, 30, 12}, bm, true);
}

TEST_CASE("CUDA: rows masked with -1e9 or lowest() get weights 1/S in the backward, as the CPU") {
  for (const float m : {-1e9f, std::numeric_limits<float>::lowest()}) {
    CAPTURE(m);
    std::vector<float> fm(4 * 8, 0.f);
    for (int j = 0; j < 8; ++j) fm[static_cast<std::size_t>(j)] = m;
    check_like_cpu({2, 4, 4}, {2, 8, 4}, {2, 8, 4}, tensor(fm, {4, 8}), false);
  }
}

TEST_CASE("CUDA: causal with L > S, L > 128, wide heads, and only k and v needing grad, as the CPU") {
  check_like_cpu({2, 90, 16}, {2, 40, 16}, {2, 40, 8}, Tensor(), true);      // causal, L > S
  check_like_cpu({1, 2, 300, 32}, {1, 2, 260, 32}, {1, 2, 260, 32}, Tensor(), true);  // L > 128
  check_like_cpu({1, 200, 16}, {1, 150, 16}, {1, 150, 24}, rnd({200, 150}, 6), false);
  check_like_cpu({2, 40, 512}, {2, 50, 512}, {2, 50, 1024}, Tensor(), false);  // E + Ev = 1536
  check_like_cpu({2, 70, 16}, {2, 90, 16}, {2, 90, 20}, rnd({70, 90}, 7), true, {false, true, true});
  check_like_cpu({2, 70, 16}, {2, 90, 16}, {2, 90, 20}, Tensor(), false, {false, false, true});
}
