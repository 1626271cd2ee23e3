// conv2d: per image, im2col into one scratch reused across the batch (skipped for 1x1
// stride-1 unpadded kernels, whose input already is the column matrix), then one GEMM per
// group through the device's kernel table (which picks the small-product kernel or BLAS).
// Backward recomputes each image's columns instead of keeping them for the whole batch.
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

float* dptr(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

bool pointwise(const Window2d& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}

class Conv2dBackward final : public Node {
 public:
  Conv2dBackward(Tensor x, Tensor w, Window2d g, std::int64_t groups, bool has_bias)
      : x_(std::move(x)), w_(std::move(w)), g_(g), groups_(groups), has_bias_(has_bias) {}

  std::vector<Tensor> apply(const Tensor& grad) override {
    const Window2d& g = g_;
    const std::int64_t oc = w_.shape()[0], ocg = oc / groups_, cg = g.c / groups_;
    const std::int64_t kg = cg * g.kh * g.kw, L = g.oh * g.ow, image = g.c * g.h * g.w;
    DeviceKernels& k = kernels_for(grad.device());
    const bool want_x = needs_grad(*this, 0), want_w = needs_grad(*this, 1);
    const bool direct = pointwise(g);
    Tensor gx, gw, gb;
    if (want_x) gx = autograd::gradient_buffer(*this, 0, x_.shape(), grad.device());
    if (want_w) {
      gw = autograd::gradient_buffer(*this, 1, w_.shape(), grad.device());
      if (g.n == 0) k.fill(gw, 0.0);  // an empty batch: no GEMM writes it
    }
    if (want_x || want_w) {
      Tensor col = direct ? Tensor() : Tensor::empty({g.c * g.kh * g.kw, L}, DType::Float32, grad.device());
      for (std::int64_t n = 0; n < g.n; ++n) {
        const float* gy = dptr(grad) + n * oc * L;
        if (want_w) {  // dW_g += dY_g col_g^T
          const float* cp = dptr(x_) + n * image;
          if (!direct) {
            k.im2col(x_, n, g, col);
            cp = dptr(col);
          }
          for (std::int64_t gi = 0; gi < groups_; ++gi)
            k.gemm(false, true, ocg, kg, L, 1.f, gy + gi * ocg * L, L, cp + gi * kg * L, L, n ? 1.f : 0.f,
                   dptr(gw) + gi * ocg * kg, kg);
        }
        if (want_x) {  // col_g = W_g^T dY_g, then scattered back
          float* dst = direct ? dptr(gx) + n * image : dptr(col);
          for (std::int64_t gi = 0; gi < groups_; ++gi)
            k.gemm(true, false, kg, L, ocg, 1.f, dptr(w_) + gi * ocg * kg, kg, gy + gi * ocg * L, L, 0.f,
                   dst + gi * kg * L, L);
          if (!direct) k.col2im(col, n, g, gx);
        }
      }
    }
    if (has_bias_ && needs_grad(*this, 2)) {  // db[o] = sum over images and positions
      gb = autograd::gradient_buffer(*this, 2, {oc}, grad.device());
      k.channel_sum(grad, g.n, L, gb);
    }
    return {gx, gw, gb};
  }
  const char* name() const override { return "Conv2dBackward"; }
  void release_saved() override { x_ = Tensor(); w_ = Tensor(); }

 private:
  Tensor x_, w_;
  Window2d g_;
  std::int64_t groups_;
  bool has_bias_;
};

std::string pair_str(Size2 s) { return detail::concat("(", s.h, ", ", s.w, ")"); }

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, Size2 stride, Size2 padding,
              Size2 dilation, std::int64_t groups) {
  const Tensor x = contiguous_input(x_in), weight = contiguous_input(weight_in), bias = contiguous_input(bias_in);
  auto again = [=](const Tensor& a, const Tensor& w, const Tensor& b) {
    return conv2d(a, w, b, stride, padding, dilation, groups);
  };
  if (autocast_detail::applies(autocast_detail::Op::Conv2d, x))
    return autocast_detail::call(autocast_detail::Op::Conv2d, again, x, weight, bias);
  if (any_reduced(x, weight, bias)) return in_float32(promote_types({&x, &weight, &bias}), again, x, weight, bias);
  check_float(x, "conv2d", "input");
  check_float(weight, "conv2d", "weight");
  check_same_device(x, weight, "conv2d");
  if (x.dim() != 4)
    throw ShapeError("conv2d: expected input [N, C, H, W], got " + shape_str(x.shape()) +
                     " (reshape an unbatched [C, H, W] input to [1, C, H, W])");
  if (weight.dim() != 4)
    throw ShapeError("conv2d: expected weight [out_channels, in_channels / groups, kH, kW], got " +
                     shape_str(weight.shape()));
  if (stride.h < 1 || stride.w < 1 || padding.h < 0 || padding.w < 0 || dilation.h < 1 || dilation.w < 1 ||
      groups < 1)
    throw ValueError(detail::concat("conv2d: stride ", pair_str(stride), " and dilation ", pair_str(dilation),
                                    " must be >= 1, padding ", pair_str(padding), " >= 0, groups ", groups,
                                    " >= 1"));
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  const std::int64_t oc = ws[0];
  if (xs[1] % groups != 0 || oc % groups != 0 || ws[1] * groups != xs[1])
    throw ShapeError(detail::concat("conv2d: input ", shape_str(xs), " and weight ", shape_str(ws), " with groups ",
                                    groups, ": expected weight [out_channels (divisible by groups), ", xs[1],
                                    " / groups, kH, kW] and in_channels divisible by groups"));
  Window2d g{xs[0], xs[1], xs[2], xs[3], 0, 0, ws[2], ws[3], stride.h, stride.w,
             padding.h, padding.w, dilation.h, dilation.w};
  const std::int64_t eff_h = dilation.h * (g.kh - 1) + 1, eff_w = dilation.w * (g.kw - 1) + 1;
  if (xs[2] + 2 * padding.h < eff_h || xs[3] + 2 * padding.w < eff_w)
    throw ShapeError(detail::concat("conv2d: input ", shape_str(xs), " padded by ", pair_str(padding),
                                    " is smaller than the dilated kernel (", eff_h, ", ", eff_w, ") of weight ",
                                    shape_str(ws)));
  g.oh = (xs[2] + 2 * padding.h - eff_h) / stride.h + 1;
  g.ow = (xs[3] + 2 * padding.w - eff_w) / stride.w + 1;
  const bool has_bias = bias.defined();
  if (has_bias) {
    check_float(bias, "conv2d", "bias");
    check_same_device(x, bias, "conv2d");
    if (bias.dim() != 1 || bias.numel() != oc)
      throw ShapeError(detail::concat("conv2d: bias ", shape_str(bias.shape()), " does not match out_channels = ",
                                      oc, " of weight ", shape_str(ws)));
  }

  const std::int64_t ocg = oc / groups, kg = ws[1] * g.kh * g.kw, L = g.oh * g.ow, image = g.c * g.h * g.w;
  Tensor out = Tensor::empty({g.n, oc, g.oh, g.ow}, DType::Float32, x.device());
  DeviceKernels& k = kernels_for(x.device());
  const bool direct = pointwise(g);
  Tensor col = direct || g.n == 0 ? Tensor() : Tensor::empty({g.c * g.kh * g.kw, L}, DType::Float32, x.device());
  for (std::int64_t n = 0; n < g.n; ++n) {
    const float* cp = dptr(x) + n * image;
    if (!direct) {
      k.im2col(x, n, g, col);
      cp = dptr(col);
    }
    for (std::int64_t gi = 0; gi < groups; ++gi)
      k.gemm(false, false, ocg, L, kg, 1.f, dptr(weight) + gi * ocg * kg, kg, cp + gi * kg * L, L,
             0.f, dptr(out) + (n * oc + gi * ocg) * L, L);
  }
  if (has_bias) k.add_channel_bias(bias, g.n, L, out);
  if (grad_mode_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (has_bias && bias.requires_grad()))) {
    auto node = std::make_shared<Conv2dBackward>(x.detach(), weight.detach(), g, groups, has_bias);
    autograd::record(node, {&x, &weight, has_bias ? &bias : nullptr}, out);
  }
  return out;
}

}  // namespace phalanx
