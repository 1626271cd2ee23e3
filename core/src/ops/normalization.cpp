// Batch and layer normalisation: per-channel statistics over x viewed as
// [outer, C, inner], through the device table's batch_norm_* kernels. LayerNorm is the same
// normalisation with the rows as channels (outer = 1), then the affine map by suffix broadcast.
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

struct NCL {
  std::int64_t n = 1, c = 1, l = 1;
};

NCL split_channels(const Tensor& x, const char* op) {
  if (x.dim() < 2)
    throw ShapeError(detail::concat(op, ": expected input [N, C] or [N, C, *], got ", shape_str(x.shape())));
  NCL s;
  s.n = x.shape()[0];
  s.c = x.shape()[1];
  for (std::int64_t i = 2; i < x.dim(); ++i) s.l *= x.shape()[i];
  return s;
}

void check_channel_vector(const Tensor& t, std::int64_t c, const Tensor& x, const char* op, const char* arg) {
  if (!t.defined()) return;
  check_float(t, op, arg);
  check_same_device(t, x, op);
  if (t.dim() != 1 || t.numel() != c)
    throw ShapeError(detail::concat(op, ": '", arg, "' must have shape [", c, "] (one per channel of input ",
                                    shape_str(x.shape()), "), got ", shape_str(t.shape())));
}

Tensor channel_vector(std::int64_t c, Device d) { return Tensor::empty({c}, DType::Float32, d); }

class BatchNormBackward final : public Node {
 public:
  BatchNormBackward(Tensor x, Tensor mean, Tensor invstd, Tensor weight, NCL s, bool batch_stats, double count,
                    BatchNormGradReduce reduce)
      : x_(std::move(x)), mean_(std::move(mean)), invstd_(std::move(invstd)), weight_(std::move(weight)),
        s_(s), batch_(batch_stats), count_(count), reduce_(std::move(reduce)) {}

  std::vector<Tensor> apply(const Tensor& g) override {
    DeviceKernels& k = kernels_for(g.device());
    const bool want_x = needs_grad(*this, 0), want_w = needs_grad(*this, 1), want_b = needs_grad(*this, 2);
    std::vector<Tensor> out(3);
    Tensor sum_dy, sum_dy_xmu;
    if (want_w || want_b || (want_x && batch_)) {
      sum_dy = channel_vector(s_.c, g.device());
      sum_dy_xmu = channel_vector(s_.c, g.device());
      k.batch_norm_backward_reduce(g, x_, s_.n, s_.c, s_.l, mean_, sum_dy, sum_dy_xmu);
    }
    if (want_w) {  // dL/dw = sum(dy * xhat) = sum_dy_xmu * invstd (this process's share)
      out[1] = channel_vector(s_.c, g.device());
      k.binary(BinaryOp::Mul, sum_dy_xmu, invstd_, out[1]);
    }
    if (want_b) out[2] = want_x && batch_ && reduce_ ? sum_dy.clone() : sum_dy;  // reduce_ edits sum_dy
    if (want_x) {
      if (batch_ && reduce_) reduce_(sum_dy, sum_dy_xmu);
      out[0] = empty_like(x_);
      k.batch_norm_backward_elemt(g, x_, s_.n, s_.c, s_.l, mean_, invstd_, weight_, batch_ ? sum_dy : Tensor(),
                                  batch_ ? sum_dy_xmu : Tensor(), count_, out[0]);
    }
    return out;
  }
  const char* name() const override { return "NativeBatchNormBackward"; }
  void release_saved() override {
    x_ = mean_ = invstd_ = weight_ = Tensor();
    reduce_ = nullptr;
  }

 private:
  Tensor x_, mean_, invstd_, weight_;
  NCL s_;
  bool batch_;
  double count_;
  BatchNormGradReduce reduce_;
};

}  // namespace

BatchNormStats batch_norm_stats(const Tensor& x_in) {
  const Tensor x = contiguous_input(x_in);
  check_float(x, "batch_norm_stats");
  const NCL s = split_channels(x, "batch_norm_stats");
  BatchNormStats r{channel_vector(s.c, x.device()), channel_vector(s.c, x.device())};
  kernels_for(x.device()).batch_norm_stats(x, s.n, s.c, s.l, r.mean, r.var);
  return r;
}

Tensor batch_norm_invstd(const Tensor& var_in, double eps) {
  const Tensor var = contiguous_input(var_in);
  check_float(var, "batch_norm_invstd", "var");
  Tensor out = empty_like(var);
  DeviceKernels& k = kernels_for(var.device());
  k.affine_scalar(var, 1.f, static_cast<float>(eps), out);
  k.unary(UnaryOp::Rsqrt, out, out);
  return out;
}

