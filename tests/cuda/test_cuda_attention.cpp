// scaled_dot_product_attention on CUDA equals the CPU's fused kernel within float tolerance:
// outputs and q/k/v gradients, with causal masking, float masks that broadcast, scale, L != S,
// Ev != E, and dropout (the same counter hash: the same weights dropped for the same seed).
#include <doctest/doctest.h>

#include <optional>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::max_rel_err;

namespace {
const Device kGpu = Device::cuda(0);

Tensor rnd(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, &g);
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
