#include "train_config.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include <phalanx/core/error.hpp>
#include <phalanx/core/file_safety.hpp>

#include "model_spec.hpp"

namespace phalanx::trainer {

namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// ---- numbers with ranges: "--lr nan: expected a finite number > 0" ----

[[noreturn]] void bad_value(const std::string& option, const std::string& text, const std::string& range) {
  throw ValueError(option + " " + (text.empty() ? "''" : text) + ": expected " + range);
}

// A real number in (lo, hi) or [lo, hi] (open or closed at each end), finite.
double real_in(const std::string& option, const std::string& text, double lo, bool lo_open, double hi, bool hi_open,
               const std::string& range) {
  errno = 0;
  char* end = nullptr;
  const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' || !std::isfinite(v) ||
      (lo_open ? v <= lo : v < lo) || (hi_open ? v >= hi : v > hi))
    bad_value(option, text, range);
  return v;
}

std::int64_t int_in(const std::string& option, const std::string& text, std::int64_t lo, std::int64_t hi,
                    const std::string& range) {
  errno = 0;
  char* end = nullptr;
  const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' || errno == ERANGE || v < lo ||
      v > hi)
    bad_value(option, text, range);
  return v;
}

std::uint64_t uint64_of(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = text.empty() ? 0 : std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])) || *end != '\0' || errno == ERANGE)
    bad_value(option, text, "an integer in [0, 18446744073709551615]");
  return v;
}

std::int64_t positive(const std::string& option, const std::string& text) {
  return int_in(option, text, 1, kInt64Max, "an integer in [1, 9223372036854775807]");
}
std::int64_t non_negative(const std::string& option, const std::string& text) {
  return int_in(option, text, 0, kInt64Max, "an integer in [0, 9223372036854775807]");
}
double positive_real(const std::string& option, const std::string& text) {
  return real_in(option, text, 0, true, HUGE_VAL, false, "a finite number > 0");
}