Tensor batch_norm_elemt(const Tensor& x_in, const Tensor& mean_in, const Tensor& invstd_in, const Tensor& weight_in,
                        const Tensor& bias_in, bool batch_stats, double count, BatchNormGradReduce reduce) {
  const Tensor x = contiguous_input(x_in), mean = contiguous_input(mean_in), invstd = contiguous_input(invstd_in), weight = contiguous_input(weight_in), bias = contiguous_input(bias_in);
  const char* op = "batch_norm_elemt";
  check_float(x, op);
  const NCL s = split_channels(x, op);
  check_defined(mean, op, "mean");
  check_defined(invstd, op, "invstd");
  check_channel_vector(mean, s.c, x, op, "mean");
  check_channel_vector(invstd, s.c, x, op, "invstd");
  check_channel_vector(weight, s.c, x, op, "weight");
  check_channel_vector(bias, s.c, x, op, "bias");
  if (batch_stats && !(count > 0))
    throw ValueError(detail::concat(op, ": count (elements per channel behind the batch statistics) must be > 0, got ",
                                    count));
  Tensor y = empty_like(x);
  kernels_for(x.device()).batch_norm_elemt(x, s.n, s.c, s.l, mean, invstd, weight, bias, y);
  if (grad_mode_enabled() && (x.requires_grad() || (weight.defined() && weight.requires_grad()) ||
                              (bias.defined() && bias.requires_grad()))) {
    auto node = std::make_shared<BatchNormBackward>(x.detach(), mean.detach(), invstd.detach(),
                                                    weight.defined() ? weight.detach() : Tensor(), s, batch_stats,
                                                    count, std::move(reduce));
    autograd::record(node, {&x, weight.defined() ? &weight : nullptr, bias.defined() ? &bias : nullptr}, y);
  }
  return y;
}

void batch_norm_backward_reduce(const Tensor& grad_y_in, const Tensor& x_in, const Tensor& mean_in, Tensor& sum_dy,
                                Tensor& sum_dy_xmu) {
  const Tensor grad_y = contiguous_input(grad_y_in), x = contiguous_input(x_in), mean = contiguous_input(mean_in);
  const char* op = "batch_norm_backward_reduce";
  check_float(x, op);
  check_float(grad_y, op, "grad_y");
  const NCL s = split_channels(x, op);
  if (grad_y.shape() != x.shape())
    throw ShapeError(detail::concat(op, ": grad_y ", shape_str(grad_y.shape()), " does not match input ",
                                    shape_str(x.shape())));
  check_channel_vector(mean, s.c, x, op, "mean");
  sum_dy = channel_vector(s.c, x.device());
  sum_dy_xmu = channel_vector(s.c, x.device());
  kernels_for(x.device()).batch_norm_backward_reduce(grad_y, x, s.n, s.c, s.l, mean, sum_dy, sum_dy_xmu);
}

Tensor batch_norm_backward_elemt(const Tensor& grad_y_in, const Tensor& x_in, const Tensor& mean_in, const Tensor& invstd_in,
                                 const Tensor& weight_in, const Tensor& sum_dy_in, const Tensor& sum_dy_xmu_in,
                                 double count) {
  const Tensor grad_y = contiguous_input(grad_y_in), x = contiguous_input(x_in), mean = contiguous_input(mean_in), invstd = contiguous_input(invstd_in), weight = contiguous_input(weight_in), sum_dy = contiguous_input(sum_dy_in), sum_dy_xmu = contiguous_input(sum_dy_xmu_in);
  const char* op = "batch_norm_backward_elemt";
  check_float(x, op);
  check_float(grad_y, op, "grad_y");
  const NCL s = split_channels(x, op);
  if (grad_y.shape() != x.shape())
    throw ShapeError(detail::concat(op, ": grad_y ", shape_str(grad_y.shape()), " does not match input ",
                                    shape_str(x.shape())));
  for (auto [t, name] : {std::pair{&mean, "mean"}, {&invstd, "invstd"}, {&sum_dy, "sum_dy"},
                         {&sum_dy_xmu, "sum_dy_xmu"}}) {
    check_defined(*t, op, name);
    check_channel_vector(*t, s.c, x, op, name);
  }
  check_channel_vector(weight, s.c, x, op, "weight");
  Tensor gx = empty_like(x);
  kernels_for(x.device()).batch_norm_backward_elemt(grad_y, x, s.n, s.c, s.l, mean, invstd, weight, sum_dy,
                                                    sum_dy_xmu, count, gx);
  return gx;
}

