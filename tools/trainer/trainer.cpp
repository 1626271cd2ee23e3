// phalanx-train's training run. The loop is in one place, between the markers.
#include "trainer.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <nlohmann/json.hpp>

#include <phalanx/core/finite.hpp>
#include <phalanx/core/kernels.hpp>
#include <phalanx/parallel/exact.hpp>
#include <phalanx/phalanx.hpp>

#include "evaluation.hpp"
#include "metrics_log.hpp"
#include "model_spec.hpp"
#include "progress_bar.hpp"
#include "svg_chart.hpp"
#include "trainer_data.hpp"

namespace phalanx::trainer {

namespace {

using Clock = std::chrono::steady_clock;
using samplers::Batch;
using samplers::DataLoader;
using samplers::DistributedSampler;
using samplers::MicroBatchSampler;
using samplers::TensorDataset;

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const std::vector<Tensor>& ps, double lr) {
  if (c.optimizer == "sgd") {
    optim::SGDOptions o{lr, c.momentum, 0.0, c.weight_decay, c.nesterov};
    return std::make_unique<optim::SGD>(ps, o);
  }
  optim::AdamOptions o;
  o.lr = lr;
  o.weight_decay = c.weight_decay;
  if (c.optimizer == "adam") return std::make_unique<optim::Adam>(ps, o);
  return std::make_unique<optim::AdamW>(ps, o);
}

// The rate schedule: the warmup (LinearLR), then constant, cosine, step or multistep.
struct Schedule {
  std::shared_ptr<optim::LRScheduler> single;
  std::unique_ptr<optim::SequentialLR> sequence;
  void step() {
    if (sequence) sequence->step();
    else if (single) single->step();
  }
  bool empty() const { return !single && !sequence; }
  TensorMap state_dict() const { return sequence ? sequence->state_dict() : single ? single->state_dict() : TensorMap{}; }
  void load_state_dict(const TensorMap& m) {
    if (sequence) sequence->load_state_dict(m);
    else if (single) single->load_state_dict(m);
  }
};

Schedule make_schedule(const TrainConfig& c, optim::Optimizer& opt, double scale, std::int64_t total_steps) {
  Schedule s;
  std::shared_ptr<optim::LRScheduler> warmup, main;
  if (c.warmup_steps > 0) warmup = std::make_shared<optim::LinearLR>(opt, 1.0 / std::max(2.0, scale), 1.0, c.warmup_steps);
  if (c.lr_schedule == "cosine") {
    main = std::make_shared<optim::CosineAnnealingLR>(opt, std::max<std::int64_t>(1, total_steps - c.warmup_steps));
  } else if (c.lr_schedule == "step") {
    if (c.lr_step_size < 1) throw ValueError("--lr-schedule step needs --lr-step-size N (N >= 1 steps)");
    main = std::make_shared<optim::StepLR>(opt, c.lr_step_size, c.lr_gamma);
  } else if (c.lr_schedule == "multistep") {
    if (c.lr_milestones.empty()) throw ValueError("--lr-schedule multistep needs --lr-milestones S1,S2,...");
    // Milestones are global step numbers; after a warmup the schedule counts from its end.
    std::vector<std::int64_t> at;
    for (auto m : c.lr_milestones) at.push_back(std::max<std::int64_t>(0, m - c.warmup_steps));
    main = std::make_shared<optim::MultiStepLR>(opt, at, c.lr_gamma);
  } else if (c.lr_schedule != "constant") {
    throw ValueError("--lr-schedule '" + c.lr_schedule + "' is unknown (constant, cosine, step or multistep)");
  }
  if (warmup && main)
    s.sequence = std::make_unique<optim::SequentialLR>(opt, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, main},
                                                       std::vector<std::int64_t>{c.warmup_steps});
  else
    s.single = warmup ? warmup : main;
  return s;
}