std::vector<std::int64_t> milestones_of(const std::string& text) {
  const std::string range = "strictly increasing step numbers >= 1, e.g. 100,200,300";
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    errno = 0;
    char* end = nullptr;
    const long long v = part.empty() ? 0 : std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || !std::isdigit(static_cast<unsigned char>(part[0])) || *end != '\0' || errno == ERANGE ||
        v < 1 || (!out.empty() && v <= out.back()))
      bad_value("--lr-milestones", text, range);
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string bytes_str(double b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

// The MLP's float32 weights and their gradients must fit in this machine's memory; a
// parameter count that overflows, or one far too large, is named here rather than ending in
// std::bad_alloc halfway through the set-up.
// For a CNN (conv = true) the widths are its channels from one input channel: a lower bound
// of its 3x3 convolutions' weights (the input's channels and the Linear come with the data).
void check_model_size(const std::string& text, const std::vector<std::int64_t>& w, bool conv = false) {
  std::int64_t params = 0;
  bool overflow = false;
  for (std::size_t i = 0; i + 1 < w.size() && !overflow; ++i) {
    std::int64_t layer = 0;
    overflow = __builtin_mul_overflow(w[i], w[i + 1], &layer) ||
               (conv && __builtin_mul_overflow(layer, std::int64_t{9}, &layer)) ||
               __builtin_add_overflow(layer, w[i + 1], &layer) || __builtin_add_overflow(params, layer, &params);
  }
  if (overflow) throw ValueError("--model " + text + ": the parameter count does not fit in a 64-bit integer");
  const double need = static_cast<double>(params) * 4 * 2;  // float32 weights + their gradients
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const double have = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
  if (have > 0 && need > have)
    throw ValueError("--model " + text + ": " + std::to_string(params) + " parameters need " + bytes_str(need) +
                     " for float32 weights and gradients alone, more than this machine's " + bytes_str(have) +
                     " of memory; use " + (conv ? "fewer channels" : "narrower layers"));
}

// ---- the options ----

// Every numeric option arrives as text and is converted in apply_numbers(), so that a bad
// value in a config file or on the command line gets the same one-line error.
struct RawOptions {
  std::string model = "64-32-10", config;
  std::string lr, momentum, weight_decay, global_batch, base_lr, base_batch, warmup_steps, epochs, seed;
  std::string checkpoint_every, keep_checkpoints, lr_step_size, lr_milestones, lr_gamma, micro_batch, classes;
  bool no_shuffle = false, shuffle = false, no_data_check = false;
};

void add_options(CLI::App& app, TrainConfig& c, RawOptions& r) {
  auto real = [&](const char* name, std::string& into, const char* help, const char* def) {
    return app.add_option(name, into, help)->type_name("FLOAT")->default_str(def);
  };
  auto integer = [&](const char* name, std::string& into, const char* help, const char* def) {
    return app.add_option(name, into, help)->type_name("INT")->default_str(def);
  };
  app.add_option("--config", r.config, "JSON file with options (command-line values win)");
  app.add_option("--train-x", c.train_x, "training features, float32 [N, D]: F.npy or F.npz:KEY");
  app.add_option("--train-y", c.train_y, "training labels, integer [N]: F.npy or F.npz:KEY");
  app.add_option("--dataset", c.dataset, "a built-in dataset instead: fashion-mnist[:DIR]");
  app.add_option("--test-x", c.test_x, "test features: F.npy or F.npz:KEY");
  app.add_option("--test-y", c.test_y, "test labels: F.npy or F.npz:KEY");
  app.add_flag("--no-data-check", r.no_data_check, "skip the scan of the features for NaN/inf (for huge data)");
  app.add_option("--model", r.model, "an MLP's layer widths, e.g. 784-256-10, or a CNN: cnn:32-64[:CLASSES] (conv blocks "
                                     "Conv3x3-BatchNorm-activation-MaxPool2, then Linear)")->capture_default_str();
  integer("--classes", r.classes, "the number of classes, >= 1, when the labels do not show every class (the model "
                                  "must end in it)", "the largest label + 1");
  app.add_flag("--sync-bn", c.sync_bn, "CNN: BatchNorm statistics over the global batch (SyncBatchNorm) instead of each worker's");
  app.add_flag("--zero", c.zero, "shard the optimizer state over the workers (ZeroRedundancyOptimizer, ZeRO stage 1)");
  app.add_option("--activation", c.activation, "relu or tanh")->check(CLI::IsMember({"relu", "tanh"}))->capture_default_str();
  app.add_option("--init", c.init, "initial weights .npz with PyTorch state_dict names (0.weight, ...)");
  integer("--seed", r.seed, "seed of the initialisation and the shuffle, in [0, 2^64)", "0");
  app.add_option("--optimizer", c.optimizer, "sgd, adam or adamw")->check(CLI::IsMember({"sgd", "adam", "adamw"}))->capture_default_str();
  real("--lr", r.lr, "learning rate > 0 (or --base-lr with --base-batch)", "0.1");
  real("--momentum", r.momentum, "SGD momentum, in [0, 1)", "0");
  app.add_flag("--nesterov", c.nesterov, "Nesterov momentum (SGD)");
  real("--weight-decay", r.weight_decay, "weight decay, >= 0", "0");
  integer("--global-batch", r.global_batch, "samples per step over all workers (each gets B / world size), >= 1", "64");
  real("--base-lr", r.base_lr, "linear scaling: the rate tuned at --base-batch, > 0", "none");
  integer("--base-batch", r.base_batch, "linear scaling: the global batch --base-lr was tuned at, >= 1", "none");
  integer("--warmup-steps", r.warmup_steps, "linear warmup over N steps, >= 0", "0");
  app.add_option("--lr-schedule", c.lr_schedule, "after the warmup: constant, cosine (to 0 at the last step), step or multistep")
      ->check(CLI::IsMember({"constant", "cosine", "step", "multistep"}))->capture_default_str();
  integer("--lr-step-size", r.lr_step_size, "step schedule: multiply the lr by --lr-gamma every N steps, >= 1", "none");
  app.add_option("--lr-milestones", r.lr_milestones, "multistep schedule: multiply by --lr-gamma at these steps (A,B,C increasing)")
      ->type_name("LIST")->default_str("none");
  real("--lr-gamma", r.lr_gamma, "step/multistep decay factor, in (0, 1]", "0.1");
  integer("--epochs", r.epochs, "epochs, >= 1", "1");
  app.add_flag("--shuffle", r.shuffle, "shuffle each epoch (the default)");
  app.add_flag("--no-shuffle", r.no_shuffle, "keep the data order");
  app.add_flag("--drop-last", c.drop_last, "drop the last incomplete batch (and the sampler's remainder)");
  app.add_option("--backend", c.backend, "communication backend")->default_str("auto");
  app.add_option("--device", c.device, "cpu, cuda (GPU LOCAL_RANK), cuda:N, or sim (the test device)")->capture_default_str();
  app.add_option("--save", c.save, "write the final weights here (.npz, state_dict names)");
  app.add_option("--metrics", c.metrics, "JSON Lines: one record per step and one per epoch");
  app.add_option("--plot", c.plot, "SVG of the loss curves");
  app.add_flag("--eval-train", c.eval_train, "evaluate the final mean loss over the whole training set");
  app.add_flag("--exact", c.exact, "exact mode: the same weights, bit for bit, on any number of workers that divides "
                                   "the micro-batches of a step (docs/exact.md); needs --micro-batch");
  integer("--micro-batch", r.micro_batch, "exact mode: samples per forward/backward, a divisor of --global-batch", "none");
  app.add_flag("--allow-nonfinite", c.allow_nonfinite, "keep training through a NaN/inf loss (default: stop at that step)");
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "write checkpoints here (rank 0, atomically)");
  integer("--checkpoint-every", r.checkpoint_every, "checkpoint every N steps, >= 0 (0: at the end of every epoch)", "0");
  integer("--keep-checkpoints", r.keep_checkpoints, "complete checkpoints kept on disk, >= 1", "3");
  app.add_flag("--resume", c.resume, "resume from the latest checkpoint in --checkpoint-dir if there is one, else start fresh");
  app.add_option("--resume-from", c.resume_from, "resume from this checkpoint (an error when it does not exist)");
}

