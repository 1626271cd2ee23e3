#pragma once
#include "train_config.hpp"

namespace phalanx::trainer {

/// Validates the data and options (one-line errors before any training), trains, writes
/// the outputs. Returns the process exit code.
int run_training(const TrainConfig& config);

}  // namespace phalanx::trainer
