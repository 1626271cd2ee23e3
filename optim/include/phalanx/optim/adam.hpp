#pragma once
#include "phalanx/optim/optimizer.hpp"

namespace phalanx::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
};

/// torch.optim.Adam (L2 penalty added to the gradient).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  void step() override;
  const char* name() const override { return "Adam"; }

 protected:
  Adam(std::vector<Tensor> params, const AdamOptions& options, bool decoupled);

 private:
  bool decoupled_;
};

/// torch.optim.AdamW (decoupled weight decay: p *= 1 - lr*wd before the Adam step).
/// Default weight_decay is 0.01, as in PyTorch.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options = with_default_decay());
  const char* name() const override { return "AdamW"; }
  static AdamOptions with_default_decay() {
    AdamOptions o;
    o.weight_decay = 1e-2;
    return o;
  }
};

}  // namespace phalanx::optim