std::string fmt_g(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string widths_str(const std::vector<std::int64_t>& w) {
  std::string s;
  for (auto x : w) s += (s.empty() ? "" : "-") + std::to_string(x);
  return s;
}

// The shortest text that reads back as the same double (0.1, not 0.10000000000000001).
std::string fmt_exact(double v) {
  char b[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

// The settings a resume must keep: a change would silently train another trajectory. Those
// that may change are left out (docs/checkpoints.md): --epochs (unless the cosine schedule's
// length depends on it), output paths, --checkpoint-every, --keep-checkpoints, --init.
std::map<std::string, std::string> resume_settings(const TrainConfig& c, double lr, const std::string& model) {
  std::map<std::string, std::string> m{
      {"model", model},
      {"activation", c.activation},
      {"optimizer", c.optimizer},
      {"lr", fmt_exact(lr)},
      {"momentum", fmt_exact(c.momentum)},
      {"weight-decay", fmt_exact(c.weight_decay)},
      {"nesterov", c.nesterov ? "on" : "off"},
      {"lr-schedule", c.lr_schedule},
      {"warmup-steps", std::to_string(c.warmup_steps)},
      {"lr-step-size", std::to_string(c.lr_step_size)},
      {"lr-milestones", c.lr_milestones.empty() ? "none" : widths_str(c.lr_milestones)},
      {"lr-gamma", fmt_exact(c.lr_gamma)},
      {"seed", std::to_string(c.seed)},
      {"shuffle", c.shuffle ? "on" : "off"},
      {"drop-last", c.drop_last ? "on" : "off"},
  };
  if (c.lr_schedule == "cosine") m["epochs"] = std::to_string(c.epochs);  // the cosine's length
  if (c.sync_bn) m["sync-bn"] = "on";  // absent when off: checkpoints of older runs still match
  return m;
}

// True when every gradient is finite (no gradient: nothing to check). On the CPU one
// vectorised pass over each buffer (all_finite), with no allocation; elsewhere one
// reduction per tensor (x * 0 is 0 exactly for finite x), summed on the device and read
// back once.
bool gradients_finite(const std::vector<Tensor>& params) {
  Tensor device_sum;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.device().is_cpu() && g.dtype() == DType::Float32) {
      if (!all_finite(static_cast<const float*>(g.raw_data()), g.numel())) return false;
    } else {
      const Tensor s = sum(g * 0.f);
      device_sum = device_sum.defined() ? device_sum + s : s;
    }
  }
  return !device_sum.defined() || std::isfinite(device_sum.item());
}

// SIGINT/SIGTERM during training (Ctrl-C, or phalanx-run stopping its workers) are noted by
// the handler and acted on between steps: the finished epochs are reported, then the process
// dies by the same signal, as it would have without the handler.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void note_stop_signal(int sig) { g_stop_signal = sig; }

class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = note_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a step in progress is finished, not interrupted
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() { restore(); }
  /// The handlers as they were; then a signal noted meanwhile is raised again.
  void restore() {
    if (restored_) return;
    restored_ = true;
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    if (const int sig = g_stop_signal) {
      std::signal(sig, SIG_DFL);
      std::raise(sig);
    }
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
  bool restored_ = false;
};

// --save/--plot are written after training: their folder must take a file before it starts.
void check_writable(const char* option, const std::string& path) {
  if (path.empty() || ::access(path.c_str(), W_OK) == 0) return;
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw IoError(std::string(option) + " " + path + ": the folder " + dir + " does not exist; create it first");
  if (::access(dir.c_str(), W_OK) != 0)
    throw IoError(std::string(option) + " " + path + ": the folder " + dir + " is not writable");
  if (::access(path.c_str(), F_OK) == 0)
    throw IoError(std::string(option) + " " + path + ": the file exists and is not writable");
}

}  // namespace

