#pragma once
// phalanx-train's configuration: command-line options and the keys of a JSON config file
// (the same names without the dashes, e.g. {"global-batch": 256, "model": "64-32-10"}); the model
// may also be an object: {"model": {"conv": [32, 64], "classes": 10}} or {"model": {"widths": [784, 10]}}.
// Command-line values override the file's.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace phalanx::trainer {

struct TrainConfig {
  std::string train_x, train_y, dataset;  // dataset: "fashion-mnist[:DIR]", "text:F[,F...]" or "fortunes"
  std::string test_x, test_y;
  std::string model_text = "64-32-10";        ///< --model as given
  std::vector<std::int64_t> model{64, 32, 10};  ///< an MLP's layer widths (empty for a CNN)
  std::vector<std::int64_t> cnn_channels;       ///< --model cnn:C1-C2...: conv channels (empty for an MLP)
  std::int64_t cnn_classes = 0;                 ///< cnn:...:K; 0 = the dataset's
  /// --model gpt:L-H-W:C: nanoGPT's GPT (layers 0 when the model is not one).
  std::int64_t gpt_layers = 0, gpt_heads = 0, gpt_width = 0, gpt_context = 0;
  bool is_gpt() const { return gpt_layers > 0; }
  std::int64_t stride = 0;     ///< --stride: bytes between text windows (0: the context)
  double dropout = 0;          ///< --dropout: the GPT's dropout probability
  double clip_grad_norm = 0;   ///< --clip-grad-norm: the gradients' 2-norm at most this (0: off)
  double beta1 = 0.9, beta2 = 0.999;  ///< --beta1/--beta2: Adam's and AdamW's betas
  /// --classes C: the number of classes, for labels that do not show every class (0: the
  /// largest label + 1). The model's last width (a CNN's K) must be C.
  std::int64_t classes = 0;
  bool sync_bn = false;  ///< --sync-bn: BatchNorm -> parallel::SyncBatchNorm (statistics over the global batch)
  bool zero = false;     ///< --zero: the optimizer state sharded over the ranks (ZeroRedundancyOptimizer)
  /// --precision: fp32 (no autocast), bf16 (forward and loss under autocast bfloat16) or fp16
  /// (autocast float16 with a GradScaler; not on the CPU). docs/trainer.md, *Precision*.
  std::string precision = "fp32";
  bool is_cnn() const { return !cnn_channels.empty(); }
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
  std::string save, metrics, plot, tensorboard;
  bool eval_train = false;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;  ///< steps; 0 = at the end of each epoch when a dir is given
  int keep_checkpoints = 3;           ///< --keep-checkpoints: how many complete checkpoints stay on disk
  bool resume = false;                ///< --resume: resume from the latest checkpoint if one exists, else start fresh
  std::string resume_from;            ///< --resume-from PATH: this checkpoint; an error when it does not exist
  // learning-rate schedule after the warmup: constant | cosine | step | multistep
  std::string lr_schedule = "constant";
  std::int64_t lr_step_size = 0;             ///< step: decay every N steps
  std::vector<std::int64_t> lr_milestones;   ///< multistep: decay at these steps
  double lr_gamma = 0.1;                     ///< step/multistep: the decay factor
  bool allow_nonfinite = false;  ///< --allow-nonfinite: keep training through a NaN/inf loss
  bool check_data = true;        ///< --no-data-check clears it: skip the non-finite scan of loaded data
  /// --exact: exact mode (docs/exact.md), the same bits on any world size dividing
  /// global_batch / micro_batch; each step runs that many micro-batches of micro_batch samples.
  bool exact = false;
  std::int64_t micro_batch = 0;  ///< --micro-batch M (with --exact): samples per forward/backward
};

/// Parses argv (and --config). Every numeric option is checked against its range, a config
/// file's values on their own first (its errors name it), then the options that only mean
/// something together. When an option is given twice the later value wins (the command
/// line's over the file's). Returns false with `exit_code` set (0 for --help, 2 for an
/// error, already printed as one line). The options themselves: train_options.hpp.
bool parse_config(int argc, char** argv, TrainConfig& out, int& exit_code);

/// "64-32-10" -> {64, 32, 10}; throws ValueError.
std::vector<std::int64_t> parse_widths(const std::string& text);

}  // namespace phalanx::trainer
