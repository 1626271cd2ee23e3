#pragma once
#include "phalanx/core/arg.hpp"
#include "phalanx/optim/optimizer.hpp"

namespace phalanx::optim {

/// Chainable, as libtorch's: `AdamOptions(1e-3).betas(0.9, 0.98).weight_decay(1e-4)`.
struct AdamOptions {
  /* implicit */ AdamOptions(double lr = 1e-3) : lr_(lr) {}
  PHALANX_ARG(double, lr);
  PHALANX_ARG(double, beta1) = 0.9;
  PHALANX_ARG(double, beta2) = 0.999;
  PHALANX_ARG(double, eps) = 1e-8;
  PHALANX_ARG(double, weight_decay) = 0.0;
  PHALANX_ARG(bool, amsgrad) = false;
  /// Both betas at once (PyTorch's betas=(b1, b2)).
  AdamOptions& betas(double b1, double b2) {
    beta1_ = b1;
    beta2_ = b2;
    return *this;
  }
};

/// AdamW's options: Adam's fields, but weight_decay defaults to 0.01 (as libtorch's
/// AdamWOptions and torch.optim.AdamW).
struct AdamWOptions {
  /* implicit */ AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  PHALANX_ARG(double, lr);
  PHALANX_ARG(double, beta1) = 0.9;
  PHALANX_ARG(double, beta2) = 0.999;
  PHALANX_ARG(double, eps) = 1e-8;
  PHALANX_ARG(double, weight_decay) = 1e-2;
  PHALANX_ARG(bool, amsgrad) = false;
  AdamWOptions& betas(double b1, double b2) {
    beta1_ = b1;
    beta2_ = b2;
    return *this;
  }
};

/// torch.optim.Adam (L2 penalty added to the gradient).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  void step() override;
  const char* name() const override { return "Adam"; }

 protected:
  Adam(std::vector<Tensor> params, Options defaults, bool decoupled);

 private:
  bool decoupled_;
};

/// torch.optim.AdamW (decoupled weight decay: p *= 1 - lr*wd before the Adam step).
/// Default weight_decay is 0.01 (AdamWOptions), as in PyTorch.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  const char* name() const override { return "AdamW"; }
};

}  // namespace phalanx::optim
