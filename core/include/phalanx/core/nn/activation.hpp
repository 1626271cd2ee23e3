#pragma once
#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "ReLU()"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Tanh()"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Sigmoid()"; }
};

/// PyTorch's GELU(approximate='none'): x * (1 + erf(x / sqrt 2)) / 2.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "GELU(approximate='none')"; }
};

/// Zeroes elements with probability p in training mode; identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  float p_;
  Generator* gen_;
};

}  // namespace phalanx::nn
