#pragma once
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

/// Loss modules; they wrap the functional forms in ops.hpp.
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction r = Reduction::Mean) : reduction_(r) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return cross_entropy(logits, target, reduction_);
  }

 private:
  Reduction reduction_;
};

class MSELoss {
 public:
  explicit MSELoss(Reduction r = Reduction::Mean) : reduction_(r) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return mse_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

}  // namespace phalanx::nn
