// phalanx-train's training run: set-up (training_setup.cpp), the start point (resume.cpp),
// then the loop here, one job a function: the epoch, the forward/backward pass, the step,
// the epoch's end (evaluation and the report/checkpoint cadence: cadence.hpp), the
// checkpoint and the outputs. Epoch reports: epoch_report.cpp; the progress line with its
// ETA: progress_bar.cpp; a stop on request (SIGTERM): parallel/stop.hpp.
#include "trainer.hpp"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <phalanx/core/finite.hpp>
#include <phalanx/phalanx.hpp>

#include "cadence.hpp"
#include "epoch_report.hpp"
#include "evaluation.hpp"
#include "metrics_log.hpp"
#include "precision.hpp"
#include "progress_bar.hpp"
#include "resume.hpp"
#include "svg_chart.hpp"
#include "training_setup.hpp"

namespace phalanx::trainer {

namespace {

using Clock = std::chrono::steady_clock;
using samplers::Batch;

// Thrown out of the loop once the checkpoint of an agreed stop is saved.
struct StoppedOnRequest {
  std::int64_t step;
};

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

// The 2-norm of all gradients, for --tensorboard's train/grad_norm (rank 0, after DDP's
// reduction: every rank holds the same). On the CPU one pass over each buffer in eight
// independent float lanes (vectorisable, no allocation), summed in double per buffer.
double gradient_norm(const std::vector<Tensor>& params) {
  double total = 0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.device().is_cpu() && g.dtype() == DType::Float32) {
      const float* d = static_cast<const float*>(g.raw_data());
      const std::int64_t n = g.numel();
      float lane[8] = {};
      std::int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) lane[k] += d[i + k] * d[i + k];
      double sq = 0;
      for (; i < n; ++i) sq += static_cast<double>(d[i]) * d[i];
      for (float v : lane) sq += v;
      total += sq;
    } else {
      total += sum(g * g).item();
    }
  }
  return std::sqrt(total);
}

bool progress_anywhere(bool here, ProcessGroup& pg, Device dev) {
  return sum_over_ranks(tensor(std::vector<float>{here ? 1.f : 0.f}, {1}), pg, dev).data<float>()[0] > 0;
}

// The training loop of one run, from its start point to its outputs.
class TrainingLoop {
 public:
  TrainingLoop(const TrainConfig& c, TrainingSetup& s, StartPoint& sp);
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;
  /// A run stopped by an error (a non-finite loss, a lost peer, a full disk) still reports
  /// the epochs that finished, without a collective; the metrics file then writes the step
  /// records held back when it is destroyed.
  ~TrainingLoop();

  /// The epochs left, then the final checkpoint. Throws StoppedOnRequest after the
  /// checkpoint of an agreed stop (SIGTERM and the like) is saved.
  void train();
  /// --eval-train, --metrics, --save, --plot and the summary line. Returns the exit code.
  int finish();

 private:
  void announce() const;
  void run_epoch(std::int64_t epoch);
  /// One forward/backward pass (pass `micro` of the step).
  void forward_backward(const Batch& b, std::int64_t epoch, std::int64_t batch_index, std::int64_t micro);
  /// The step whose passes are done: checks, updates the weights, logs it (`batch_index`: its
  /// 1-based number in the epoch).
  void take_step(std::int64_t epoch, std::int64_t batch_index);
  void end_epoch(std::int64_t epoch, std::int64_t batches);
  /// Every rank takes part (the partial epoch sums are gathered); rank 0 writes.
  void save_checkpoint(std::int64_t epoch, std::int64_t in_epoch);
  /// The state a checkpoint holds; every rank takes part, rank 0 gets it (nullopt elsewhere).
  std::optional<parallel::CheckpointState> checkpoint_state(std::int64_t epoch, std::int64_t in_epoch);
  /// Every rank agreed to stop before the step `in_epoch` + 1 of `epoch`: the checkpoint of
  /// the steps done, verified, then StoppedOnRequest (without --checkpoint-dir: the process
  /// dies by the signal, as without a handler).
  [[noreturn]] void stop_on_request(std::int64_t epoch, std::int64_t in_epoch);
  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  const TrainConfig& c_;
  TrainingSetup& s_;
  StartPoint& sp_;
  const int world_, rank_;
  const Clock::time_point t0_;
  MetricsLog metrics_;
  ProgressBar progress_;
  Cadence cadence_;
  EpochReporter reporter_;
  std::optional<parallel::StopOnSignal> stop_signals_;
  std::optional<parallel::StopVote> vote_;
  const int uncaught_ = std::uncaught_exceptions();
  std::int64_t resumed_step_ = 0;
  std::vector<Tensor> params_;
  StepPlan& plan_;  // how a step runs: its passes, its loss, the epoch's loss sums
  // The step in progress: the rate it uses (before the schedule moves it), its last pass's loss.
  double lr_used_ = 0;
  float last_loss_ = 0;
  const DType autocast_dtype_;  // --precision's (Float32: no autocast)
};