// Converts the numeric options that were given, each checked against its range.
void apply_numbers(const CLI::App& app, const RawOptions& r, TrainConfig& c) {
  auto given = [&](const char* name) { return app.count(name) > 0; };
  if (given("--lr")) c.lr = positive_real("--lr", r.lr);
  if (given("--base-lr")) c.base_lr = positive_real("--base-lr", r.base_lr);
  if (given("--base-batch")) c.base_batch = positive("--base-batch", r.base_batch);
  if (given("--momentum")) c.momentum = real_in("--momentum", r.momentum, 0, false, 1, true, "a number in [0, 1)");
  if (given("--weight-decay"))
    c.weight_decay = real_in("--weight-decay", r.weight_decay, 0, false, HUGE_VAL, false, "a finite number >= 0");
  if (given("--global-batch")) c.global_batch = positive("--global-batch", r.global_batch);
  if (given("--warmup-steps")) c.warmup_steps = non_negative("--warmup-steps", r.warmup_steps);
  if (given("--epochs")) c.epochs = static_cast<int>(int_in("--epochs", r.epochs, 1, INT_MAX, "an integer in [1, 2147483647]"));
  if (given("--seed")) c.seed = uint64_of("--seed", r.seed);
  if (given("--checkpoint-every")) c.checkpoint_every = non_negative("--checkpoint-every", r.checkpoint_every);
  if (given("--keep-checkpoints"))
    c.keep_checkpoints = static_cast<int>(int_in("--keep-checkpoints", r.keep_checkpoints, 1, INT_MAX, "an integer in [1, 2147483647]"));
  if (given("--lr-step-size")) c.lr_step_size = positive("--lr-step-size", r.lr_step_size);
  if (given("--lr-milestones")) c.lr_milestones = milestones_of(r.lr_milestones);
  if (given("--micro-batch")) c.micro_batch = positive("--micro-batch", r.micro_batch);
  if (given("--lr-gamma")) c.lr_gamma = real_in("--lr-gamma", r.lr_gamma, 0, true, 1, false, "a number in (0, 1]");
  c.model_text = r.model;
  if (is_cnn_spec(r.model)) {
    const CnnSpec spec = parse_cnn_spec(r.model);
    c.model.clear();
    c.cnn_channels = spec.channels;
    c.cnn_classes = spec.classes;
    std::vector<std::int64_t> chans{1};
    chans.insert(chans.end(), spec.channels.begin(), spec.channels.end());
    check_model_size(r.model, chans, true);
  } else {
    c.model = parse_widths(r.model);
    check_model_size(r.model, c.model);
    c.cnn_channels.clear();
    c.cnn_classes = 0;
  }
  if (given("--classes")) {
    c.classes = positive("--classes", r.classes);
    if (c.is_cnn() && c.cnn_classes == 0) c.cnn_classes = c.classes;  // cnn:32-64 --classes 10 = cnn:32-64:10
    if (c.is_cnn() && c.cnn_classes != c.classes)
      throw ValueError(detail::concat("--classes ", c.classes, " and --model ", r.model, " (", c.cnn_classes,
                                      " classes) disagree: give the number of classes once"));
  }
  if (r.no_shuffle) c.shuffle = false;
  if (r.no_data_check) c.check_data = false;
}

