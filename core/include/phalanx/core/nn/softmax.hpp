#pragma once
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

/// torch.nn.Softmax(dim).
class Softmax : public Module {
 public:
  explicit Softmax(std::int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  std::int64_t dim;
};

/// torch.nn.LogSoftmax(dim).
class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(std::int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  std::int64_t dim;
};

}  // namespace phalanx::nn