TrainingLoop::TrainingLoop(const TrainConfig& c, TrainingSetup& s, StartPoint& sp)
    : c_(c),
      s_(s),
      sp_(sp),
      world_(s.world),
      rank_(s.rank),
      t0_(Clock::now()),
      progress_(ProgressBar::wanted(s.rank), c.epochs, s.steps_per_epoch, c.global_batch),
      reporter_({s.pg.get(), s.dev, s.step->losses_agreed(), s.data.has_test(), s.data.text_val != nullptr}, metrics_,
                progress_,
                std::move(sp.train_curve), std::move(sp.test_curve)),
      plan_(*s.step),
      autocast_dtype_(precision_dtype(c.precision)) {
  if (rank_ == 0 && !c.metrics.empty()) {
    if (sp.resume_path.empty()) metrics_.open_fresh(c.metrics);
    else metrics_.open_resumed(c.metrics, sp.step, sp.start_epoch);
  }
  if (rank_ == 0 && !c.tensorboard.empty()) metrics_.open_tensorboard(c.tensorboard, sp.step + 1, c.global_batch, s.steps_per_epoch);
  cadence_.epochs = c.epochs;
  cadence_.checkpoint_every = c.checkpoint_every;
  cadence_.checkpoint_dir = sp.ckdir != nullptr;
  cadence_.test_set = s.data.has_test();
  // Every epoch is reported as it ends under a progress bar: rank 0 draws it; the ranks agree here.
  cadence_.report_every_epoch = progress_anywhere(progress_.enabled(), *s.pg, s.dev);
  stop_signals_.emplace();
  vote_.emplace(s.pg, s.dev);
  announce();
}

TrainingLoop::~TrainingLoop() {
  if (std::uncaught_exceptions() > uncaught_) try {
      reporter_.report(false);
      metrics_.flush();
    } catch (...) {
    }
}

void TrainingLoop::announce() const {
  if (rank_ != 0) return;
  const std::int64_t step = sp_.step, start_epoch = sp_.start_epoch;
  const std::string& resume_path = sp_.resume_path;
  std::printf("phalanx-train: %lld %s, model %s%s%s, %s%s, %d worker(s) on %s; %s\n", static_cast<long long>(s_.n),
              c_.is_gpt() ? "windows" : "samples", s_.model_desc.c_str(), c_.is_cnn()   ? (" on " + shape_str(s_.data.input) + " inputs").c_str()
              : c_.is_gpt() ? (" on windows of " + std::to_string(c_.gpt_context) + " bytes").c_str()
                            : "",
              c_.sync_bn ? " with SyncBatchNorm" : "", c_.optimizer.c_str(), c_.zero ? " (ZeRO: state sharded)" : "", world_,
              s_.pg->backend_name().c_str(), s_.plan.describe().c_str());
  if (const std::string how = plan_.describe(); !how.empty()) std::printf("phalanx-train: %s\n", how.c_str());
  if (c_.precision == "bf16")
    std::printf("phalanx-train: precision bf16: forward and loss under autocast bfloat16 (linear, matmul, conv2d and "
                "attention in bf16 with float32 sums; float32 weights, gradients and optimizer)%s\n",
                s_.dev.is_cpu() ? ("; bf16 GEMM: " + bf16_gemm_info()).c_str() : "");
  else if (c_.precision == "fp16")
    std::printf("phalanx-train: precision fp16: forward and loss under autocast float16, dynamic loss scaling "
                "(GradScaler, initial scale %g, one skip decision on every rank)\n",
                static_cast<double>(s_.scaler->get_scale()));
  if (!resume_path.empty() && start_epoch < c_.epochs)
    std::printf("phalanx-train: resumed at step %lld (epoch %lld, checkpoint written at %s) from %s\n",
                static_cast<long long>(step), static_cast<long long>(start_epoch + 1), sp_.resumed.written_at().c_str(),
                resume_path.c_str());
  else if (!resume_path.empty())
    std::printf("phalanx-train: resumed at step %lld (epoch %lld done, checkpoint written at %s) from %s: "
                "nothing left to train (raise --epochs to go on)\n",
                static_cast<long long>(step), static_cast<long long>(start_epoch), sp_.resumed.written_at().c_str(),
                resume_path.c_str());
  if (const std::string& was = sp_.precision_change; !was.empty())
    std::printf("phalanx-train: resuming a%s %s checkpoint with --precision %s%s\n",
                was == "bf16" ? "" : "n", was.c_str(), c_.precision.c_str(),
                was == "fp16"            ? " (its loss scale is dropped)"
                : c_.precision == "fp16" ? " (the loss scale starts afresh)"
                                         : "");
  std::fflush(stdout);
}

