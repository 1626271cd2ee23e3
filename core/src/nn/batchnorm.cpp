#include "phalanx/core/nn/batchnorm.hpp"

#include <sstream>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

BatchNorm::BatchNorm(std::int64_t num_features_, double eps_, std::optional<double> momentum_, bool affine_,
                     bool track)
    : num_features(num_features_), eps(eps_), momentum(momentum_), affine(affine_), track_running_stats(track) {
  if (num_features <= 0)
    throw ValueError(detail::concat("BatchNorm: num_features must be positive, got ", num_features));
  if (!(eps > 0)) throw ValueError(detail::concat("BatchNorm: eps must be > 0, got ", eps));
  if (momentum && !(*momentum >= 0 && *momentum <= 1))
    throw ValueError(detail::concat("BatchNorm: momentum must be in [0, 1] (or nullopt for a cumulative average), got ",
                                    *momentum));
  if (affine) {
    weight = register_parameter("weight", Tensor::empty({num_features}));
    bias = register_parameter("bias", Tensor::empty({num_features}));
  }
  if (track) {
    running_mean = register_buffer("running_mean", Tensor::empty({num_features}));
    running_var = register_buffer("running_var", Tensor::empty({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", Tensor::empty({}, DType::Int64));
  }
  reset_parameters();
}

void BatchNorm::reset_running_stats() {
  if (!track_running_stats) return;
  running_mean.zero_();
  running_var.fill_(1.0);
  num_batches_tracked.zero_();
}

void BatchNorm::reset_parameters() {
  reset_running_stats();
  if (affine) {
    NoGradGuard ng;
    weight.fill_(1.0);
    bias.zero_();
  }
}

void BatchNorm::check_input_dim(const Tensor& x) const {
  if (x.dim() < 2)
    throw ShapeError(detail::concat(kind(), ": expected input [N, C, *], got ", shape_str(x.shape())));
}

void BatchNorm1d::check_input_dim(const Tensor& x) const {
  if (x.dim() != 2 && x.dim() != 3)
    throw ShapeError(detail::concat("BatchNorm1d: expected 2D or 3D input [N, C] or [N, C, L] (got ", x.dim(),
                                    "D input ", shape_str(x.shape()), ")"));
}

void BatchNorm2d::check_input_dim(const Tensor& x) const {
  if (x.dim() != 4)
    throw ShapeError(detail::concat("BatchNorm2d: expected 4D input [N, C, H, W] (got ", x.dim(), "D input ",
                                    shape_str(x.shape()), ")"));
}

double BatchNorm::next_average_factor() {
  if (!is_training() || !track_running_stats) return 0.0;
  const Device d = num_batches_tracked.device();
  if (!one_.defined() || one_.device() != d) one_ = full({1}, 1.0, DType::Float32, d);
  kernels_for(d).fixed_point_accumulate(one_, 1.0, num_batches_tracked);  // += 1, on the device
  if (momentum) return *momentum;
  return 1.0 / static_cast<double>(num_batches_tracked.item_int());
}

void BatchNorm::update_running_stats(const Tensor& mean, const Tensor& var, std::int64_t count, double factor) {
  if (!track_running_stats) return;
  if (count <= 1)
    throw ValueError(detail::concat(kind(), ": expected more than 1 value per channel when training, got ", count));
  DeviceKernels& k = kernels_for(running_mean.device());
  const float f = static_cast<float>(factor);
  k.scale(running_mean, 1.f - f);
  k.axpy(f, mean, running_mean);
  k.scale(running_var, 1.f - f);
  k.axpy(static_cast<float>(factor * static_cast<double>(count) / static_cast<double>(count - 1)), var, running_var);
}

Tensor BatchNorm::forward(const Tensor& x) {
  check_input_dim(x);
  if (x.dim() >= 2 && x.shape()[1] != num_features)
    throw ShapeError(detail::concat(kind(), "(", num_features, "): input ", shape_str(x.shape()), " has ",
                                    x.shape()[1], " channels (dim 1), expected ", num_features));
  if (!uses_batch_stats()) return batch_norm(x, running_mean, running_var, weight, bias, false, 0.0, eps);
  std::int64_t per_channel = x.shape()[0];
  for (std::int64_t i = 2; i < x.dim(); ++i) per_channel *= x.shape()[i];
  if (per_channel == 0) {
    // PyTorch: an empty batch gives an empty output, counts a step, leaves the running stats as
    // they are, and gives weight and bias zero gradients (the eval path over no values does).
    next_average_factor();
    const Device d = x.device();
    return batch_norm(x, track_running_stats ? running_mean : zeros({num_features}, DType::Float32, d),
                      track_running_stats ? running_var : full({num_features}, 1.0, DType::Float32, d), weight, bias,
                      false, 0.0, eps);
  }
  if (per_channel <= 1)  // checked before the counter moves
    throw ValueError(detail::concat(kind(), ": expected more than 1 value per channel when training, got input size ",
                                    shape_str(x.shape()), " (use a batch of 2 or more, or eval mode)"));
  const double factor = next_average_factor();
  const bool track = track_running_stats;
  return batch_norm(x, track ? running_mean : Tensor(), track ? running_var : Tensor(), weight, bias, true, factor,
                    eps);
}

std::string BatchNorm::describe() const {
  std::ostringstream os;
  os << kind() << "(" << num_features << ", eps=" << eps << ", momentum=";
  if (momentum)
    os << *momentum;
  else
    os << "None";
  os << ", affine=" << (affine ? "True" : "False")
     << ", track_running_stats=" << (track_running_stats ? "True" : "False") << ")";
  return os.str();
}

void BatchNorm::on_parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "weight")
    weight = t;
  else if (name == "bias")
    bias = t;
}

}  // namespace phalanx::nn
