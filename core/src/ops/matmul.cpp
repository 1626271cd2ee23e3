// matmul and linear: one GEMM forward, one GEMM per wanted gradient backward; transposes
// are GEMM flags, never materialised copies.
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

// The device pointer of a float32 tensor the op has checked: GEMM runs on the tensors'
// device, so this is never dereferenced on the host (data<float>() would refuse a CUDA one).
float* dptr(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

class MatmulBackward final : public Node {
 public:
  MatmulBackward(Tensor a, Tensor b) : a_(std::move(a)), b_(std::move(b)) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    const std::int64_t m = a_.shape()[0], k = a_.shape()[1], n = b_.shape()[1];
    DeviceKernels& kern = kernels_for(g.device());
    Tensor ga, gb;
    if (needs_grad(*this, 0)) {  // dA = dC B^T
      ga = autograd::gradient_buffer(*this, 0, {m, k}, g.device());
      kern.gemm(false, true, m, k, n, 1.f, dptr(g), n, dptr(b_), n, 0.f,
                dptr(ga), k);
    }
    if (needs_grad(*this, 1)) {  // dB = A^T dC
      gb = autograd::gradient_buffer(*this, 1, {k, n}, g.device());
      kern.gemm(true, false, k, n, m, 1.f, dptr(a_), k, dptr(g), n, 0.f,
                dptr(gb), n);
    }
    return {ga, gb};
  }
  const char* name() const override { return "MatmulBackward"; }
  void release_saved() override { a_ = Tensor(); b_ = Tensor(); }

 private:
  Tensor a_, b_;
};

class LinearBackward final : public Node {
 public:
  LinearBackward(Tensor x, Tensor w, bool has_bias)
      : x_(std::move(x)), w_(std::move(w)), has_bias_(has_bias) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    const std::int64_t out_f = w_.shape()[0], in_f = w_.shape()[1];
    const std::int64_t rows = g.numel() / out_f;
    DeviceKernels& k = kernels_for(g.device());
    Tensor gx, gw, gb;
    if (needs_grad(*this, 0)) {  // dX = dY W
      gx = Tensor::empty(x_.shape(), DType::Float32, g.device());
      k.gemm(false, false, rows, in_f, out_f, 1.f, dptr(g), out_f, dptr(w_), in_f,
             0.f, dptr(gx), in_f);
    }
    if (needs_grad(*this, 1)) {  // dW = dY^T X
      gw = autograd::gradient_buffer(*this, 1, w_.shape(), g.device());
      k.gemm(true, false, out_f, in_f, rows, 1.f, dptr(g), out_f, dptr(x_), in_f,
             0.f, dptr(gw), in_f);
    }
    if (has_bias_ && needs_grad(*this, 2)) {  // db = column sums of dY
      gb = autograd::gradient_buffer(*this, 2, {out_f}, g.device());
      k.sum_to_period(g, gb, 1.f);
    }
    return {gx, gw, gb};
  }
  const char* name() const override { return "LinearBackward"; }
  void release_saved() override { x_ = Tensor(); w_ = Tensor(); }

 private:
  Tensor x_, w_;
  bool has_bias_;
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_float(a, "matmul", "a");
  check_float(b, "matmul", "b");
  check_same_device(a, b, "matmul");
  if (a.dim() != 2 || b.dim() != 2 || a.shape()[1] != b.shape()[0])
    throw ShapeError("matmul: expected [M, K] x [K, N], got " + shape_str(a.shape()) + " x " +
                     shape_str(b.shape()));
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor out = Tensor::empty({m, n}, DType::Float32, a.device());
  kernels_for(a.device()).gemm(false, false, m, n, k, 1.f, dptr(a), k, dptr(b), n,
                               0.f, dptr(out), n);
  if (grad_mode_enabled() && (a.requires_grad() || b.requires_grad()))
    autograd::record(std::make_shared<MatmulBackward>(a.detach(), b.detach()), {&a, &b}, out);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_float(x, "linear", "input");
  check_float(weight, "linear", "weight");
  check_same_device(x, weight, "linear");
  if (weight.dim() != 2)
    throw ShapeError("linear: weight must be [out_features, in_features], got " +
                     shape_str(weight.shape()));
  const std::int64_t out_f = weight.shape()[0], in_f = weight.shape()[1];
  if (x.dim() < 1 || x.shape().back() != in_f)
    throw ShapeError(detail::concat("linear: input ", shape_str(x.shape()),
                                    " does not end in in_features = ", in_f, " (weight ",
                                    shape_str(weight.shape()), ")"));
  const bool has_bias = bias.defined();
  if (has_bias) {
    check_float(bias, "linear", "bias");
    if (bias.numel() != out_f || bias.dim() != 1)
      throw ShapeError(detail::concat("linear: bias ", shape_str(bias.shape()),
                                      " does not match out_features = ", out_f));
  }
  const std::int64_t rows = x.numel() / in_f;
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  Tensor out = Tensor::empty(out_shape, DType::Float32, x.device());
  DeviceKernels& k = kernels_for(x.device());
  if (has_bias) k.broadcast_rows(bias, out);  // then GEMM accumulates onto it (beta = 1)
  k.gemm(false, true, rows, out_f, in_f, 1.f, dptr(x), in_f, dptr(weight), in_f,
         has_bias ? 1.f : 0.f, dptr(out), out_f);
  if (grad_mode_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (has_bias && bias.requires_grad()))) {
    auto node = std::make_shared<LinearBackward>(x.detach(), weight.detach(), has_bias);
    autograd::record(node, {&x, &weight, has_bias ? &bias : nullptr}, out);
  }
  return out;
}

}  // namespace phalanx
