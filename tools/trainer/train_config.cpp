#include "train_config.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include <phalanx/core/error.hpp>
#include <phalanx/core/file_safety.hpp>

#include "precision.hpp"
#include "text_format.hpp"
#include "train_options.hpp"

namespace phalanx::trainer {

namespace {

// ---- the command line, made from the table of options (train_options.cpp) ----

// Where CLI11 puts each option's value, by its index in train_options(); every value
// arrives as text and the option's apply() converts and range-checks it, so that a bad value
// in a config file or on the command line gets the same one-line error.
struct BoundOptions {
  struct Slot {
    std::string text;
    bool on = false;  ///< a flag given
  };
  std::string config;
  std::vector<Slot> slots = std::vector<Slot>(train_options().size());
};

const char* type_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::Integer:
      return "INT";
    case OptionKind::Real:
      return "FLOAT";
    case OptionKind::List:
      return "LIST";
    default:
      return "TEXT";
  }
}

void add_options(CLI::App& app, BoundOptions& b) {
  app.add_option("--config", b.config, "JSON file with options (command-line values win)");
  const auto& options = train_options();
  for (std::size_t i = 0; i < options.size(); ++i) {
    const OptionSpec& o = options[i];
    if (o.kind == OptionKind::Flag) {
      app.add_flag(o.name, b.slots[i].on, o.help);
      continue;
    }
    CLI::Option* opt = app.add_option(o.name, b.slots[i].text, o.help)->type_name(type_name(o.kind));
    if (!o.choices.empty()) opt->check(CLI::IsMember(o.choices));
    if (!o.shown_default.empty()) opt->default_str(o.shown_default);
  }
}

// The options given, converted and range-checked in the table's order.
void apply_options(const CLI::App& app, const BoundOptions& b, TrainConfig& c) {
  const auto& options = train_options();
  for (std::size_t i = 0; i < options.size(); ++i) {
    const OptionSpec& o = options[i];
    if (app.count(o.name) == 0 || (o.kind == OptionKind::Flag && !b.slots[i].on)) continue;
    o.apply(o.name, b.slots[i].text, c);
  }
}

bool is_text_dataset(const std::string& d) { return d == "fortunes" || d.rfind("text:", 0) == 0; }

// A GPT trains on text (byte tokens) and text needs a GPT; the options that only mean
// something for one of them are refused with the other.
void check_gpt_combination(const CLI::App& app, const TrainConfig& c) {
  if (c.is_gpt()) {
    if (!c.train_x.empty() || !c.test_x.empty())
      throw ValueError("--model " + c.model_text + " trains on text: give --dataset text:FILE[,FILE...] or --dataset "
                       "fortunes instead of --train-x/--test-x");
    if (!is_text_dataset(c.dataset))
      throw ValueError("--model " + c.model_text + " trains on text: --dataset must be text:FILE[,FILE...] or fortunes, "
                       "not '" + c.dataset + "'");
    if (c.dataset == "text:" || c.dataset.find(",,") != std::string::npos || c.dataset.back() == ',')
      throw ValueError("--dataset '" + c.dataset + "': name the files as text:FILE[,FILE...]");
    for (const char* o : {"--classes", "--activation"})
      if (app.count(o) > 0)
        throw ValueError(std::string(o) + " does not apply to --model " + c.model_text +
                         " (a GPT predicts the next byte of 256, with GELU activations)");
    if (c.exact && c.dropout > 0)
      throw ValueError("--exact and --dropout conflict: each worker draws its own dropout masks, so the weights would "
                       "depend on the number of workers; drop one of them");
    return;
  }
  if (is_text_dataset(c.dataset))
    throw ValueError("--dataset " + c.dataset + " is text, for a language model: --model gpt:LAYERS-HEADS-WIDTH:CONTEXT, "
                     "e.g. gpt:4-4-128:128");
  for (const char* o : {"--stride", "--dropout"})
    if (app.count(o) > 0) throw ValueError(std::string(o) + " needs --model gpt:LAYERS-HEADS-WIDTH:CONTEXT");
}

