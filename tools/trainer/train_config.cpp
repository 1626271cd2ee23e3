#include "train_config.hpp"

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include <phalanx/core/error.hpp>

namespace phalanx::trainer {

std::vector<std::int64_t> parse_widths(const std::string& text) {
  std::vector<std::int64_t> w;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto dash = text.find('-', start);
    const std::string part = text.substr(start, dash == std::string::npos ? std::string::npos : dash - start);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || std::stoll(part) < 1)
      throw ValueError("--model '" + text + "' must be positive layer widths joined by '-', e.g. 64-32-10");
    w.push_back(std::stoll(part));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (w.size() < 2) throw ValueError("--model '" + text + "' needs at least an input and an output width");
  return w;
}

namespace {

// Applies a JSON config's keys to argv-style "--key value" pairs, so one parser serves both.
std::vector<std::string> config_args(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ValueError("--config " + path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError("--config " + path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw ValueError("--config " + path + ": expected a JSON object of options");
  std::vector<std::string> args;
  for (auto& [k, v] : j.items()) {
    if (v.is_boolean()) {
      if (v.get<bool>()) args.push_back("--" + k);
      else if (k == "shuffle") args.push_back("--no-shuffle");
      continue;
    }
    args.push_back("--" + k);
    if (v.is_string()) args.push_back(v.get<std::string>());
    else if (v.is_number_integer()) args.push_back(std::to_string(v.get<long long>()));
    else if (v.is_number()) args.push_back(v.dump());
    else throw ValueError("--config " + path + ": option '" + k + "' must be a string, number or boolean");
  }
  return args;
}

}  // namespace

bool parse_config(int argc, char** argv, TrainConfig& c, int& exit_code) {
  CLI::App app{"phalanx-train: train an MLP with DDP, alone or under phalanx-run.\n"
               "Every option can also come from --config F.json (the same names without dashes).",
               "phalanx-train"};
  std::string model = "64-32-10", config;
  double lr = -1, base_lr = -1;
  std::int64_t base_batch = -1;
  bool no_shuffle = false, shuffle = false;
  app.add_option("--config", config, "JSON file with options (command-line values win)");
  app.add_option("--train-x", c.train_x, "training features, float32 .npy [N, D]");
  app.add_option("--train-y", c.train_y, "training labels, integer .npy [N]");
  app.add_option("--dataset", c.dataset, "a built-in dataset instead: fashion-mnist[:DIR]");
  app.add_option("--test-x", c.test_x, "test features .npy");
  app.add_option("--test-y", c.test_y, "test labels .npy");
  app.add_option("--model", model, "layer widths, e.g. 64-32-10")->capture_default_str();
  app.add_option("--activation", c.activation, "relu or tanh")->check(CLI::IsMember({"relu", "tanh"}))->capture_default_str();
  app.add_option("--init", c.init, "initial weights .npz with PyTorch state_dict names (0.weight, ...)");
  app.add_option("--seed", c.seed, "seed of the initialisation and the shuffle")->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "sgd, adam or adamw")->check(CLI::IsMember({"sgd", "adam", "adamw"}))->capture_default_str();
  app.add_option("--lr", lr, "learning rate (or use --base-lr/--base-batch)");
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--nesterov", c.nesterov, "Nesterov momentum (SGD)");
  app.add_option("--weight-decay", c.weight_decay, "weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--global-batch", c.global_batch, "samples per step over all workers (each gets B / world size)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--base-lr", base_lr, "linear scaling: the rate tuned at --base-batch")->check(CLI::PositiveNumber);
  app.add_option("--base-batch", base_batch, "linear scaling: the global batch --base-lr was tuned at")->check(CLI::PositiveNumber);
  app.add_option("--warmup-steps", c.warmup_steps, "linear warmup over N steps")->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", c.epochs, "epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--shuffle", shuffle, "shuffle each epoch (default)");
  app.add_flag("--no-shuffle", no_shuffle, "keep the data order");
  app.add_flag("--drop-last", c.drop_last, "drop the last incomplete batch (and the sampler's remainder)");
  app.add_option("--backend", c.backend, "communication backend (default: auto)");
  app.add_option("--device", c.device, "cpu or cuda")->capture_default_str();
  app.add_option("--save", c.save, "write the final weights here (.npz, state_dict names)");
  app.add_option("--metrics", c.metrics, "JSON Lines: one record per step and one per epoch");
  app.add_option("--plot", c.plot, "SVG of the loss curves");
  app.add_flag("--eval-train", c.eval_train, "evaluate the final mean loss over the whole training set");
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "write checkpoints here (rank 0, atomically)");
  app.add_option("--checkpoint-every", c.checkpoint_every, "checkpoint every N steps (default: every epoch)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", c.resume, "continue from the checkpoint in --checkpoint-dir");

  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "phalanx-train: %s\n", msg.c_str());
    exit_code = 2;
    return false;
  };
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    // A config file first, then the command line on top (later values win).
    for (std::size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == "--config") {
        auto from_file = config_args(args[i + 1]);
        args.insert(args.begin(), from_file.begin(), from_file.end());
        break;
      }
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.allow_extras(false);
    for (auto* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      exit_code = app.exit(e);
      return false;
    }
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  try {
    c.model = parse_widths(model);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (no_shuffle) c.shuffle = false;
  if (lr > 0) c.lr = lr;
  if (base_lr > 0) c.base_lr = base_lr;
  if (base_batch > 0) c.base_batch = base_batch;
  if (c.dataset.empty() == c.train_x.empty()) return fail("give either --train-x/--train-y or --dataset");
  if (!c.train_x.empty() && c.train_y.empty()) return fail("--train-x needs --train-y");
  if (c.test_x.empty() != c.test_y.empty()) return fail("--test-x and --test-y go together");
  if (c.lr && (c.base_lr || c.base_batch)) return fail("give either --lr or --base-lr with --base-batch, not both");
  if (c.base_lr.has_value() != c.base_batch.has_value()) return fail("--base-lr and --base-batch go together");
  if (!c.lr && !c.base_lr) c.lr = 0.1;
  if (c.resume && c.checkpoint_dir.empty()) return fail("--resume needs --checkpoint-dir");
  if (c.nesterov && (c.optimizer != "sgd" || c.momentum <= 0)) return fail("--nesterov needs --optimizer sgd and --momentum > 0");
  return true;
}

}  // namespace phalanx::trainer
