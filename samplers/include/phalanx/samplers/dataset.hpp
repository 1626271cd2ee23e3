#pragma once
// Datasets: indexable (features, label) pairs that write a batch straight into
// preallocated tensors (no per-sample allocation).
#include <cstdint>
#include <memory>
#include <string>

#include "phalanx/core/tensor.hpp"

namespace phalanx::samplers {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  /// Shape of one sample's features, and of one label ({} for a class index).
  virtual Shape feature_shape() const = 0;
  virtual Shape label_shape() const { return {}; }
  virtual DType label_dtype() const { return DType::Int64; }
  /// Writes samples idx[0..count) into rows 0..count) of x and y (already allocated).
  virtual void gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const = 0;
};

using DatasetPtr = std::shared_ptr<Dataset>;

/// In-memory features [N, ...] and labels [N, ...]. With num_classes > 0, integer labels
/// are checked to be in [0, num_classes).
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor features, Tensor labels, std::int64_t num_classes = 0);
  std::int64_t size() const override { return n_; }
  Shape feature_shape() const override;
  Shape label_shape() const override;
  DType label_dtype() const override { return labels_.dtype(); }
  void gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const override;
  const Tensor& features() const { return features_; }
  const Tensor& labels() const { return labels_; }

 private:
  Tensor features_, labels_;
  std::int64_t n_;
};

/// Features and labels from two .npy files (float32 [N, D]; integer labels [N]).
std::shared_ptr<TensorDataset> load_npy_dataset(const std::string& features_path,
                                                const std::string& labels_path,
                                                std::int64_t num_classes = 0);

}  // namespace phalanx::samplers
