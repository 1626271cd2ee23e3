#include "phalanx/core/nn/activation.hpp"

#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }

Dropout::Dropout(float p, Generator* gen) : p_(p), gen_(gen) {
  if (!(p >= 0.f && p <= 1.f))
    throw ValueError(detail::concat("Dropout: probability must be in [0, 1], got ", p));
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), gen_); }
std::string Dropout::describe() const { return detail::concat("Dropout(p=", p_, ")"); }

}  // namespace phalanx::nn
