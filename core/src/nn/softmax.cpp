#include "phalanx/core/nn/softmax.hpp"

#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim); }
std::string Softmax::describe() const { return detail::concat("Softmax(dim=", dim, ")"); }
Tensor LogSoftmax::forward(const Tensor& x) { return log_softmax(x, dim); }
std::string LogSoftmax::describe() const { return detail::concat("LogSoftmax(dim=", dim, ")"); }

}  // namespace phalanx::nn