int run_training(const TrainConfig& c) {
  // ---- set-up: every check happens before training starts ----
  // The device is decided by init (--device; "cuda" = each worker on GPU LOCAL_RANK), which
  // loads its plugin, or says why it cannot, before the rendezvous.
  parallel::InitOptions io;
  io.backend = c.backend;
  io.device = c.device;
  auto pg = parallel::init_process_group(io);
  const Device dev = parallel::local_device();
  const int world = pg->size(), rank = pg->rank();
  const Datasets data = load_data(c);
  // The model as text: the MLP's widths, or the CNN's spec with its classes ("cnn:32-64:10").
  const CnnSpec cnn_spec{c.cnn_channels, data.classes};
  const std::string model_desc = c.is_cnn() ? cnn_spec_str(cnn_spec, data.classes) : widths_str(c.model);
  if (c.is_cnn()) cnn_feature_shape(cnn_spec, data.input, c.model_text);  // the images survive the pooling
  const std::int64_t n = data.train->size();
  // Exact mode: the world size must divide the micro-batches of a step (checked before the
  // linear scaling, whose own check, W dividing B, follows from it).
  parallel::ExactMode exact_mode{c.exact, c.global_batch, c.micro_batch};
  const parallel::ExactPlan xplan = c.exact ? parallel::exact_plan(exact_mode, world) : parallel::ExactPlan{};

  optim::ScalingOptions so;
  so.global_batch = c.global_batch;
  so.world_size = world;
  so.base_lr = c.base_lr.value_or(*c.lr);
  so.base_batch = c.base_batch.value_or(c.global_batch);
  const optim::ScalingPlan plan = optim::linear_scaling(so);  // throws when W does not divide B
  if (!(std::isfinite(plan.lr) && plan.lr > 0))
    throw ValueError("--base-lr " + fmt_exact(so.base_lr) + " scaled by --global-batch " + std::to_string(c.global_batch) +
                     " / --base-batch " + std::to_string(so.base_batch) + " gives the rate " + fmt_exact(plan.lr) +
                     ", which is not a finite number > 0: lower --base-lr");
  if (rank == 0) {
    check_writable("--save", c.save);
    check_writable("--plot", c.plot);
  }
  if (c.drop_last && n < c.global_batch)
    throw ValueError(detail::concat("--drop-last with a global batch of ", c.global_batch, " and only ", n,
                                    " samples leaves no step to take"));

  // Settings that must agree across ranks, compared before the model is built
  // and broadcast (a different --model would otherwise fail there, or hang).
  parallel::check_consistent({{"global batch", std::to_string(c.global_batch)},
                              {"model", model_desc + " " + c.activation + (c.sync_bn ? " sync-bn" : "") + (c.zero ? " zero" : "") +
                                            (c.init.empty() ? "" : " init " + c.init)},
                              {"optimizer", c.optimizer + " lr " + fmt_g(plan.lr) + " momentum " + fmt_g(c.momentum) +
                                                " weight decay " + fmt_g(c.weight_decay) + (c.nesterov ? " nesterov" : "")},
                              {"lr schedule", c.lr_schedule + " warmup " + std::to_string(c.warmup_steps) + " step size " +
                                                  std::to_string(c.lr_step_size) + " milestones " + widths_str(c.lr_milestones) +
                                                  " gamma " + fmt_g(c.lr_gamma)},
                              {"epochs", std::to_string(c.epochs)},
                              {"seed", std::to_string(c.seed)},
                              {"shuffle", c.shuffle ? "on" : "off"},
                              {"drop last", c.drop_last ? "on" : "off"},
                              {"exact", c.exact ? "micro-batch " + std::to_string(c.micro_batch) : "off"},
                              {"checkpoint every", std::to_string(c.checkpoint_every)},
                              {"resume", c.resume_from.empty() ? (c.resume ? "latest" : "no") : c.resume_from}},
                             pg);

  Generator gen(c.seed);
  std::shared_ptr<nn::Module> net;
  if (c.is_cnn()) net = build_cnn(cnn_spec, data.input, data.classes, c.activation, &gen);
  else net = nn::mlp(c.model, c.activation, &gen);
  if (!c.init.empty()) net->load_state_dict(load_npz(c.init));
  // --sync-bn: every BatchNorm becomes a SyncBatchNorm over the group (the same names, weights
  // and buffers), whose training statistics are those of the global batch.
  if (c.sync_bn) net = parallel::convert_sync_batchnorm(net, pg);
  net->to(dev);
  parallel::DDPOptions ddp_options;
  ddp_options.exact = exact_mode;
  auto model = std::make_shared<parallel::DDP>(net, pg, ddp_options);
  // --zero: each rank keeps the optimizer state of its shard of the parameters only
  // (ZeroRedundancyOptimizer over the same optimizer); the weights stay replicated.
  std::unique_ptr<optim::Optimizer> opt;
  parallel::ZeroRedundancyOptimizer* zero = nullptr;
  if (c.zero) {
    auto z = std::make_unique<parallel::ZeroRedundancyOptimizer>(
        model->parameters(), [&](std::vector<Tensor> shard) { return make_optimizer(c, shard, plan.lr); }, pg);
    zero = z.get();
    opt = std::move(z);
  } else {
    opt = make_optimizer(c, model->parameters(), plan.lr);
  }
  // Normal mode: each rank a shard of every global batch (DistributedSampler). Exact mode:
  // each rank its micro-batches of every global batch (MicroBatchSampler, the same
  // micro-batches on any world size); the loader then yields micro-batches, K a step.
  samplers::SamplerPtr sampler;
  std::shared_ptr<MicroBatchSampler> micro_sampler;
  if (c.exact) {
    samplers::MicroBatchSamplerOptions mo;
    mo.global_batch = c.global_batch;
    mo.micro_batch = c.micro_batch;
    mo.shuffle = c.shuffle;
    mo.seed = c.seed;
    mo.drop_last = c.drop_last;
    sampler = micro_sampler = std::make_shared<MicroBatchSampler>(n, mo);
  } else {
    samplers::DistributedSamplerOptions dso;
    dso.shuffle = c.shuffle;
    dso.seed = c.seed;
    dso.drop_last = c.drop_last;
    sampler = std::make_shared<DistributedSampler>(n, dso);
  }
  const std::int64_t micro_per_step = c.exact ? xplan.per_rank : 1;  // forward/backward passes a step
  samplers::DataLoaderOptions lo{c.exact ? c.micro_batch : plan.per_rank_batch};
  lo.drop_last = c.drop_last && !c.exact;  // exact mode: the sampler hands out whole micro-batches
  // No prefetch thread: the data is in memory (or mapped), and a batch's gather is a few
  // row copies, cheaper than handing it over between threads. A thread per worker would also
  // compete with the workers for the cores (with 2 workers on 2 cores it cost ~40 us a step:
  // docs/benchmarks.md).
  lo.prefetch = 0;
  DataLoader loader(data.train, lo, sampler);
  const std::int64_t steps_per_epoch = c.exact ? micro_sampler->steps_per_epoch() : loader.num_batches();
  Schedule schedule = make_schedule(c, *opt, plan.scale, steps_per_epoch * c.epochs);

  // ---- resume: --resume-from PATH, --resume (the newest checkpoint that verifies, if there is
  // one), or a restart by phalanx-run --max-restarts (PHALANX_RESTART_COUNT > 0) with a dir ----
  const std::map<std::string, std::string> settings = resume_settings(c, plan.lr, model_desc);
  // (Under --zero a checkpoint holds the replicated optimizer's format: the same as a fresh one's.)
  const TensorMap model_now = net->state_dict(),
                  opt_now = zero ? make_optimizer(c, model->parameters(), plan.lr)->state_dict() : opt->state_dict();
  parallel::CheckpointExpect expect;
  expect.world_size = world;
  expect.global_batch = c.global_batch;
  expect.micro_batch = c.exact ? c.micro_batch : plan.per_rank_batch;
  expect.exact = c.exact ? 1 : 0;  // exact mode resumes on any world size dividing its micro-batches
  expect.model = &model_now;
  expect.optimizer = &opt_now;
  expect.config = &settings;
  std::unique_ptr<parallel::CheckpointDir> ckdir;
  if (!c.checkpoint_dir.empty()) {
    ckdir = std::make_unique<parallel::CheckpointDir>(c.checkpoint_dir, c.keep_checkpoints);
    if (rank == 0) ckdir->lock();  // one run per folder, for the whole run; a killed writer's temp files go
  }
  const int restart = parallel::read_launch_env().restart_count;
  std::string resume_path;
  std::optional<parallel::LoadedCheckpoint> loaded;
  if (ckdir && (c.resume || restart > 0)) {
    // The newest file that verifies; a damaged one is passed over (kept, named) and never pruned.
    std::vector<parallel::SkippedCheckpoint> skipped;
    auto got = ckdir->load_newest(expect, &skipped);
    // A damaged newest checkpoint stops a run the user started (--resume): they choose the
    // fallback. A restart by the launcher (unattended) falls back by itself, saying so. With
    // no checkpoint that verifies, nobody starts again from step 0 over a damaged history.
    if (!skipped.empty() && (restart == 0 || !got))
      throw IoError(skipped.front().reason +
                    (got ? "; the file is kept as it is. The newest checkpoint that verifies is " + got->first +
                               ": resume from it with --resume-from " + got->first
                         : "; the file is kept as it is, and no checkpoint in " + c.checkpoint_dir +
                               " verifies: repair or move them, or start afresh in an empty folder"));
    if (got) {
      resume_path = got->first;
      loaded = std::move(got->second);
    }
    if (rank == 0)
      for (const auto& k : skipped)
        std::fprintf(stderr, "phalanx-train: passing over %s (%s)\n", k.path.c_str(), k.reason.c_str());
  }
  if (!c.resume_from.empty() && (restart == 0 || !loaded)) {
    // --resume-from on the first attempt; on a restart only when this job wrote nothing newer.
    struct stat st;
    if (::stat(c.resume_from.c_str(), &st) != 0 || ::access(c.resume_from.c_str(), R_OK) != 0)
      throw IoError("--resume-from " + c.resume_from + ": no such checkpoint (or not readable)");
    if (!S_ISREG(st.st_mode)) throw IoError("--resume-from " + c.resume_from + ": not a regular file");
    resume_path = c.resume_from;
    loaded = parallel::load_checkpoint(resume_path, expect);
    // The newer checkpoints of the run resumed are abandoned: renamed (kept), so neither a
    // restart nor the pruning takes them for this run's.
    if (ckdir && rank == 0)
      for (const auto& r : ckdir->supersede_after(loaded->state.step))
        std::fprintf(stderr, "phalanx-train: %s is newer than the checkpoint resumed from: renamed to %s\n",
                     r.substr(0, r.rfind(".superseded")).c_str(), r.c_str());
  } else if (ckdir && !c.resume && restart == 0) {
    // A fresh run would mix its checkpoints with another run's (and a restart could then pick
    // the other run's newest): refuse, naming both ways on.
    if (auto newest = ckdir->latest())
      throw ConfigError("--checkpoint-dir " + c.checkpoint_dir + " already holds checkpoints (newest " + *newest +
                        ") and this run starts from step 0: pass --resume to continue from them, or use an empty folder");
  } else if (ckdir && !loaded && rank == 0) {
    std::printf("phalanx-train: no checkpoint in %s yet; starting from step 0\n", c.checkpoint_dir.c_str());
  }
  if (ckdir && !resume_path.empty()) ckdir->protect(resume_path);  // the pruning never removes it
  std::int64_t step = 0, start_epoch = 0, skip_batches = 0;
  Tensor stats = zeros({2});  // this rank's (loss sum, steps) of the epoch in progress
  // Exact mode: the epoch in progress's sum of the steps' losses (each the same on every rank
  // and world size: exact_mean), and its steps; no sum over the ranks is needed.
  double exact_loss_sum = 0, exact_steps = 0;
  tools::Series train_curve{"train loss", {}, {}}, test_curve{"test loss", {}, {}};
  parallel::CheckpointManifest resumed;
  double elapsed_before = 0;  // training seconds before the resume point (metrics' clock)
  if (loaded) {
    parallel::LoadedCheckpoint& ck = *loaded;
    net->load_state_dict(ck.state.model);
    opt->load_state_dict(ck.state.optimizer);  // the rates as they were (the settings matched)
    if (schedule.empty() != ck.state.scheduler.empty())
      throw ConfigError("checkpoint " + resume_path + (schedule.empty() ? " has an LR schedule and this run has none"
                                                                      : " has no LR schedule and this run has one") +
                        ": resume with the same --warmup-steps and --lr-schedule");
    try {
      schedule.load_state_dict(ck.state.scheduler);
    } catch (const ValueError& e) {
      throw ConfigError("checkpoint " + resume_path + ": its LR schedule does not fit this run's (" + e.what() +
                        "): resume with the same --warmup-steps and --lr-schedule");
    }
    step = ck.state.step;
    start_epoch = ck.state.epoch;
    skip_batches = ck.state.step_in_epoch;
    if (skip_batches > steps_per_epoch || step != start_epoch * steps_per_epoch + skip_batches)
      throw ConfigError(detail::concat("checkpoint ", resume_path, " is at step ", step, " (epoch ", start_epoch + 1,
                                       ", step ", skip_batches, " in it) but this run has ", steps_per_epoch,
                                       " steps per epoch: resume with the same data and --drop-last"));
    if (const Tensor* t = ck.state.user.find("epoch_stats"))  // every rank's partial sums
      if (t->numel() == 2 * world) stats = tensor(std::vector<float>{t->to_vector<float>()[2 * rank], t->to_vector<float>()[2 * rank + 1]}, {2});
    if (c.exact) {  // the same on every rank and world size
      const auto sum = ck.state.scalars.find("epoch_loss_sum"), steps = ck.state.scalars.find("epoch_steps");
      if (sum == ck.state.scalars.end() || steps == ck.state.scalars.end())
        throw IoError("checkpoint " + resume_path + ": written in exact mode without its epoch_loss_sum/epoch_steps: the "
                      "file is damaged");
      exact_loss_sum = sum->second;
      exact_steps = steps->second;
    }
    for (auto* curve : {&train_curve, &test_curve})
      if (const Tensor* t = ck.state.user.find(curve == &train_curve ? "train_curve" : "test_curve"))
        for (float v : t->to_vector<float>()) {
          curve->x.push_back(static_cast<double>(curve->x.size() + 1));
          curve->y.push_back(v);
        }
    if (auto it = ck.state.scalars.find("seconds"); it != ck.state.scalars.end() && std::isfinite(it->second))
      elapsed_before = it->second;
    resumed = ck.manifest;
  }
  // Where the ranks resume must agree too (they read the same folder; a rank that found
  // another file, or none, is named here rather than diverging silently).
  parallel::check_consistent({{"resume step", std::to_string(step)}}, pg);

  const auto t0 = Clock::now();
  MetricsLog metrics;
  if (rank == 0 && !c.metrics.empty()) {
    if (resume_path.empty()) metrics.open_fresh(c.metrics);
    else metrics.open_resumed(c.metrics, step, start_epoch);
  }
  ProgressBar progress(ProgressBar::wanted(rank), c.epochs, steps_per_epoch, c.global_batch);
  // Finished epochs are reported (their losses summed over the ranks, printed, recorded) at
  // once every kReportSteps steps at least, not one by one: with epochs of a few steps, a
  // reduction and a console line each cost as much as a step (docs/benchmarks.md). An epoch
  // of kReportSteps steps or more, the last epoch, an epoch with a test set or a checkpoint,
  // and every epoch under a progress bar (rank 0 draws it; the ranks agree here) are
  // reported as they end.
  constexpr std::int64_t kReportSteps = 64;
  const bool report_every_epoch = sum_over_ranks(tensor(std::vector<float>{progress.enabled() ? 1.f : 0.f}, {1}), *pg, dev)
                                      .data<float>()[0] > 0;
  struct PendingEpoch {
    std::int64_t epoch;
    float loss_sum, steps;
    double test_loss = 0, test_acc = -1;
    double exact_loss = 0;  ///< exact mode: the epoch's loss, already over all ranks
  };
  std::vector<PendingEpoch> pending;
  std::int64_t steps_unreported = 0;
  std::string console;  // rank 0's epoch lines of one report
  double last_epoch_loss = train_curve.y.empty() ? std::nan("") : train_curve.y.back();
  double test_acc = -1;
  // Every rank takes part (one reduction for all the epochs waiting); rank 0 prints. With
  // `summed` false (a run stopped by an error, where a collective could hang) no rank
  // communicates: rank 0 reports its own batches' losses, marked so (and in the metrics file
  // as `train_loss_rank0`), unless it is the only rank.
  auto report_epochs = [&](bool summed) {
    if (pending.empty()) return;
    const bool exact = summed || world == 1 || c.exact;  // exact mode: every rank holds the whole sum
    const auto k = static_cast<std::int64_t>(pending.size());
    Tensor sums = zeros({k, 2});
    for (std::int64_t i = 0; i < k; ++i) {
      sums.data<float>()[2 * i] = pending[i].loss_sum;
      sums.data<float>()[2 * i + 1] = pending[i].steps;
    }
    if (summed && !c.exact) sums = sum_over_ranks(sums, *pg, dev);
    for (std::int64_t i = 0; i < k; ++i) {
      const PendingEpoch& p = pending[i];
      last_epoch_loss = c.exact ? p.exact_loss : sums.data<float>()[2 * i] / std::max(1.f, sums.data<float>()[2 * i + 1]);
      nlohmann::json rec{{"epoch", p.epoch + 1}, {exact ? "train_loss" : "train_loss_rank0", last_epoch_loss}};
      train_curve.x.push_back(static_cast<double>(p.epoch + 1));
      train_curve.y.push_back(last_epoch_loss);
      if (data.test) {
        rec["test_loss"] = p.test_loss;
        rec["test_acc"] = p.test_acc;
        test_acc = p.test_acc;
        test_curve.x.push_back(static_cast<double>(p.epoch + 1));
        test_curve.y.push_back(p.test_loss);
      }
      metrics.record_epoch(rec);
      if (rank == 0) {
        char line[1024];  // room for two doubles of 309 digits (a diverged loss in %.4f)
        std::size_t len = static_cast<std::size_t>(std::snprintf(
            line, sizeof line, "epoch %lld: train loss %.4f", static_cast<long long>(p.epoch + 1), last_epoch_loss));
        if (data.test && len < sizeof line)
          len += static_cast<std::size_t>(std::snprintf(line + len, sizeof line - len, ", test loss %.4f, test accuracy %.4f",
                                                        p.test_loss, p.test_acc));
        if (!exact && len < sizeof line)
          len += static_cast<std::size_t>(std::snprintf(line + len, sizeof line - len,
                                                        " (rank 0's batches only: the run stopped before the sum over the ranks)"));
        progress.end_epoch();  // ends the bar's line (with a bar, every epoch is reported as it ends)
        console.append(line, std::min(len, sizeof line - 1)).push_back('\n');
      }
    }
    if (rank == 0) {
      // One write for the group: stdout is line-buffered under phalanx-run, where a line
      // at a time would cost a write (and a wake-up of the launcher) each.
      std::fwrite(console.data(), 1, console.size(), stdout);
      std::fflush(stdout);
      console.clear();
    }
    pending.clear();
    steps_unreported = 0;
  };
  // A run stopped by an error (a non-finite loss, a lost peer, a full disk) still reports the
  // epochs that finished, without a collective; the metrics file then writes the step records
  // held back when it is destroyed. Declared after the signal handlers: a signal noted before
  // the error is raised again (ending the process) after this report.
  StopSignals stop_signals;
  struct ReportOnError {
    std::function<void()> report;
    const int uncaught = std::uncaught_exceptions();
    ~ReportOnError() {
      if (std::uncaught_exceptions() > uncaught) try {
          report();
        } catch (...) {
        }
    }
  } report_on_error{[&] {
    report_epochs(false);
    metrics.flush();
  }};
  // Every rank takes part (the partial epoch sums are gathered); rank 0 writes.
  auto save_checkpoint = [&](std::int64_t epoch, std::int64_t in_epoch) {
    if (!ckdir) return;
    report_epochs(true);  // the curves and the metrics file hold every finished epoch
    Tensor all = zeros({world, 2});
    if (!c.exact) {  // exact mode: rank 0's sums are every rank's, and depend on no world size
      all.data<float>()[2 * rank] = stats.data<float>()[0];
      all.data<float>()[2 * rank + 1] = stats.data<float>()[1];
      all = sum_over_ranks(all, *pg, dev);
    }
    if (zero) zero->consolidate_state_dict(0);  // every rank's shard of the state, to rank 0
    if (rank != 0) return;
    metrics.flush();  // the metrics file is never behind a checkpoint
    parallel::CheckpointState s;
    s.model = net->state_dict();
    s.optimizer = opt->state_dict();
    s.scheduler = schedule.state_dict();
    s.step = step;
    s.epoch = epoch;
    s.step_in_epoch = in_epoch;
    s.world_size = world;
    s.global_batch = c.global_batch;
    s.micro_batch = c.exact ? c.micro_batch : plan.per_rank_batch;
    s.exact = c.exact;
    s.config = settings;
    s.scalars["seconds"] = elapsed_before + std::chrono::duration<double>(Clock::now() - t0).count();
    if (c.exact) {
      s.scalars["epoch_loss_sum"] = exact_loss_sum;
      s.scalars["epoch_steps"] = exact_steps;
    } else {
      s.user.set("epoch_stats", all);
    }
    std::vector<float> tc(train_curve.y.begin(), train_curve.y.end()), ec(test_curve.y.begin(), test_curve.y.end());
    s.user.set("train_curve", tensor(tc, {static_cast<std::int64_t>(tc.size())}));
    s.user.set("test_curve", tensor(ec, {static_cast<std::int64_t>(ec.size())}));
    ckdir->save(s);
  };

  if (rank == 0) {
    std::printf("phalanx-train: %lld samples, model %s%s%s, %s%s, %d worker(s) on %s; %s\n", static_cast<long long>(n),
                model_desc.c_str(), c.is_cnn() ? (" on " + shape_str(data.input) + " inputs").c_str() : "",
                c.sync_bn ? " with SyncBatchNorm" : "", c.optimizer.c_str(), c.zero ? " (ZeRO: state sharded)" : "", world, pg->backend_name().c_str(), plan.describe().c_str());
    if (c.exact)
      std::printf("phalanx-train: exact mode: %lld micro-batches of %lld a step, %lld per worker (the same weights on "
                  "any number of workers that divides %lld)\n",
                  static_cast<long long>(xplan.micro_batches), static_cast<long long>(c.micro_batch),
                  static_cast<long long>(xplan.per_rank), static_cast<long long>(xplan.micro_batches));
    if (!resume_path.empty() && start_epoch < c.epochs)
      std::printf("phalanx-train: resumed at step %lld (epoch %lld, checkpoint written at %s) from %s\n",
                  static_cast<long long>(step), static_cast<long long>(start_epoch + 1), resumed.written_at().c_str(),
                  resume_path.c_str());
    else if (!resume_path.empty())
      std::printf("phalanx-train: resumed at step %lld (epoch %lld done, checkpoint written at %s) from %s: "
                  "nothing left to train (raise --epochs to go on)\n",
                  static_cast<long long>(step), static_cast<long long>(start_epoch), resumed.written_at().c_str(),
                  resume_path.c_str());
    std::fflush(stdout);
  }

  const std::int64_t resumed_step = step;

  const std::vector<Tensor> params = model->parameters();
  auto stop_if_signalled = [&] {
    if (!g_stop_signal) return;
    if (rank == 0)
      std::fprintf(stderr, "phalanx-train: got %s at step %lld; reporting the finished epochs, then stopping\n",
                   strsignal(g_stop_signal), static_cast<long long>(step));
    try {
      report_epochs(false);  // no collective: the other ranks are stopping too
      metrics.close();
    } catch (...) {
    }
    stop_signals.restore();  // dies by the signal
  };
  // ---- TRAINING LOOP ----
  // A step is micro_per_step forward/backward passes: one in normal mode; in exact mode this
  // rank's micro-batches of the step, after whose last backward the gradients hold the mean
  // over the global batch, the same bits on any world size.
  std::vector<std::pair<std::int64_t, double>> micro_losses;  // exact mode: (micro-batch index, loss)
  micro_losses.reserve(static_cast<std::size_t>(micro_per_step));
  for (std::int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    sampler->set_epoch(epoch);
    model->train();
    std::int64_t batch_index = 0, micro = 0;  // steps of the epoch taken; passes of the step in progress
    double lr_used = 0;
    progress.start_epoch(epoch, skip_batches);
    for (Batch& b : loader) {
      if (batch_index < skip_batches) {  // resuming mid-epoch: already trained on these
        if (++micro == micro_per_step) micro = 0, ++batch_index;
        continue;
      }
      if (micro == 0) {
        stop_if_signalled();
        opt->zero_grad();
        micro_losses.clear();
        lr_used = opt->param_groups()[0].lr();  // before the schedule moves it
      }
      Tensor loss = cross_entropy(model->forward(b.x.to(dev)), b.y.to(dev));
      const float l = loss.item();
      // A non-finite loss stops here, before its gradients reach any weight (and before any
      // checkpoint could hold them): the last good checkpoint stays the newest.
      if (!std::isfinite(l) && !c.allow_nonfinite)
        throw ValueError(detail::concat("non-finite loss (", l, ") at step ", step + 1, " (epoch ", epoch + 1,
                                        ", step ", batch_index + 1, " of ", steps_per_epoch,
                                        c.exact ? ", micro-batch " + std::to_string(micro_sampler->micro_batch_index(micro))
                                                : std::string(),
                                        ")",
                                        ckdir ? "; the last good checkpoint is kept in " + c.checkpoint_dir : std::string(),
                                        "; lower --lr, check the data, or pass --allow-nonfinite to train on"));
      if (!c.exact) {
        loss.backward();  // the gradients are all-reduced when it returns: every rank sees the same
      } else {
        try {
          loss.backward();  // the last of the step's passes reduces (a non-finite gradient throws on every rank)
        } catch (const ValueError& e) {
          throw ValueError(detail::concat("step ", step + 1, " (epoch ", epoch + 1, ", step ", batch_index + 1, " of ",
                                          steps_per_epoch, "): ", e.what()));
        }
        micro_losses.emplace_back(micro_sampler->micro_batch_index(micro), static_cast<double>(l));
      }
      if (++micro < micro_per_step) continue;
      micro = 0;
      ++batch_index;
      // The loss logged: this rank's batch in normal mode; in exact mode the mean over the
      // global batch's micro-batches, the same on every rank and world size (one small allreduce).
      const double step_loss =
          c.exact ? parallel::exact_mean(*pg, micro_losses, micro_sampler->micro_batches_per_step(), dev) : l;
      // A finite loss can still give non-finite gradients (NaN in the data under --no-data-check,
      // an overflow): they would reach every weight, so the step stops here too.
      if (!c.allow_nonfinite && !gradients_finite(params)) {
        report_epochs(true);  // every rank is here: the gradients are the same on all
        throw ValueError(detail::concat("non-finite gradient at step ", step + 1, " (epoch ", epoch + 1, ", step ",
                                        batch_index, " of ", steps_per_epoch, "; loss ", step_loss, ")",
                                        ckdir ? "; the last good checkpoint is kept in " + c.checkpoint_dir : std::string(),
                                        "; check the data, lower --lr, or pass --allow-nonfinite to train on"));
      }
      opt->step();
      schedule.step();
      ++step;
      if (c.exact) {
        exact_loss_sum += step_loss;
        exact_steps += 1;
      } else {
        stats.data<float>()[0] += l;
        stats.data<float>()[1] += 1;
      }
      if (metrics.enabled())
        metrics.step(step, epoch + 1, step_loss, lr_used,
                     elapsed_before + std::chrono::duration<double>(Clock::now() - t0).count());
      progress.update(batch_index, step_loss);
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0) save_checkpoint(epoch, batch_index);
    }
    skip_batches = 0;
    PendingEpoch done{epoch, stats.data<float>()[0], stats.data<float>()[1]};
    stats.data<float>()[0] = stats.data<float>()[1] = 0;
    done.exact_loss = exact_loss_sum / std::max(1.0, exact_steps);
    exact_loss_sum = exact_steps = 0;
    steps_unreported += batch_index;
    if (data.test) {
      model->eval();
      std::tie(done.test_loss, done.test_acc) = evaluate(*model, data.test, *pg);
    }
    pending.push_back(done);
    const bool checkpoint_now = ckdir && c.checkpoint_every == 0 && epoch + 1 < c.epochs;
    if (report_every_epoch || checkpoint_now || data.test || epoch + 1 == c.epochs || steps_unreported >= kReportSteps)
      report_epochs(true);
    else
      metrics.hold();  // the next steps' records wait behind this epoch's
    if (checkpoint_now) save_checkpoint(epoch + 1, 0);
  }
  // The final checkpoint, always (unless this run resumed from the end and trained nothing).
  if (step != resumed_step || start_epoch < c.epochs || resume_path.empty()) save_checkpoint(c.epochs, 0);
  stop_if_signalled();
  stop_signals.restore();  // from here on a signal acts at once, as before training
  // ---- END TRAINING LOOP ----
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  double final_loss = last_epoch_loss;
  if (c.eval_train) {
    model->eval();
    final_loss = evaluate(*model, data.train, *pg).first;
    if (rank == 0) std::printf("final mean loss over the training set: %.6f\n", final_loss);
    metrics.record(nlohmann::json{{"eval_train_loss", final_loss}});
  }
  metrics.close();  // a write that failed (a full disk) is an error, not a truncated file
  if (rank == 0 && !c.save.empty()) save_npz(c.save, net->state_dict());
  if (rank == 0 && !c.plot.empty()) {
    std::vector<tools::Series> series{train_curve};
    if (!test_curve.x.empty()) series.push_back(test_curve);
    tools::ChartOptions co;
    co.title = "phalanx-train";
    tools::write_svg(c.plot, series, co);
  }
  if (rank == 0) {
    nlohmann::json summary{{"final_train_loss", final_loss}, {"steps", step}, {"seconds", seconds},
                           {"world_size", world}, {"backend", pg->backend_name()}};
    if (test_acc >= 0) summary["test_acc"] = test_acc;
    std::printf("%s\n", summary.dump().c_str());
  }
  parallel::destroy_process_group();
  return 0;
}

}  // namespace phalanx::trainer