// Rules between options, checked once on the final values.
void check_combination(const CLI::App& app, TrainConfig& c) {
  if (c.dataset.empty() == c.train_x.empty()) throw ValueError("give either --train-x/--train-y or --dataset");
  if (!c.train_x.empty() && c.train_y.empty()) throw ValueError("--train-x needs --train-y");
  if (c.test_x.empty() != c.test_y.empty()) throw ValueError("--test-x and --test-y go together");
  if (c.lr && (c.base_lr || c.base_batch)) throw ValueError("give either --lr or --base-lr with --base-batch, not both");
  if (c.base_lr.has_value() != c.base_batch.has_value()) throw ValueError("--base-lr and --base-batch go together");
  if (!c.lr && !c.base_lr) c.lr = 0.1;
  if (c.base_lr) {  // linear scaling: the rate used is base-lr x global-batch / base-batch
    const double lr = *c.base_lr * static_cast<double>(c.global_batch) / static_cast<double>(*c.base_batch);
    if (!(std::isfinite(lr) && lr > 0))
      throw ValueError(detail::concat("--base-lr ", *c.base_lr, " x --global-batch ", c.global_batch, " / --base-batch ",
                                      *c.base_batch, " gives the rate ", lr,
                                      ", which is not a finite number > 0: lower --base-lr"));
  }
  if (c.resume && c.checkpoint_dir.empty())
    throw ValueError("--resume needs --checkpoint-dir (where checkpoints are written and looked for)");
  if (c.nesterov && (c.optimizer != "sgd" || c.momentum <= 0))
    throw ValueError("--nesterov needs --optimizer sgd and --momentum > 0");
  if (c.checkpoint_dir.empty())
    for (const char* o : {"--checkpoint-every", "--keep-checkpoints"})
      if (app.count(o) > 0) throw ValueError(std::string(o) + " needs --checkpoint-dir");
  const bool step = c.lr_schedule == "step", multistep = c.lr_schedule == "multistep";
  if (step && c.lr_step_size == 0) throw ValueError("--lr-schedule step needs --lr-step-size N");
  if (multistep && c.lr_milestones.empty()) throw ValueError("--lr-schedule multistep needs --lr-milestones A,B,...");
  if (!step && app.count("--lr-step-size") > 0) throw ValueError("--lr-step-size needs --lr-schedule step");
  if (!multistep && app.count("--lr-milestones") > 0) throw ValueError("--lr-milestones needs --lr-schedule multistep");
  if (!step && !multistep && app.count("--lr-gamma") > 0)
    throw ValueError("--lr-gamma needs --lr-schedule step or multistep");
  // Exact mode: the micro-batch is what the user fixes with the global batch; the world
  // size (checked when the workers start) must divide global-batch / micro-batch.
  if (c.micro_batch > 0 && !c.exact)
    throw ValueError("--micro-batch needs --exact (in normal mode each worker's batch is --global-batch / the number of "
                     "workers)");
  if (c.exact && c.micro_batch == 0)
    throw ValueError(detail::concat("--exact needs --micro-batch M: the samples of one forward/backward, a divisor of "
                                    "--global-batch ", c.global_batch));
  if (c.exact && c.global_batch % c.micro_batch != 0)
    throw ValueError(detail::concat("--micro-batch ", c.micro_batch, " does not divide --global-batch ", c.global_batch,
                                    ": choose a divisor of ", c.global_batch));
  if (c.sync_bn && !c.is_cnn())
    throw ValueError("--sync-bn needs a model with BatchNorm: --model cnn:C1-C2... (an MLP has none)");
  if (c.exact && c.is_cnn())
    throw ValueError("--exact and --model " + c.model_text + " conflict: exact mode needs a model without buffers, and the "
                     "CNN's BatchNorm running statistics are buffers; use an MLP or drop --exact");
  if (c.zero && c.exact)
    throw ValueError("--zero and --exact conflict: exact mode reduces gradients in fixed point and updates every "
                     "replica itself; drop one of them");
  if (c.exact && c.allow_nonfinite)
    throw ValueError("--exact and --allow-nonfinite conflict: exact mode sums gradients in fixed point, where NaN and inf "
                     "have no value (a non-finite gradient stops the step); drop one of them");
}

