#include "phalanx/core/nn/sequential.hpp"

#include "phalanx/core/error.hpp"
#include "phalanx/core/nn/activation.hpp"
#include "phalanx/core/nn/linear.hpp"

namespace phalanx::nn {

Sequential::Sequential(std::initializer_list<ModulePtr> modules) {
  for (auto& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr m) {
  if (!m) throw ValueError("Sequential: null module");
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : layers_) h = m->forward(h);
  return h;
}

std::shared_ptr<Sequential> mlp(const std::vector<std::int64_t>& widths,
                                const std::string& activation, Generator* gen) {
  if (widths.size() < 2)
    throw ValueError("mlp: need at least an input and an output width, e.g. {64, 32, 10}");
  if (activation != "relu" && activation != "tanh" && activation != "sigmoid")
    throw ValueError("mlp: unknown activation '" + activation + "' (relu, tanh or sigmoid)");
  auto seq = std::make_shared<Sequential>();
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    seq->push_back(std::make_shared<Linear>(widths[i], widths[i + 1], true, gen));
    if (i + 2 < widths.size()) {
      if (activation == "relu") seq->push_back(std::make_shared<ReLU>());
      else if (activation == "tanh") seq->push_back(std::make_shared<Tanh>());
      else seq->push_back(std::make_shared<Sigmoid>());
    }
  }
  return seq;
}

}  // namespace phalanx::nn
