#pragma once
#include "phalanx/optim/optimizer.hpp"

namespace phalanx::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
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