std::string model_text_of(const nlohmann::json& v);

// What a config key's value must be, from its option: a flag takes true/false, a numeric
// option a number (or its text), a list option an array of integers or their text, any
// other option a string.
enum class ConfigKind { Flag, Integer, Real, List, Text };

ConfigKind kind_of(const CLI::Option& opt) {
  if (opt.get_expected_max() == 0) return ConfigKind::Flag;  // a flag takes no value
  const std::string t = opt.get_type_name();
  if (t == "INT") return ConfigKind::Integer;
  if (t == "FLOAT") return ConfigKind::Real;
  if (t == "LIST") return ConfigKind::List;
  return ConfigKind::Text;
}

const char* json_type_name(const nlohmann::json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_null()) return "null";
  return "an object";
}

// "key 'lr' is a boolean (true): expected a number, e.g. "lr": 0.1".
void check_config_type(const std::string& k, const nlohmann::json& v, ConfigKind kind) {
  auto bad = [&](const std::string& expected) {
    throw ValueError("key '" + k + "' is " + json_type_name(v) + " (" + v.dump() + "): expected " + expected);
  };
  switch (kind) {
    case ConfigKind::Flag:
      if (!v.is_boolean()) bad("true or false, e.g. \"" + k + "\": true");
      return;
    case ConfigKind::Integer:
      if (!v.is_number_integer() && !v.is_string()) bad("an integer, e.g. \"" + k + "\": 64");
      return;
    case ConfigKind::Real:
      if (!v.is_number() && !v.is_string()) bad("a number, e.g. \"" + k + "\": 0.1");
      return;
    case ConfigKind::List:
      if (v.is_string()) return;
      if (!v.is_array()) bad("an array of step numbers, e.g. \"" + k + "\": [100, 200]");
      for (const auto& e : v)
        if (!e.is_number_integer()) bad("an array of integer step numbers, e.g. \"" + k + "\": [100, 200]");
      return;
    case ConfigKind::Text:
      if (!v.is_string()) bad("a string, e.g. \"" + k + "\": \"...\"");
      return;
  }
}