// Rules between options, checked once on the final values.
void check_combination(const CLI::App& app, TrainConfig& c) {
  if (c.dataset.empty() == c.train_x.empty()) throw ValueError("give either --train-x/--train-y or --dataset");
  if (!c.train_x.empty() && c.train_y.empty()) throw ValueError("--train-x needs --train-y");
  if (c.test_x.empty() != c.test_y.empty()) throw ValueError("--test-x and --test-y go together");
  if (c.lr && (c.base_lr || c.base_batch)) throw ValueError("give either --lr or --base-lr with --base-batch, not both");
  if (c.base_lr.has_value() != c.base_batch.has_value()) throw ValueError("--base-lr and --base-batch go together");
  if (!c.lr && !c.base_lr) c.lr = kDefaultLr;
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
  check_gpt_combination(app, c);
  if (c.sync_bn && !c.is_cnn())
    throw ValueError("--sync-bn needs a model with BatchNorm: --model cnn:C1-C2... (an MLP has none)");
  if (c.exact && c.is_cnn())
    throw ValueError("--exact and --model " + c.model_text + " conflict: exact mode needs a model without buffers, and the "
                     "CNN's BatchNorm running statistics are buffers; use an MLP or drop --exact");
  if (c.zero && c.exact)
    throw ValueError("--zero and --exact conflict: exact mode reduces gradients in fixed point and updates every "
                     "replica itself; drop one of them");
  // fp16 on the CPU, refused before any worker starts (training_setup.cpp checks the device
  // init chose, for the other cases).
  if (c.precision == "fp16" && c.device == "cpu") throw ValueError(kFp16OnCpu);
  if (c.exact && c.precision == "fp16")
    throw ValueError("--exact and --precision fp16 conflict: exact mode promises the same bits on any world size, and "
                     "fp16's dynamic loss scale skips steps on overflow where exact mode stops; use --precision bf16 "
                     "(no loss scaling) or drop --exact");
  if (c.exact && c.allow_nonfinite)
    throw ValueError("--exact and --allow-nonfinite conflict: exact mode sums gradients in fixed point, where NaN and inf "
                     "have no value (a non-finite gradient stops the step); drop one of them");
}

std::string model_text_of(const nlohmann::json& v);

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
void check_config_type(const std::string& k, const nlohmann::json& v, OptionKind kind) {
  auto bad = [&](const std::string& expected) {
    throw ValueError("key '" + k + "' is " + json_type_name(v) + " (" + v.dump() + "): expected " + expected);
  };
  switch (kind) {
    case OptionKind::Flag:
      if (!v.is_boolean()) bad("true or false, e.g. \"" + k + "\": true");
      return;
    case OptionKind::Integer:
      if (!v.is_number_integer() && !v.is_string()) bad("an integer, e.g. \"" + k + "\": 64");
      return;
    case OptionKind::Real:
      if (!v.is_number() && !v.is_string()) bad("a number, e.g. \"" + k + "\": 0.1");
      return;
    case OptionKind::List:
      if (v.is_string()) return;
      if (!v.is_array()) bad("an array of step numbers, e.g. \"" + k + "\": [100, 200]");
      for (const auto& e : v)
        if (!e.is_number_integer()) bad("an array of integer step numbers, e.g. \"" + k + "\": [100, 200]");
      return;
    case OptionKind::Text:
      if (!v.is_string()) bad("a string, e.g. \"" + k + "\": \"...\"");
      return;
  }
}

// A JSON config's keys as argv-style "--key value" pairs, so one parser serves both.
std::vector<std::string> config_args(const std::string& path) {
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
    const OptionSpec* option = find_option_by_key(k);
    if (!option)
      throw ValueError("unknown option '" + k + "' (the keys are phalanx-train's options without the dashes)");
    if (k == "model" && v.is_object()) {  // {"conv": [32, 64], "classes": 10} or {"widths": [784, 10]}
      args.push_back("--model");
      args.push_back(model_text_of(v));
      continue;
    }
    check_config_type(k, v, option->kind);
    if (option->kind == OptionKind::Flag) {
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
void parse_args(std::vector<std::string> args, TrainConfig& c, CLI::App& app, const BoundOptions& b) {
  args = join_negative_values(args, app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.allow_extras(false);
  for (auto* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.parse(reversed);
  apply_options(app, b, c);
  // --shuffle and --no-shuffle are two flags: the later one wins (a config file's
  // "shuffle": false comes before the command line's --shuffle).
  for (auto it = args.rbegin(); it != args.rend(); ++it)
    if (*it == "--shuffle" || *it == "--no-shuffle") {
      c.shuffle = *it == "--shuffle";
      break;
    }
}

const char* kDescription =
    "phalanx-train: train an MLP, a small CNN or a GPT with DDP, alone or under phalanx-run.\n"
    "Every option can also come from --config F.json (the same names without dashes).\n"
    "Numbers are checked against the ranges below; a bad one is an error (exit 2).";

}  // namespace

bool parse_config(int argc, char** argv, TrainConfig& c, int& exit_code) {
  CLI::App app{kDescription, "phalanx-train"};
  BoundOptions bound;
  add_options(app, bound);
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
        BoundOptions file_bound;
        add_options(file_app, file_bound);
        from_file = config_args(config);
        parse_args(from_file, scratch, file_app, file_bound);
      } catch (const CLI::ParseError& e) {
        return fail("--config " + config + ": " + e.what());
      } catch (const std::exception& e) {
        return fail("--config " + config + ": " + e.what());
      }
      args.insert(args.begin(), from_file.begin(), from_file.end());
    }
    parse_args(args, c, app, bound);
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
