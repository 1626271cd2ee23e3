#pragma once
// phalanx-train's data: the training (and optional test) set named by the options,
// checked against the model before any training starts.
#include <memory>

#include <phalanx/samplers.hpp>

#include "train_config.hpp"

namespace phalanx::trainer {

struct Datasets {
  std::shared_ptr<samplers::TensorDataset> train, test;
};

/// Loads --dataset or --train-x/--train-y (and --test-x/--test-y), each F.npy or F.npz:KEY;
/// throws a one-line error when the data does not fit the model (features, label dtype,
/// label range) or, unless --no-data-check, holds a NaN/inf (naming the file and row).
Datasets load_data(const TrainConfig& config);

}  // namespace phalanx::trainer
