#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {
class LogSoftmaxBackward final : public Node {
 public:
  LogSoftmaxBackward(Tensor y, std::int64_t outer, std::int64_t d, std::int64_t inner)
      : y_(std::move(y)), outer_(outer), d_(d), inner_(inner) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gx = empty_like(g);
    kernels_for(g.device()).log_softmax_backward(g, y_, outer_, d_, inner_, gx);
    return {gx};
  }
  const char* name() const override { return "LogSoftmaxBackward"; }
  void release_saved() override { y_ = Tensor(); }

 private:
  Tensor y_;
  std::int64_t outer_, d_, inner_;
};
}  // namespace

Tensor log_softmax(const Tensor& x_in, std::int64_t dim) {
  const Tensor x = contiguous_input(x_in);
  auto again = [=](const Tensor& t) { return log_softmax(t, dim); };
  if (autocast_detail::applies(autocast_detail::Op::LogSoftmax, x))
    return autocast_detail::call(autocast_detail::Op::LogSoftmax, again, x);
  if (is_reduced(x)) return in_float32(x.dtype(), again, x);
  check_float(x, "log_softmax");
  const int d = normalize_dim(dim, x.shape().size(), "log_softmax");
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= x.shape()[i];
  for (std::size_t i = d + 1; i < x.shape().size(); ++i) inner *= x.shape()[i];
  const std::int64_t n = x.shape()[d];
  Tensor y = empty_like(x);
  kernels_for(x.device()).log_softmax(x, outer, n, inner, y);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<LogSoftmaxBackward>(y.detach(), outer, n, inner), {&x}, y);
  return y;
}

}  // namespace phalanx
