// Where a run starts (resume.hpp).
#include "resume.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include <phalanx/core/env.hpp>

#include "checkpoint_share.hpp"

namespace phalanx::trainer {

namespace {

bool elastic_launch() { return env::flag("PHALANX_ELASTIC", false); }

/// Loads checkpoint `ck` (read from sp.resume_path) into the model, the optimizer and the
/// schedule, and sets where the run resumes: its step, epoch, partial sums (into the step
/// plan) and curves.
void restore(const TrainConfig& c, TrainingSetup& s, parallel::LoadedCheckpoint& ck, StartPoint& sp) {
  const int world = s.world, rank = s.rank;
  const std::int64_t steps_per_epoch = s.steps_per_epoch;
  const std::string& resume_path = sp.resume_path;
  s.net->load_state_dict(ck.state.model);
  s.opt->load_state_dict(ck.state.optimizer);  // the rates as they were (the settings matched)
  if (s.schedule.empty() != ck.state.scheduler.empty())
    throw ConfigError("checkpoint " + resume_path + (s.schedule.empty() ? " has an LR schedule and this run has none"
                                                                      : " has no LR schedule and this run has one") +
                      ": resume with the same --warmup-steps and --lr-schedule");
  try {
    s.schedule.load_state_dict(ck.state.scheduler);
  } catch (const ValueError& e) {
    throw ConfigError("checkpoint " + resume_path + ": its LR schedule does not fit this run's (" + e.what() +
                      "): resume with the same --warmup-steps and --lr-schedule");
  }
  // --precision may change on resume (the weights and the optimizer are float32 masters in
  // every precision); a file without it was written before the option: fp32.
  const auto saved = ck.state.config.find("precision");
  const std::string precision = saved == ck.state.config.end() ? "fp32" : saved->second;
  if (precision != c.precision) sp.precision_change = precision;
  // The loss scale goes on where it was (fp16 to fp16); a file without one (written without
  // loss scaling) leaves this run's scaler at its initial scale.
  if (s.scaler && ck.state.scaler.size() != 0) s.scaler->load_state_dict(ck.state.scaler);
  sp.step = ck.state.step;
  sp.start_epoch = ck.state.epoch;
  // Each rank's dropout stream is not in the checkpoint (rank 0 writes it): a resumed run
  // draws from stream `rank` of seed + step, the same for every resume from this step.
  if (s.dropout_gen) s.dropout_gen->seed_pcg(s.seed + static_cast<std::uint64_t>(sp.step), static_cast<std::uint64_t>(rank));
  sp.skip_batches = ck.state.step_in_epoch;
  if (sp.skip_batches > steps_per_epoch || sp.step != sp.start_epoch * steps_per_epoch + sp.skip_batches)
    throw ConfigError(detail::concat("checkpoint ", resume_path, " is at step ", sp.step, " (epoch ", sp.start_epoch + 1,
                                     ", step ", sp.skip_batches, " in it) but this run has ", steps_per_epoch,
                                     " steps per epoch: resume with the same data and --drop-last"));
  s.step->restore_epoch_sums(ck.state, world, rank, resume_path);
  for (auto* curve : {&sp.train_curve, &sp.test_curve})
    if (const Tensor* t = ck.state.user.find(curve == &sp.train_curve ? "train_curve" : "test_curve"))
      for (float v : t->to_vector<float>()) {
        curve->x.push_back(static_cast<double>(curve->x.size() + 1));
        curve->y.push_back(v);
      }
  if (auto it = ck.state.scalars.find("seconds"); it != ck.state.scalars.end() && std::isfinite(it->second))
    sp.elapsed_before = it->second;
  sp.resumed = ck.manifest;
}

}  // namespace

StartPoint find_start(const TrainConfig& c, TrainingSetup& s) {
  StartPoint sp;
  if (s.data.text_val) sp.test_curve.label = "validation loss";
  const int world = s.world, rank = s.rank;
  // (Under --zero a checkpoint holds the replicated optimizer's format: the same as a fresh one's.)
  const TensorMap model_now = s.net->state_dict(),
                  opt_now = s.zero ? make_optimizer(c, s.model->parameters(), s.plan.lr, s.no_decay.empty() ? nullptr : &s.no_decay)->state_dict() : s.opt->state_dict();
  parallel::CheckpointExpect expect;
  expect.world_size = world;
  expect.global_batch = c.global_batch;
  expect.micro_batch = s.step->pass_batch();
  expect.exact = s.step->exact() ? 1 : 0;  // exact mode resumes on any world size dividing its micro-batches
  // Under an elastic launcher (PHALANX_ELASTIC=1) the world size changes between rounds: a
  // normal-mode checkpoint then resumes on any W that divides the global batch (B / W a
  // worker, checked when the step plan is made). The sampler's global step covers the same
  // samples on every W (DistributedSampler hands rank r every W-th index, B / W a step),
  // so skipping step_in_epoch steps neither repeats nor skips a sample.
  if (!s.step->exact() && elastic_launch()) {
    expect.world_size = parallel::kAnyWorld;
    expect.micro_batch = -1;
  }
  expect.model = &model_now;
  expect.optimizer = &opt_now;
  expect.config = &s.settings;
  std::unique_ptr<parallel::CheckpointDir>& ckdir = sp.ckdir;
  if (!c.checkpoint_dir.empty()) {
    ckdir = std::make_unique<parallel::CheckpointDir>(c.checkpoint_dir, c.keep_checkpoints);
    if (rank == 0) ckdir->lock();  // one run per folder, for the whole run; a killed writer's temp files go
    // On every node: a checkpoint transfer killed mid-write (checkpoint_share) left its temporary.
    if (parallel::read_launch_env().local_rank == 0) remove_stale_received_temps(ckdir->dir());
  }
  const int restart = parallel::read_launch_env().restart_count;
  std::string& resume_path = sp.resume_path;
  std::optional<parallel::LoadedCheckpoint> loaded;
  // Nodes with folders of their own: the job's newest checkpoint reaches every node's first.
  // On a restart with --resume-from too: a node whose folder has nothing newer would load
  // --resume-from while the others resume from the job's newest.
  if (ckdir && (restart > 0 || (c.resume && c.resume_from.empty())))
    share_newest_checkpoint(*ckdir, expect, *s.pg, s.dev, parallel::read_launch_env().local_rank,
                            c.keep_checkpoints);
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
  if (loaded) restore(c, s, *loaded, sp);
  // Where the ranks resume must agree too (they read the same folder; a rank that found
  // another file, or none, is named here rather than diverging silently).
  parallel::check_consistent({{"resume step", std::to_string(sp.step)}}, s.pg);
  return sp;
}

}  // namespace phalanx::trainer
