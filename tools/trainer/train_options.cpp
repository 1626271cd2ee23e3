#include "train_options.hpp"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>

#include <phalanx/core/error.hpp>

#include "model_spec.hpp"

namespace phalanx::trainer {

namespace {

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

std::vector<std::int64_t> milestones_of(const std::string& option, const std::string& text) {
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
      bad_value(option, text, range);
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

// ---- the conversions behind the table ----

const TrainConfig kDefaults{};

template <class T>
struct ValueOf {
  using type = T;
};
template <class T>
struct ValueOf<std::optional<T>> {
  using type = T;
};

template <class T>
std::string default_text(const T& v) {
  return std::to_string(v);
}
std::string default_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
template <class T>
std::string default_text(const std::optional<T>& v) {
  return v ? default_text(*v) : "none";
}

OptionSpec flag(const char* name, bool TrainConfig::*m, const char* help, bool value = true) {
  return {name, OptionKind::Flag, help, "", {}, [m, value](const std::string&, const std::string&, TrainConfig& c) {
            c.*m = value;
          }};
}

// A string option; `shown`: the default --help shows (none when empty).
OptionSpec text(const char* name, std::string TrainConfig::*m, const char* help, std::string shown = {}) {
  return {name, OptionKind::Text, help, std::move(shown), {},
          [m](const std::string&, const std::string& t, TrainConfig& c) { c.*m = t; }};
}

// One of `choices` (CLI11 checks it); --help shows the default.
OptionSpec choice(const char* name, std::string TrainConfig::*m, const char* help, std::vector<std::string> choices) {
  OptionSpec s = text(name, m, help, kDefaults.*m);
  s.choices = std::move(choices);
  return s;
}

// An integer in [lo, the member type's largest]; --help shows `shown`, else the default.
template <class T>
OptionSpec integer(const char* name, T TrainConfig::*m, std::int64_t lo, const char* help, std::string shown = {}) {
  using V = typename ValueOf<T>::type;
  constexpr std::int64_t hi = std::numeric_limits<V>::max();
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return {name, OptionKind::Integer, help, shown.empty() ? default_text(kDefaults.*m) : shown, {},
          [m, lo, range](const std::string& n, const std::string& t, TrainConfig& c) {
            c.*m = static_cast<V>(int_in(n, t, lo, hi, range));
          }};
}

struct Range {
  double lo;
  bool lo_open;
  double hi;
  bool hi_open;
  const char* text;
};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Range kPositive{0, true, kInf, false, "a finite number > 0"};

// A finite real number in `r`; --help shows `shown`, else the default.
template <class T>
OptionSpec real(const char* name, T TrainConfig::*m, Range r, const char* help, std::string shown = {}) {
  return {name, OptionKind::Real, help, shown.empty() ? default_text(kDefaults.*m) : shown, {},
          [m, r](const std::string& n, const std::string& t, TrainConfig& c) {
            c.*m = real_in(n, t, r.lo, r.lo_open, r.hi, r.hi_open, r.text);
          }};
}

void apply_seed(const std::string& name, const std::string& text, TrainConfig& c) { c.seed = uint64_of(name, text); }

void apply_milestones(const std::string& name, const std::string& text, TrainConfig& c) {
  c.lr_milestones = milestones_of(name, text);
}

// --model: an MLP's widths or a CNN's spec, each checked against this machine's memory.
void apply_model(const std::string&, const std::string& text, TrainConfig& c) {
  c.model_text = text;
  c.gpt_layers = c.gpt_heads = c.gpt_width = c.gpt_context = 0;
  if (is_gpt_spec(text)) {
    const GptSpec spec = parse_gpt_spec(text);
    c.model.clear();
    c.cnn_channels.clear();
    c.cnn_classes = 0;
    c.gpt_layers = spec.layers;
    c.gpt_heads = spec.heads;
    c.gpt_width = spec.width;
    c.gpt_context = spec.context;
    const std::int64_t params = gpt_param_count(spec);
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    const double have = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
    if (params < 0) throw ValueError("--model " + text + ": the parameter count does not fit in a 64-bit integer");
    const double need = static_cast<double>(params) * 4 * 2;
    if (have > 0 && need > have)
      throw ValueError("--model " + text + ": " + std::to_string(params) + " parameters need " + bytes_str(need) +
                       " for float32 weights and gradients alone, more than this machine's " + bytes_str(have) +
                       " of memory; use fewer layers or a smaller width");
  } else if (is_cnn_spec(text)) {
    const CnnSpec spec = parse_cnn_spec(text);
    c.model.clear();
    c.cnn_channels = spec.channels;
    c.cnn_classes = spec.classes;
    std::vector<std::int64_t> chans{1};
    chans.insert(chans.end(), spec.channels.begin(), spec.channels.end());
    check_model_size(text, chans, true);
  } else {
    c.model = parse_widths(text);
    check_model_size(text, c.model);
    c.cnn_channels.clear();
    c.cnn_classes = 0;
  }
}

// `s`, then `after` on the config: a rule with an option applied before this one.
OptionSpec then(OptionSpec s, void (*after)(TrainConfig&)) {
  auto first = std::move(s.apply);
  s.apply = [first, after](const std::string& n, const std::string& t, TrainConfig& c) {
    first(n, t, c);
    after(c);
  };
  return s;
}

// --classes after --model (the table's order): a CNN's K, when given, must agree.
void match_classes(TrainConfig& c) {
  if (c.is_cnn() && c.cnn_classes == 0) c.cnn_classes = c.classes;  // cnn:32-64 --classes 10 = cnn:32-64:10
  if (c.is_cnn() && c.cnn_classes != c.classes)
    throw ValueError(detail::concat("--classes ", c.classes, " and --model ", c.model_text, " (", c.cnn_classes,
                                    " classes) disagree: give the number of classes once"));
}

using T = TrainConfig;

// The options, in --help's order. Every option's name, help, default and check is here.
std::vector<OptionSpec> make_options() {
  std::vector<OptionSpec> o = {
      text("--train-x", &T::train_x, "training features, float32 [N, D]: F.npy or F.npz:KEY"),
      text("--train-y", &T::train_y, "training labels, integer [N]: F.npy or F.npz:KEY"),
      text("--dataset", &T::dataset,
           "a built-in dataset instead: fashion-mnist[:DIR]; for --model gpt:..., text:FILE[,FILE...] (the bytes "
           "of the files; the first 90 % train, the last 10 % validate) or fortunes (Debian's fortunes package)"),
      text("--test-x", &T::test_x, "test features: F.npy or F.npz:KEY"),
      text("--test-y", &T::test_y, "test labels: F.npy or F.npz:KEY"),
      flag("--no-data-check", &T::check_data, "skip the scan of the features for NaN/inf (for huge data)", false),
      {"--model", OptionKind::Text,
       "an MLP's layer widths, e.g. 784-256-10, or a CNN: cnn:32-64[:CLASSES] (conv blocks "
       "Conv3x3-BatchNorm-activation-MaxPool2, then Linear), or nanoGPT's GPT over bytes: "
       "gpt:LAYERS-HEADS-WIDTH:CONTEXT, e.g. gpt:4-4-128:128",
       kDefaults.model_text, {}, apply_model},
      integer("--stride", &T::stride, 1, "GPT: bytes between the starts of two training windows, >= 1",
              "the context"),
      real("--dropout", &T::dropout, {0, false, 1, true, "a number in [0, 1)"},
           "GPT: dropout probability, in [0, 1) (each worker's stream from --seed and its rank)"),
      real("--clip-grad-norm", &T::clip_grad_norm, {0, true, kInf, false, "a finite number > 0"},
           "scale the gradients so that their 2-norm is at most this, > 0", "off"),
      then(integer("--classes", &T::classes, 1,
                   "the number of classes, >= 1, when the labels do not show every class (the model must end in it)",
                   "the largest label + 1"),
           match_classes),
      flag("--sync-bn", &T::sync_bn,
           "CNN: BatchNorm statistics over the global batch (SyncBatchNorm) instead of each worker's"),
      flag("--zero", &T::zero, "shard the optimizer state over the workers (ZeroRedundancyOptimizer, ZeRO stage 1)"),
      choice("--precision", &T::precision,
             "fp32; bf16: forward and loss under autocast bfloat16 (matrix products in bf16 with float32 sums, "
             "float32 weights and optimizer); fp16: autocast float16 with dynamic loss scaling (GradScaler), a GPU only",
             {"fp32", "bf16", "fp16"}),
      choice("--activation", &T::activation, "relu or tanh", {"relu", "tanh"}),
      text("--init", &T::init,
           "initial weights .npz with PyTorch state_dict names (0.weight, ...; a GPT's are nanoGPT's: "
           "transformer.wte.weight, ...)"),
      {"--seed", OptionKind::Integer, "seed of the initialisation and the shuffle, in [0, 2^64)",
       default_text(kDefaults.seed), {}, apply_seed},
      choice("--optimizer", &T::optimizer,
             "sgd, adam or adamw (a GPT's adamw: no weight decay on biases, LayerNorms and embeddings, as nanoGPT)",
             {"sgd", "adam", "adamw"}),
      real("--lr", &T::lr, kPositive, "learning rate > 0 (or --base-lr with --base-batch)", default_text(kDefaultLr)),
      real("--momentum", &T::momentum, {0, false, 1, true, "a number in [0, 1)"}, "SGD momentum, in [0, 1)"),
      flag("--nesterov", &T::nesterov, "Nesterov momentum (SGD)"),
      real("--beta1", &T::beta1, {0, false, 1, true, "a number in [0, 1)"}, "Adam/AdamW beta1, in [0, 1)"),
      real("--beta2", &T::beta2, {0, false, 1, true, "a number in [0, 1)"}, "Adam/AdamW beta2, in [0, 1)"),
      real("--weight-decay", &T::weight_decay, {0, false, kInf, false, "a finite number >= 0"}, "weight decay, >= 0"),
      integer("--global-batch", &T::global_batch, 1,
              "samples per step over all workers (each gets B / world size), >= 1"),
      real("--base-lr", &T::base_lr, kPositive, "linear scaling: the rate tuned at --base-batch, > 0"),
      integer("--base-batch", &T::base_batch, 1, "linear scaling: the global batch --base-lr was tuned at, >= 1"),
      integer("--warmup-steps", &T::warmup_steps, 0, "linear warmup over N steps, >= 0"),
      choice("--lr-schedule", &T::lr_schedule,
             "after the warmup: constant, cosine (to 0 at the last step), step or multistep",
             {"constant", "cosine", "step", "multistep"}),
      integer("--lr-step-size", &T::lr_step_size, 1, "step schedule: multiply the lr by --lr-gamma every N steps, >= 1",
              "none"),
      {"--lr-milestones", OptionKind::List,
       "multistep schedule: multiply by --lr-gamma at these steps (A,B,C increasing)", "none", {}, apply_milestones},
      real("--lr-gamma", &T::lr_gamma, {0, true, 1, false, "a number in (0, 1]"},
           "step/multistep decay factor, in (0, 1]"),
      integer("--epochs", &T::epochs, 1, "epochs, >= 1"),
      flag("--shuffle", &T::shuffle, "shuffle each epoch (the default)"),
      flag("--no-shuffle", &T::shuffle, "keep the data order", false),
      flag("--drop-last", &T::drop_last, "drop the last incomplete batch (and the sampler's remainder)"),
      text("--backend", &T::backend, "communication backend", "auto"),
      text("--device", &T::device, "cpu, cuda (GPU LOCAL_RANK), cuda:N, or sim (the test device)", kDefaults.device),
      text("--save", &T::save, "write the final weights here (.npz, state_dict names)"),
      text("--metrics", &T::metrics, "JSON Lines: one record per step and one per epoch"),
      text("--plot", &T::plot, "SVG of the loss curves"),
      text("--tensorboard", &T::tensorboard,
           "a folder for TensorBoard's event files (loss, lr, step time, samples/s, gradient norm; epoch losses "
           "and accuracy): tensorboard --logdir DIR"),
      flag("--eval-train", &T::eval_train, "evaluate the final mean loss over the whole training set"),
      flag("--exact", &T::exact, "exact mode: the same weights, bit for bit, on any number of workers that divides "
                                 "the micro-batches of a step (docs/exact.md); needs --micro-batch"),
      integer("--micro-batch", &T::micro_batch, 1, "exact mode: samples per forward/backward, a divisor of --global-batch",
              "none"),
      flag("--allow-nonfinite", &T::allow_nonfinite,
           "keep training through a NaN/inf loss (default: stop at that step)"),
      text("--checkpoint-dir", &T::checkpoint_dir, "write checkpoints here (rank 0, atomically)"),
      integer("--checkpoint-every", &T::checkpoint_every, 0,
              "checkpoint every N steps, >= 0 (0: at the end of every epoch)"),
      integer("--keep-checkpoints", &T::keep_checkpoints, 1, "complete checkpoints kept on disk, >= 1"),
      flag("--resume", &T::resume,
           "resume from the latest checkpoint in --checkpoint-dir if there is one, else start fresh"),
      text("--resume-from", &T::resume_from, "resume from this checkpoint (an error when it does not exist)")};
  return o;
}

}  // namespace

const std::vector<OptionSpec>& train_options() {
  static const std::vector<OptionSpec> options = make_options();
  return options;
}

const OptionSpec* find_option_by_key(const std::string& key) {
  for (const auto& o : train_options())
    if (o.key() == key) return &o;
  return nullptr;
}

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

}  // namespace phalanx::trainer
