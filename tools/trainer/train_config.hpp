#pragma once
// phalanx-train's configuration: command-line options and the keys of a JSON config file
// (the same names without the dashes, e.g. {"global-batch": 256, "model": "64-32-10"}).
// Command-line values override the file's.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace phalanx::trainer {

struct TrainConfig {
  std::string train_x, train_y, dataset;  // dataset: "fashion-mnist[:DIR]"
  std::string test_x, test_y;
  std::vector<std::int64_t> model{64, 32, 10};
  std::string activation = "relu";
  std::string init;
  std::string optimizer = "sgd";
  std::optional<double> lr;
  double momentum = 0, weight_decay = 0;
  bool nesterov = false;
  std::int64_t global_batch = 64;
  std::optional<double> base_lr;
  std::optional<std::int64_t> base_batch;
  std::int64_t warmup_steps = 0;
  int epochs = 1;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
  std::string backend, device = "cpu";
  std::string save, metrics, plot;
  bool eval_train = false;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;  ///< steps; 0 = at the end of each epoch when a dir is given
  bool resume = false;
};

/// Parses argv (and --config). Returns false with `exit_code` set for --help or an error
/// (already printed as one line).
bool parse_config(int argc, char** argv, TrainConfig& out, int& exit_code);

/// "64-32-10" -> {64, 32, 10}; throws ValueError.
std::vector<std::int64_t> parse_widths(const std::string& text);

}  // namespace phalanx::trainer
