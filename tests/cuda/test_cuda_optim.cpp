// The fused optimizer updates on CUDA follow the CPU step for step: SGD (plain, momentum,
// dampening, Nesterov, weight decay) and Adam/AdamW (with and without AMSGrad).
#include <doctest/doctest.h>

#include <memory>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;
using phalanx::test::max_rel_err;

namespace {
const Device kGpu = Device::cuda(0);

/// Ten steps of the same optimizer on a CPU parameter and its CUDA copy, same gradients.
/// The kernels compute the same formula; the GPU may contract a*b+c into one rounding (FMA),
/// hence a tolerance rather than equality.
void same_steps(const std::function<std::unique_ptr<optim::Optimizer>(Tensor)>& make) {
  Tensor pc = away_from_zero({1000}, 30).requires_grad_(), pg = pc.to(kGpu).requires_grad_();
  auto oc = make(pc), og = make(pg);
  for (int s = 0; s < 10; ++s) {
    Tensor g = away_from_zero({1000}, 40 + s);
    pc.set_grad(g);
    pg.set_grad(g.to(kGpu));
    oc->step();
    og->step();
  }
  CHECK(pg.device() == kGpu);
  CHECK(max_rel_err(pg.to(Device::cpu()), pc) < 1e-5);
  CHECK(max_rel_err(pg.to(Device::cpu()), away_from_zero({1000}, 30)) > 1e-3);  // it did move
}
}  // namespace

TEST_CASE("cuda: SGD variants match the CPU") {
  const optim::SGDOptions variants[] = {
      optim::SGDOptions(0.1),                                     // plain
      optim::SGDOptions(0.1).momentum(0.9),                       // momentum
      optim::SGDOptions(0.1).momentum(0.9).dampening(0.3),        // dampening
      optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true),  // Nesterov, weight decay
      optim::SGDOptions(0.05).weight_decay(0.1),                  // weight decay only
  };
  for (const auto& o : variants) {
    CAPTURE(o.momentum());
    CAPTURE(o.nesterov());
    same_steps([&](Tensor p) { return std::make_unique<optim::SGD>(std::vector<Tensor>{p}, o); });
  }
}

TEST_CASE("cuda: Adam and AdamW (AMSGrad on and off) match the CPU") {
  for (bool decoupled : {false, true})
    for (bool amsgrad : {false, true}) {
      CAPTURE(decoupled);
      CAPTURE(amsgrad);
      same_steps([&](Tensor p) -> std::unique_ptr<optim::Optimizer> {
        if (decoupled)
          return std::make_unique<optim::AdamW>(std::vector<Tensor>{p},
                                                optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(amsgrad));
        return std::make_unique<optim::Adam>(std::vector<Tensor>{p},
                                             optim::AdamOptions(1e-2).weight_decay(0.1).amsgrad(amsgrad));
      });
    }
}
