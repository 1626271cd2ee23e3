#pragma once
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

/// torch.nn.Flatten: merges dims start_dim .. end_dim (negative counts from the end) into
/// one; a view, differentiable.
class Flatten : public Module {
 public:
  explicit Flatten(std::int64_t start_dim = 1, std::int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  /// "Flatten(start_dim=1, end_dim=-1)"
  std::string describe() const override;
  std::int64_t start_dim, end_dim;
};

}  // namespace phalanx::nn