// A JSON config's keys as argv-style "--key value" pairs, so one parser serves both.
std::vector<std::string> config_args(const std::string& path, const CLI::App& app) {
  try {
    files::check_regular(path);  // a FIFO would block the open, /dev/zero be read without end
  } catch (const IoError& e) {
    const std::string m = e.what();  // "PATH: why": the caller names the file already
    throw ValueError(m.rfind(path + ": ", 0) == 0 ? m.substr(path.size() + 2) : m);
  }
  std::ifstream f(path);
  if (!f) throw ValueError("cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw ValueError("expected a JSON object of options");
  std::vector<std::string> args;
  for (auto& [k, v] : j.items()) {
    if (k == "config") throw ValueError("'config' cannot name another file");
    if (k == "help") throw ValueError("'help' is not a setting (run phalanx-train --help)");
    if (k.empty() || k[0] == '-' || !app.get_option_no_throw("--" + k))
      throw ValueError("unknown option '" + k + "' (the keys are phalanx-train's options without the dashes)");
    if (k == "model" && v.is_object()) {  // {"conv": [32, 64], "classes": 10} or {"widths": [784, 10]}
      args.push_back("--model");
      args.push_back(model_text_of(v));
      continue;
    }
    const ConfigKind kind = kind_of(*app.get_option_no_throw("--" + k));
    check_config_type(k, v, kind);
    if (kind == ConfigKind::Flag) {
      if (v.get<bool>()) args.push_back("--" + k);
      else if (k == "shuffle") args.push_back("--no-shuffle");
      continue;
    }
    args.push_back("--" + k);
    if (v.is_string()) {
      args.push_back(v.get<std::string>());
    } else if (v.is_number()) {
      args.push_back(v.dump());
    } else {  // lr-milestones as a JSON array of step numbers
      std::string list;
      for (const auto& e : v) list += (list.empty() ? "" : ",") + e.dump();
      args.push_back(list);
    }
  }
  return args;
}

// The object form of "model": {"conv": [32, 64], "classes": 10} (a CNN) or {"widths": [784, 256, 10]}.
std::string model_text_of(const nlohmann::json& v) {
  const std::string form = "expected {\"conv\": [32, 64], \"classes\": 10} (classes optional) or {\"widths\": [784, 256, 10]}";
  auto list = [&](const nlohmann::json& a) {
    if (!a.is_array() || a.empty()) throw ValueError("option 'model': " + form + ", got " + v.dump());
    std::string out;
    for (const auto& e : a) {
      if (!e.is_number_unsigned() || e.get<std::uint64_t>() == 0)
        throw ValueError("option 'model': every width or channel count must be an integer >= 1, got " + e.dump());
      out += (out.empty() ? "" : "-") + e.dump();
    }
    return out;
  };
  for (auto& [key, val] : v.items())
    if (key != "conv" && key != "classes" && key != "widths")
      throw ValueError("option 'model': unknown key '" + key + "'; " + form);
  if (v.contains("widths")) {
    if (v.size() != 1) throw ValueError("option 'model': 'widths' (an MLP) goes alone; " + form);
    return list(v["widths"]);
  }
  if (!v.contains("conv")) throw ValueError("option 'model': " + form + ", got " + v.dump());
  std::string text = "cnn:" + list(v["conv"]);
  if (v.contains("classes")) {
    const auto& k = v["classes"];
    if (!k.is_number_unsigned() || k.get<std::uint64_t>() == 0)
      throw ValueError("option 'model': 'classes' must be an integer >= 1, got " + k.dump());
    text += ":" + k.dump();
  }
  return text;
}

// "--lr -0.1" as "--lr=-0.1": CLI11 would read "-inf" or "-1e3" as short options.
std::vector<std::string> join_negative_values(const std::vector<std::string>& args, const CLI::App& app) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const bool option = args[i].rfind("--", 0) == 0 && args[i].find('=') == std::string::npos;
    const CLI::Option* opt = option ? app.get_option_no_throw(args[i]) : nullptr;
    if (opt && opt->get_expected_max() != 0 && i + 1 < args.size() && args[i + 1].size() > 1 && args[i + 1][0] == '-' &&
        args[i + 1][1] != '-') {
      out.push_back(args[i] + "=" + args[i + 1]);
      ++i;
    } else {
      out.push_back(args[i]);
    }
  }
  return out;
}