void TrainingLoop::stop_on_request(std::int64_t epoch, std::int64_t in_epoch) {
  const int sig = vote_->agreed_signal();
  const std::string name = sigabbrev_np(sig) ? std::string("SIG") + sigabbrev_np(sig) : "signal " + std::to_string(sig);
  if (!sp_.ckdir) {
    if (rank_ == 0)
      std::fprintf(stderr, "phalanx-train: stopped by %s at step %lld: nothing saved (no --checkpoint-dir; give one to "
                   "save on a stop and --resume from it)\n", name.c_str(), static_cast<long long>(sp_.step));
    try {
      reporter_.report(false);  // no collective: the other ranks are stopping too
      metrics_.close();
    } catch (...) {
    }
    std::fflush(nullptr);
    std::signal(sig, SIG_DFL);
    std::raise(sig);  // dies by it, as without a handler
    std::_Exit(128 + sig);
  }
  const auto state = checkpoint_state(epoch, in_epoch);
  const std::string path = parallel::save_on_stop(*s_.pg, *sp_.ckdir, state ? *state : parallel::CheckpointState{}, sig);
  metrics_.close();
  if (rank_ == 0)
    std::fprintf(stderr, "phalanx-train: stopped by %s after saving step %lld to %s (verified); --resume continues from "
                 "it\n", name.c_str(), static_cast<long long>(sp_.step), path.c_str());
  throw StoppedOnRequest{sp_.step};
}

void TrainingLoop::train() {
  resumed_step_ = sp_.step;
  params_ = s_.model->parameters();
  for (std::int64_t epoch = sp_.start_epoch; epoch < c_.epochs; ++epoch) run_epoch(epoch);
  vote_->finish();  // the last vote: training is complete, whatever it says
  // The final checkpoint, always (unless this run resumed from the end and trained nothing).
  if (sp_.step != resumed_step_ || sp_.start_epoch < c_.epochs || sp_.resume_path.empty()) save_checkpoint(c_.epochs, 0);
}

// A step is the step plan's passes(): one forward/backward pass, or (exact mode) this
// rank's micro-batches of the step, after whose last backward the gradients hold the mean
// over the global batch.
void TrainingLoop::run_epoch(std::int64_t epoch) {
  s_.sampler->set_epoch(epoch);
  s_.model->train();
  std::int64_t batch_index = 0, micro = 0;  // steps of the epoch taken; passes of the step in progress
  progress_.start_epoch(epoch, sp_.skip_batches);
  for (Batch& b : *s_.loader) {
    if (batch_index < sp_.skip_batches) {  // resuming mid-epoch: already trained on these
      if (++micro == plan_.passes()) micro = 0, ++batch_index;
      continue;
    }
    if (micro == 0) {
      parallel::note_step(sp_.step + 1);  // the step a failure names (phalanx-run's recurrence check)
      if (vote_->stop_now()) stop_on_request(epoch, batch_index);
      s_.opt->zero_grad();
      plan_.begin_step();
      lr_used_ = s_.opt->param_groups()[0].lr();  // before the schedule moves it
    }
    forward_backward(b, epoch, batch_index, micro);
    if (++micro < plan_.passes()) continue;
    micro = 0;
    take_step(epoch, ++batch_index);
  }
  sp_.skip_batches = 0;
  end_epoch(epoch, batch_index);
}