Tensor batch_norm(const Tensor& x_in, const Tensor& running_mean_in, const Tensor& running_var_in, const Tensor& weight_in,
                  const Tensor& bias_in, bool training, double momentum, double eps) {
  // The running statistics are updated in place: a view of them would update a copy.
  if ((running_mean_in.defined() && !running_mean_in.is_contiguous()) ||
      (running_var_in.defined() && !running_var_in.is_contiguous()))
    throw ValueError("batch_norm: running_mean and running_var are updated in place and must be contiguous; "
                     "pass tensors of their own (e.g. .contiguous() once, kept as the module's buffers)");
  const Tensor x = contiguous_input(x_in), running_mean = running_mean_in, running_var = running_var_in,
               weight = contiguous_input(weight_in), bias = contiguous_input(bias_in);
  if (any_reduced(x, weight, bias))  // the output keeps x's dtype (PyTorch's mixed bf16 / float32 norm)
    return in_float32(x.dtype(), [=](const Tensor& a, const Tensor& w, const Tensor& b) {
      return batch_norm(a, running_mean, running_var, w, b, training, momentum, eps); }, x, weight, bias);
  const char* op = "batch_norm";
  check_float(x, op);
  const NCL s = split_channels(x, op);
  check_channel_vector(running_mean, s.c, x, op, "running_mean");
  check_channel_vector(running_var, s.c, x, op, "running_var");
  if (running_mean.defined() != running_var.defined())
    throw ValueError("batch_norm: give both running_mean and running_var, or neither");
  if (!(eps > 0)) throw ValueError(detail::concat("batch_norm: eps must be > 0, got ", eps));
  const bool use_batch = training || !running_mean.defined();
  if (!use_batch) {
    Tensor invstd = batch_norm_invstd(running_var, eps);
    return batch_norm_elemt(x, running_mean, invstd, weight, bias, false);
  }
  const std::int64_t count = s.n * s.l;
  if (count <= 1)
    throw ValueError(detail::concat("batch_norm: expected more than 1 value per channel when training, got input size ",
                                    shape_str(x.shape()), " (use a batch of 2 or more, or eval mode)"));
  BatchNormStats st = batch_norm_stats(x);
  if (training && running_mean.defined()) {
    DeviceKernels& k = kernels_for(x.device());
    const float m = static_cast<float>(momentum);
    Tensor rm = running_mean, rv = running_var;  // handles share storage: updated in place
    k.scale(rm, 1.f - m);
    k.axpy(m, st.mean, rm);
    k.scale(rv, 1.f - m);
    k.axpy(static_cast<float>(momentum * static_cast<double>(count) / static_cast<double>(count - 1)), st.var, rv);
  }
  Tensor invstd = batch_norm_invstd(st.var, eps);
  return batch_norm_elemt(x, st.mean, invstd, weight, bias, true, static_cast<double>(count));
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, const Tensor& bias_in,
                  double eps) {
  const Tensor x = contiguous_input(x_in), weight = contiguous_input(weight_in), bias = contiguous_input(bias_in);
  auto again = [=](const Tensor& a, const Tensor& w, const Tensor& b) { return layer_norm(a, normalized_shape, w, b, eps); };
  if (autocast_detail::applies(autocast_detail::Op::LayerNorm, x))
    return autocast_detail::call(autocast_detail::Op::LayerNorm, again, x, weight, bias);
  if (any_reduced(x, weight, bias)) return in_float32(x.dtype(), again, x, weight, bias);
  const char* op = "layer_norm";
  check_float(x, op);
  const std::size_t k = normalized_shape.size();
  bool ok = k >= 1 && k <= x.shape().size();
  for (std::size_t i = 0; ok && i < k; ++i) ok = x.shape()[x.shape().size() - k + i] == normalized_shape[i];
  if (!ok)
    throw ShapeError(detail::concat(op, ": input ", shape_str(x.shape()), " does not end in normalized_shape ",
                                    shape_str(normalized_shape)));
  for (auto [t, name] : {std::pair{&weight, "weight"}, {&bias, "bias"}}) {
    if (!t->defined()) continue;
    check_float(*t, op, name);
    check_same_device(*t, x, op);
    if (t->shape() != normalized_shape)
      throw ShapeError(detail::concat(op, ": '", name, "' must have shape ", shape_str(normalized_shape), ", got ",
                                      shape_str(t->shape())));
  }
  if (!(eps > 0)) throw ValueError(detail::concat("layer_norm: eps must be > 0, got ", eps));
  std::int64_t d = 1;
  for (auto v : normalized_shape) d *= v;
  const std::int64_t rows = d ? x.numel() / d : 0;
  Tensor x3 = reshape(x, {1, rows, d});
  BatchNormStats st = batch_norm_stats(x3);
  Tensor y = batch_norm_elemt(x3, st.mean, batch_norm_invstd(st.var, eps), Tensor(), Tensor(), true,
                              static_cast<double>(d > 0 ? d : 1));
  y = reshape(y, x.shape());
  if (weight.defined()) y = mul(y, weight);
  if (bias.defined()) y = add(y, bias);
  return y;
}

}  // namespace phalanx

namespace phalanx {

// softmax lives here with the other normalisations: exp of the stable log_softmax.
Tensor softmax(const Tensor& x, std::int64_t dim) {
  auto again = [=](const Tensor& t) { return softmax(t, dim); };
  if (autocast_detail::applies(autocast_detail::Op::Softmax, x))
    return autocast_detail::call(autocast_detail::Op::Softmax, again, x);
  // one rounding of the float32 result, not one after log_softmax and another after exp
  if (ops_detail::is_reduced(x)) return ops_detail::in_float32(x.dtype(), again, x);
  return exp(log_softmax(x, dim));
}

}  // namespace phalanx
