#include "phalanx/samplers/dataset.hpp"

#include <cstring>

#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/npy.hpp"

namespace phalanx::samplers {

TensorDataset::TensorDataset(Tensor features, Tensor labels, std::int64_t num_classes)
    : features_(std::move(features)), labels_(std::move(labels)) {
  if (!features_.defined() || !labels_.defined()) throw ValueError("TensorDataset: undefined tensor");
  if (features_.dim() < 1 || labels_.dim() < 1)
    throw ShapeError("TensorDataset: features and labels need a leading sample dimension, got " +
                     shape_str(features_.shape()) + " and " + shape_str(labels_.shape()));
  n_ = features_.shape()[0];
  if (labels_.shape()[0] != n_)
    throw ShapeError(detail::concat("TensorDataset: ", n_, " feature rows but ",
                                    labels_.shape()[0], " labels"));
  if (n_ == 0) throw ValueError("TensorDataset: the dataset is empty");
  if (!features_.device().is_cpu() || !labels_.device().is_cpu())
    throw TypeError("TensorDataset: data must be on the CPU (batches are moved by the trainer)");
  if (num_classes > 0) {
    if (labels_.dtype() != DType::Int64)
      throw TypeError("TensorDataset: class labels must be integers, got float32");
    const std::int64_t bad = kernels_for(Device::cpu()).find_label_out_of_range(labels_, num_classes);
    if (bad >= 0)
      throw ValueError(detail::concat("TensorDataset: label[", bad, "] = ",
                                      labels_.data<std::int64_t>()[bad],
                                      " is outside [0, ", num_classes, ")"));
  }
}

Shape TensorDataset::feature_shape() const { return Shape(features_.shape().begin() + 1, features_.shape().end()); }
Shape TensorDataset::label_shape() const { return Shape(labels_.shape().begin() + 1, labels_.shape().end()); }

void TensorDataset::gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const {
  const std::size_t xrow = features_.nbytes() / n_, yrow = labels_.nbytes() / n_;
  const auto* xs = static_cast<const char*>(features_.raw_data());
  const auto* ys = static_cast<const char*>(labels_.raw_data());
  auto* xd = static_cast<char*>(x.raw_data());
  auto* yd = static_cast<char*>(y.raw_data());
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t k = idx[i];
    if (k < 0 || k >= n_)
      throw ValueError(detail::concat("dataset index ", k, " is outside [0, ", n_, ")"));
    std::memcpy(xd + i * xrow, xs + k * xrow, xrow);
    std::memcpy(yd + i * yrow, ys + k * yrow, yrow);
  }
}

std::shared_ptr<TensorDataset> load_npy_dataset(const std::string& fpath, const std::string& lpath,
                                                std::int64_t num_classes) {
  Tensor x = load_npy(fpath);
  Tensor y = load_npy(lpath);
  if (x.dtype() != DType::Float32)
    throw TypeError(fpath + ": features must be floating point");
  if (x.dim() < 1 || y.dim() < 1 || x.shape()[0] != y.shape()[0])
    throw ShapeError(fpath + " and " + lpath + ": " + shape_str(x.shape()) + " features but " +
                     shape_str(y.shape()) + " labels; the first dimensions must agree");
  return std::make_shared<TensorDataset>(x, y, num_classes);
}

}  // namespace phalanx::samplers
