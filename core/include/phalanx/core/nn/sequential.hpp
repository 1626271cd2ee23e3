#pragma once
#include <initializer_list>

#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

/// Runs its children in order; children are named "0", "1", ... as in PyTorch.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<ModulePtr> modules);
  void push_back(ModulePtr m);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Sequential"; }
  std::size_t size() const { return layers_.size(); }
  const ModulePtr& operator[](std::size_t i) const { return layers_.at(i); }

 private:
  std::vector<ModulePtr> layers_;
};

/// An MLP from layer widths, e.g. {64, 32, 10}: Linear, activation, ..., Linear.
/// Names match PyTorch's nn.Sequential of the same layers ("0.weight", "2.bias").
std::shared_ptr<Sequential> mlp(const std::vector<std::int64_t>& widths,
                                const std::string& activation = "relu", Generator* gen = nullptr);

}  // namespace phalanx::nn
