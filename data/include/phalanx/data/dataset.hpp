#pragma once
// Datasets: indexable (features, label) pairs that write a batch straight into
// preallocated tensors (no per-sample allocation).
#include <cstdint>
#include <memory>
#include <mutex>
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
  /// The features' dtype (token ids for an Embedding are int64); the DataLoader's x has it.
  virtual DType feature_dtype() const { return DType::Float32; }
  virtual DType label_dtype() const { return DType::Int64; }
  /// Writes samples idx[0..count) into rows 0..count) of x and y (already allocated).
  virtual void gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const = 0;
};

using DatasetPtr = std::shared_ptr<Dataset>;

/// One sample of a map-style dataset: features and label (a scalar int64 tensor for a class
/// index).
struct Example {
  Tensor x, y;
};

/// PyTorch's map-style dataset: implement get(i) and size(); the DataLoader batches the
/// examples (with any sampler). Every example must have example 0's shapes and dtypes
/// (features float32, as the DataLoader's batches; tensors on the CPU):
///
///   struct Squares : samplers::MapDataset {
///     std::int64_t size() const override { return 100; }
///     samplers::Example get(std::int64_t i) const override {  // features [1], label a class index
///       return {full({1}, static_cast<double>(i)), full({}, static_cast<double>(i % 2), DType::Int64)};
///     }
///   };
///
/// gather() writes each example straight into its row of the batch tensors; get() may be
/// called from the DataLoader's prefetch thread, so it must be safe to call concurrently
/// with itself when prefetch > 0.
class MapDataset : public Dataset {
 public:
  virtual Example get(std::int64_t index) const = 0;
  /// From example 0, read once.
  Shape feature_shape() const override;
  Shape label_shape() const override;
  DType feature_dtype() const override;
  DType label_dtype() const override;
  /// ValueError naming the index and both shapes (or dtypes) for an example unlike example 0.
  void gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const override;

 private:
  struct Layout {
    Shape x_shape, y_shape;
    DType x_dtype = DType::Float32, y_dtype = DType::Int64;
  };
  const Layout& layout() const;
  mutable std::once_flag layout_once_;
  mutable Layout layout_;
};

/// In-memory features [N, ...] and labels [N, ...]. With num_classes > 0, integer labels
/// are checked to be in [0, num_classes).
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor features, Tensor labels, std::int64_t num_classes = 0);
  std::int64_t size() const override { return n_; }
  Shape feature_shape() const override;
  Shape label_shape() const override;
  DType feature_dtype() const override { return features_.dtype(); }
  DType label_dtype() const override { return labels_.dtype(); }
  void gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const override;
  const Tensor& features() const { return features_; }
  const Tensor& labels() const { return labels_; }

 private:
  Tensor features_, labels_;
  std::int64_t n_;
};

/// One array from "F.npy", or from the member KEY of an .npz archive written "F.npz:KEY"
/// (errors name the file, and list the members when KEY is missing).
Tensor load_array(const std::string& spec);

struct NpyDatasetOptions {
  std::int64_t num_classes = 0;  ///< > 0: labels must be integers in [0, num_classes)
  /// Scan the features for NaN/inf (one pass over the data); a non-finite value is an error
  /// naming the file, the row and the column. Turn off to skip the pass for huge data.
  bool check_finite = true;
};

/// Features and labels from two arrays, each "F.npy" or "F.npz:KEY" (features float32 or
/// float64 [N, ...]; integer labels [N]). Float labels are an error that names the stored
/// dtype and the conversion to int64 when num_classes > 0.
std::shared_ptr<TensorDataset> load_npy_dataset(const std::string& features, const std::string& labels,
                                                const NpyDatasetOptions& options);
std::shared_ptr<TensorDataset> load_npy_dataset(const std::string& features, const std::string& labels,
                                                std::int64_t num_classes = 0);

}  // namespace phalanx::samplers