// One CLI11 parse of `args` into `c` (numbers converted and range-checked).
void parse_args(std::vector<std::string> args, TrainConfig& c, CLI::App& app, RawOptions& r) {
  args = join_negative_values(args, app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.allow_extras(false);
  for (auto* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.parse(reversed);
  apply_numbers(app, r, c);
  // --shuffle and --no-shuffle are two flags: the later one wins (a config file's
  // "shuffle": false comes before the command line's --shuffle).
  for (auto it = args.rbegin(); it != args.rend(); ++it)
    if (*it == "--shuffle" || *it == "--no-shuffle") {
      c.shuffle = *it == "--shuffle";
      break;
    }
}

const char* kDescription =
    "phalanx-train: train an MLP or a small CNN with DDP, alone or under phalanx-run.\n"
    "Every option can also come from --config F.json (the same names without dashes).\n"
    "Numbers are checked against the ranges below; a bad one is an error (exit 2).";

}  // namespace

std::vector<std::int64_t> parse_widths(const std::string& text) {
  std::vector<std::int64_t> w;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto dash = text.find('-', start);
    const std::string part = text.substr(start, dash == std::string::npos ? std::string::npos : dash - start);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos)
      throw ValueError("--model '" + text + "' must be positive layer widths joined by '-', e.g. 64-32-10");
    errno = 0;
    const long long v = std::strtoll(part.c_str(), nullptr, 10);
    if (errno == ERANGE)
      throw ValueError("--model '" + text + "': width " + part + " does not fit in a 64-bit integer");
    if (v < 1) throw ValueError("--model '" + text + "' must be positive layer widths joined by '-', e.g. 64-32-10");
    w.push_back(v);
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (w.size() < 2) throw ValueError("--model '" + text + "' needs at least an input and an output width");
  return w;
}

bool parse_config(int argc, char** argv, TrainConfig& c, int& exit_code) {
  CLI::App app{kDescription, "phalanx-train"};
  RawOptions raw;
  add_options(app, c, raw);
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "phalanx-train: %s\n", msg.c_str());
    exit_code = 2;
    return false;
  };
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    // A config file first, checked on its own so that its errors name it; then the
    // command line on top of it (later values win).
    std::string config;
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--config" && i + 1 < args.size()) config = args[i + 1];
      if (args[i].rfind("--config=", 0) == 0) config = args[i].substr(9);
    }
    if (!config.empty()) {
      std::vector<std::string> from_file;
      try {
        CLI::App file_app{kDescription, "phalanx-train"};
        TrainConfig scratch;
        RawOptions file_raw;
        add_options(file_app, scratch, file_raw);
        from_file = config_args(config, file_app);
        parse_args(from_file, scratch, file_app, file_raw);
      } catch (const CLI::ParseError& e) {
        return fail("--config " + config + ": " + e.what());
      } catch (const std::exception& e) {
        return fail("--config " + config + ": " + e.what());
      }
      args.insert(args.begin(), from_file.begin(), from_file.end());
    }
    parse_args(args, c, app, raw);
    check_combination(app, c);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      exit_code = app.exit(e);
      return false;
    }
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return true;
}

}  // namespace phalanx::trainer
