#pragma once
#include "phalanx/core/arg.hpp"
#include "phalanx/optim/optimizer.hpp"

namespace phalanx::optim {

/// Chainable, as libtorch's: `SGDOptions(0.1).momentum(0.9).nesterov(true)`.
struct SGDOptions {
  /* implicit */ SGDOptions(double lr = 0.01) : lr_(lr) {}
  PHALANX_ARG(double, lr);
  PHALANX_ARG(double, momentum) = 0.0;
  PHALANX_ARG(double, dampening) = 0.0;
  PHALANX_ARG(double, weight_decay) = 0.0;
  PHALANX_ARG(bool, nesterov) = false;
};

/// torch.optim.SGD: d = g + wd*p; buf = m*buf + (1-dampening)*d (first step: buf = d);
/// d = nesterov ? d + m*buf : buf; p -= lr*d.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  void step() override;
  const char* name() const override { return "SGD"; }
};

}  // namespace phalanx::optim
