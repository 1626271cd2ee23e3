#pragma once
// IDX files (the MNIST format), plain or gzip-compressed (through zlib), and the
// (Fashion-)MNIST datasets built from them. Debian's dataset-fashion-mnist installs the
// files under /usr/share/datasets/fashion-mnist.
#include <memory>
#include <string>

#include "phalanx/core/tensor.hpp"
#include "phalanx/data/dataset.hpp"

namespace phalanx::samplers {

/// Reads an unsigned-byte IDX file: images [N, rows, cols] or labels [N], as int64 values.
Tensor load_idx(const std::string& path);

struct MnistOptions {
  bool train = true;       ///< train-* (60 000) or t10k-* (10 000) files
  bool normalize = true;   ///< pixels / 255, then (v - mean) / std when standardize
  bool standardize = false;
  float mean = 0.2860f;    ///< Fashion-MNIST's training-set mean and std after / 255
  float std = 0.3530f;
  bool flatten = true;     ///< [N, 784] instead of [N, 28, 28]
};

/// Fashion-MNIST or MNIST from `dir` (the four IDX files, .gz or not).
std::shared_ptr<TensorDataset> load_mnist(const std::string& dir, const MnistOptions& options = {});

/// Debian's install location of Fashion-MNIST.
inline const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace phalanx::samplers