void TrainingLoop::forward_backward(const Batch& b, std::int64_t epoch, std::int64_t batch_index, std::int64_t micro) {
  const Device dev = s_.dev;
  const std::int64_t step = sp_.step, steps_per_epoch = s_.steps_per_epoch;
  Tensor loss;
  {
    PrecisionScope scope(autocast_dtype_, dev);  // --precision: the forward and the loss; backward outside
    loss = model_loss(s_.model->forward(b.x.to(dev)), b.y.to(dev));
  }
  const float l = loss.item();
  // A non-finite loss stops here, before its gradients reach any weight (and before any
  // checkpoint could hold them): the last good checkpoint stays the newest.
  if (!std::isfinite(l) && !c_.allow_nonfinite)
    throw ValueError(detail::concat("non-finite loss (", l, ") at step ", step + 1, " (epoch ", epoch + 1,
                                    ", step ", batch_index + 1, " of ", steps_per_epoch,
                                    plan_.pass_label(micro), ")",
                                    sp_.ckdir ? "; the last good checkpoint is kept in " + c_.checkpoint_dir : std::string(),
                                    "; lower --lr, check the data, or pass --allow-nonfinite to train on"));
  if (s_.scaler) loss = s_.scaler->scale(loss);  // fp16: the logged loss `l` stays unscaled
  plan_.backward(loss, l, micro, StepWhere{step, epoch, batch_index, steps_per_epoch});
  last_loss_ = l;
}

void TrainingLoop::take_step(std::int64_t epoch, std::int64_t batch_index) {
  std::int64_t& step = sp_.step;
  const float l = last_loss_;
  // The loss logged: this rank's batch's, or (exact mode) the mean over the global batch.
  const double step_loss = plan_.step_loss(l, *s_.pg, s_.dev);
  // A finite loss can still give non-finite gradients (NaN in the data under --no-data-check,
  // an overflow): they would reach every weight, so the step stops here too.
  // Under a GradScaler an inf/NaN gradient is an overflow of the scale: the scaler skips the
  // step and backs off (the same on every rank) instead of stopping the run.
  if (!s_.scaler && !c_.allow_nonfinite && !gradients_finite(params_)) {
    reporter_.report(true);  // every rank is here: the gradients are the same on all
    throw ValueError(detail::concat("non-finite gradient at step ", step + 1, " (epoch ", epoch + 1, ", step ",
                                    batch_index, " of ", s_.steps_per_epoch, "; loss ", step_loss, ")",
                                    sp_.ckdir ? "; the last good checkpoint is kept in " + c_.checkpoint_dir : std::string(),
                                    "; check the data, lower --lr, or pass --allow-nonfinite to train on"));
  }
  if (s_.scaler) s_.scaler->unscale_(*s_.opt);  // the true gradients for the norm and the clipping
  const double grad_norm = metrics_.wants_grad_norm() ? gradient_norm(params_) : 0;
  // The gradients are the same on every rank here (after DDP's reduction), so is the scale.
  if (c_.clip_grad_norm > 0) nn::clip_grad_norm_(params_, c_.clip_grad_norm);
  if (s_.scaler) {
    s_.scaler->step(*s_.opt);
    s_.scaler->update();
  } else {
    s_.opt->step();
  }
  s_.schedule.step();
  ++step;
  plan_.add_step(l, step_loss);
  if (metrics_.enabled()) metrics_.step(step, epoch + 1, step_loss, lr_used_, sp_.elapsed_before + seconds(), grad_norm);
  progress_.update(batch_index, step_loss);
  if (cadence_.checkpoint_after_step(step)) save_checkpoint(epoch, batch_index);
}

// The epoch's sums go to the reporter (with its test loss and accuracy); reported now or
// with the next epochs, then the epoch's checkpoint.
void TrainingLoop::end_epoch(std::int64_t epoch, std::int64_t batches) {
  PendingEpoch done{epoch};
  plan_.end_epoch(done);
  if (s_.data.test) {
    PrecisionScope scope(autocast_dtype_, s_.dev);  // evaluated as trained (bf16 logits read as float32)
    s_.model->eval();
    std::tie(done.test_loss, done.test_acc) = evaluate(*s_.model, s_.data.test, *s_.pg);
  } else if (s_.data.text_val) {
    PrecisionScope scope(autocast_dtype_, s_.dev);
    s_.model->eval();
    done.test_loss = evaluate_lm(*s_.model, s_.data.text_val, *s_.pg);
  }
  reporter_.add(done, batches);
  const bool checkpoint_now = cadence_.checkpoint_after_epoch(epoch);
  if (cadence_.report_after_epoch(epoch, reporter_.steps_unreported(), checkpoint_now))
    reporter_.report(true);
  else
    metrics_.hold();  // the next steps' records wait behind this epoch's
  if (checkpoint_now) save_checkpoint(epoch + 1, 0);
}

