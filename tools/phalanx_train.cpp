// phalanx-train: trains an MLP with DDP from the command line or a JSON config.
// See `phalanx-train --help` and docs/trainer.md.
#include <cstdio>

#include <phalanx/phalanx.hpp>

#include "trainer/train_config.hpp"
#include "trainer/trainer_data.hpp"
#include "trainer/trainer.hpp"

int main(int argc, char** argv) {
  phalanx::trainer::TrainConfig config;
  int code = 0;
  if (!phalanx::trainer::parse_config(argc, argv, config, code)) return code;
  try {
    phalanx::trainer::check_data_files(config);  // a usage error, like a bad option: exit 2 at once
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phalanx-train: %s\n", e.what());
    return 2;
  }
  phalanx::set_num_threads(1);
  try {
    return phalanx::trainer::run_training(config);
  } catch (const phalanx::trainer::DataUsageError& e) {  // the data does not fit the options: a usage error
    phalanx::parallel::report_failure(std::current_exception());
    std::fprintf(stderr, "phalanx-train: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    phalanx::parallel::report_failure(std::current_exception());  // the others fail fast, naming this one
    std::fprintf(stderr, "phalanx-train: %s\n", e.what());
    return 1;
  }
}