void TrainingLoop::save_checkpoint(std::int64_t epoch, std::int64_t in_epoch) {
  if (!sp_.ckdir) return;
  if (const auto state = checkpoint_state(epoch, in_epoch)) sp_.ckdir->save(*state);
}

std::optional<parallel::CheckpointState> TrainingLoop::checkpoint_state(std::int64_t epoch, std::int64_t in_epoch) {
  reporter_.report(true);  // the curves and the metrics file hold every finished epoch
  parallel::CheckpointState s;
  plan_.save_epoch_sums(s, *s_.pg, s_.dev);  // every rank takes part
  if (s_.zero) s_.zero->consolidate_state_dict(0);  // every rank's shard of the state, to rank 0
  if (rank_ != 0) return std::nullopt;
  metrics_.flush();  // the metrics file is never behind a checkpoint
  s.model = s_.net->state_dict();
  s.optimizer = s_.opt->state_dict();
  s.scheduler = s_.schedule.state_dict();
  if (s_.scaler) s.scaler = s_.scaler->state_dict();
  s.step = sp_.step;
  s.epoch = epoch;
  s.step_in_epoch = in_epoch;
  s.world_size = world_;
  s.global_batch = c_.global_batch;
  s.micro_batch = plan_.pass_batch();
  s.exact = plan_.exact();
  s.config = s_.settings;
  // Not a setting a resume must keep (resume.cpp says when it changes); files without it: fp32.
  s.config["precision"] = c_.precision;
  s.scalars["seconds"] = sp_.elapsed_before + seconds();
  const tools::Series &train_curve = reporter_.train_curve(), &test_curve = reporter_.test_curve();
  std::vector<float> tc(train_curve.y.begin(), train_curve.y.end()), ec(test_curve.y.begin(), test_curve.y.end());
  s.user.set("train_curve", tensor(tc, {static_cast<std::int64_t>(tc.size())}));
  s.user.set("test_curve", tensor(ec, {static_cast<std::int64_t>(ec.size())}));
  return s;
}

int TrainingLoop::finish() {
  const double secs = seconds();
  double final_loss = reporter_.last_epoch_loss();
  if (c_.eval_train) {
    PrecisionScope scope(autocast_dtype_, s_.dev);
    s_.model->eval();
    final_loss = s_.data.text_train ? evaluate_lm(*s_.model, s_.data.text_train, *s_.pg)
                                    : evaluate(*s_.model, s_.data.train, *s_.pg).first;
    if (rank_ == 0) std::printf("final mean loss over the training set: %.6f\n", final_loss);
    metrics_.record(nlohmann::json{{"eval_train_loss", final_loss}});
  }
  // The weights first: a metrics file or event folder that could not be written (a full
  // disk) is an error below, but it must not cost the trained weights.
  if (rank_ == 0 && !c_.save.empty()) save_npz(c_.save, s_.net->state_dict());
  if (rank_ == 0 && !c_.plot.empty()) {
    std::vector<tools::Series> series{reporter_.train_curve()};
    if (!reporter_.test_curve().x.empty()) series.push_back(reporter_.test_curve());
    tools::ChartOptions co;
    co.title = "phalanx-train";
    tools::write_svg(c_.plot, series, co);
  }
  metrics_.close();  // a write that failed (a full disk) is an error, not a truncated file
  if (rank_ == 0) {
    nlohmann::json summary{{"final_train_loss", final_loss}, {"steps", sp_.step}, {"seconds", secs},
                           {"world_size", world_}, {"backend", s_.pg->backend_name()}, {"precision", c_.precision}};
    if (reporter_.test_acc() >= 0) summary["test_acc"] = reporter_.test_acc();
    if (s_.data.text_val && !reporter_.test_curve().y.empty()) summary["val_loss"] = reporter_.test_curve().y.back();
    std::printf("%s\n", summary.dump().c_str());
  }
  parallel::destroy_process_group();
  return 0;
}

}  // namespace

int run_training(const TrainConfig& c) {
  TrainingSetup setup = set_up_training(c);  // every check happens before training starts
  StartPoint start = find_start(c, setup);
  TrainingLoop loop(c, setup, start);
  try {
    loop.train();
  } catch (const StoppedOnRequest&) {
    parallel::destroy_process_group();
    return parallel::kExitStoppedAfterSave;
  }
  return loop.finish();
}

}  // namespace phalanx::trainer
