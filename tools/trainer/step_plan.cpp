// How one optimizer step runs, in normal and in exact mode (step_plan.hpp).
#include "step_plan.hpp"

#include <algorithm>
#include <vector>

#include <phalanx/parallel/exact.hpp>

#include "evaluation.hpp"

namespace phalanx::trainer {

namespace {

// One pass a step: this rank's shard of the global batch (DistributedSampler), whose
// backward all-reduces. The losses are this rank's (float sums, as the report adds them).
class ShardStep final : public StepPlan {
 public:
  // The linear scaling's per-rank batch B / W (it checks that W divides B).
  ShardStep(const TrainConfig& c, int world)
      : options_(samplers::DistributedSamplerOptions().shuffle(c.shuffle).seed(c.seed).drop_last(c.drop_last)),
        world_(world),
        batch_(c.global_batch / world) {}

  parallel::DDPOptions ddp_options() const override { return {}; }
  samplers::SamplerPtr make_sampler(std::int64_t n) override {
    return std::make_shared<samplers::DistributedSampler>(n, options_);
  }
  samplers::DataLoaderOptions loader_options() const override {
    return samplers::DataLoaderOptions{batch_}.drop_last(options_.drop_last());
  }
  std::int64_t steps_per_epoch(const samplers::DataLoader& loader) const override { return loader.num_batches(); }
  std::int64_t pass_batch() const override { return batch_; }
  bool exact() const override { return false; }
  bool losses_agreed() const override { return false; }
  std::string describe() const override { return {}; }

  std::int64_t passes() const override { return 1; }
  void begin_step() override {}
  std::string pass_label(std::int64_t) const override { return {}; }
  void backward(Tensor& loss, float, std::int64_t, const StepWhere&) override {
    loss.backward();  // the gradients are all-reduced when it returns: every rank sees the same
  }
  double step_loss(float last, ProcessGroup&, Device) override { return last; }
  void add_step(float last, double) override {
    loss_sum_ += last;
    steps_ += 1;
  }
  void end_epoch(PendingEpoch& done) override {
    done.loss_sum = loss_sum_;
    done.steps = steps_;
    loss_sum_ = steps_ = 0;
  }

  void save_epoch_sums(parallel::CheckpointState& state, ProcessGroup& pg, Device device) const override {
    Tensor all = zeros({world_, 2});
    const int rank = pg.rank();
    all.data<float>()[2 * rank] = loss_sum_;
    all.data<float>()[2 * rank + 1] = steps_;
    state.user.set("epoch_stats", sum_over_ranks(all, pg, device));
  }
  void restore_epoch_sums(const parallel::CheckpointState& state, int world, int rank, const std::string&) override {
    if (const Tensor* t = state.user.find("epoch_stats")) {  // every rank's partial sums
      const std::vector<float> v = t->to_vector<float>();
      if (t->numel() == 2 * world) {
        loss_sum_ = v[2 * rank];
        steps_ = v[2 * rank + 1];
      } else if (t->numel() % 2 == 0 && t->numel() > 0) {
        // Written on another world size (an elastic job resized): each rank takes the old
        // ranks' mean (their steps, their mean sum), so every step taken so far weighs in
        // the epoch's sum over ranks / steps as one taken at this world size.
        const auto writers = static_cast<float>(t->numel() / 2);
        float loss = 0, steps = 0;
        for (std::int64_t r = 0; r < t->numel() / 2; ++r) {
          loss += v[2 * r];
          steps += v[2 * r + 1];
        }
        loss_sum_ = loss / writers;
        steps_ = steps / writers;
      }
    }
  }

 private:
  const samplers::DistributedSamplerOptions options_;
  const int world_;
  const std::int64_t batch_;
  float loss_sum_ = 0, steps_ = 0;  // this rank's, of the epoch in progress
};

// Exact mode: this rank's micro-batches of every global batch (MicroBatchSampler, the same
// micro-batches on any world size), after whose last backward the gradients hold the mean
// over the global batch, the same bits on any world size. The losses are means over the
// global batch (exact_mean), the same on every rank and world size.
class MicroBatchStep final : public StepPlan {
 public:
  MicroBatchStep(const TrainConfig& c, int world)
      : mode_{true, c.global_batch, c.micro_batch}, plan_(parallel::exact_plan(mode_, world)) {
    options_.global_batch = c.global_batch;
    options_.micro_batch = c.micro_batch;
    options_.shuffle = c.shuffle;
    options_.seed = c.seed;
    options_.drop_last = c.drop_last;
    micro_losses_.reserve(static_cast<std::size_t>(plan_.per_rank));
  }

  parallel::DDPOptions ddp_options() const override { return parallel::DDPOptions().exact(mode_); }
  samplers::SamplerPtr make_sampler(std::int64_t n) override {
    sampler_ = std::make_shared<samplers::MicroBatchSampler>(n, options_);
    return sampler_;
  }
  // The sampler hands out whole micro-batches: the loader drops none.
  samplers::DataLoaderOptions loader_options() const override { return samplers::DataLoaderOptions{pass_batch()}; }
  std::int64_t steps_per_epoch(const samplers::DataLoader&) const override { return sampler_->steps_per_epoch(); }
  std::int64_t pass_batch() const override { return mode_.micro_batch; }
  bool exact() const override { return true; }
  bool losses_agreed() const override { return true; }
  std::string describe() const override {
    return detail::concat("exact mode: ", plan_.micro_batches, " micro-batches of ", mode_.micro_batch, " a step, ",
                          plan_.per_rank, " per worker (the same weights on any number of workers that divides ",
                          plan_.micro_batches, ")");
  }

  std::int64_t passes() const override { return plan_.per_rank; }
  void begin_step() override { micro_losses_.clear(); }
  std::string pass_label(std::int64_t micro) const override {
    return ", micro-batch " + std::to_string(sampler_->micro_batch_index(micro));
  }
  void backward(Tensor& loss, float value, std::int64_t micro, const StepWhere& w) override {
    try {
      loss.backward();  // the last of the step's passes reduces (a non-finite gradient throws on every rank)
    } catch (const ValueError& e) {
      throw ValueError(detail::concat("step ", w.step + 1, " (epoch ", w.epoch + 1, ", step ", w.batch_index + 1, " of ",
                                      w.steps_per_epoch, "): ", e.what()));
    }
    micro_losses_.emplace_back(sampler_->micro_batch_index(micro), static_cast<double>(value));
  }
  // The mean over the global batch's micro-batches (one small allreduce).
  double step_loss(float, ProcessGroup& pg, Device device) override {
    return parallel::exact_mean(pg, micro_losses_, sampler_->micro_batches_per_step(), device);
  }
  void add_step(float, double step_loss) override {
    loss_sum_ += step_loss;
    steps_ += 1;
  }
  void end_epoch(PendingEpoch& done) override {
    done.agreed_loss = loss_sum_ / std::max(1.0, steps_);
    loss_sum_ = steps_ = 0;
  }

  // Rank 0's sums are every rank's, and depend on no world size.
  void save_epoch_sums(parallel::CheckpointState& state, ProcessGroup&, Device) const override {
    state.scalars["epoch_loss_sum"] = loss_sum_;
    state.scalars["epoch_steps"] = steps_;
  }
  void restore_epoch_sums(const parallel::CheckpointState& state, int, int, const std::string& path) override {
    const auto sum = state.scalars.find("epoch_loss_sum"), steps = state.scalars.find("epoch_steps");
    if (sum == state.scalars.end() || steps == state.scalars.end())
      throw IoError("checkpoint " + path + ": written in exact mode without its epoch_loss_sum/epoch_steps: the "
                    "file is damaged");
    loss_sum_ = sum->second;
    steps_ = steps->second;
  }

 private:
  const parallel::ExactMode mode_;
  samplers::MicroBatchSamplerOptions options_;
  const parallel::ExactPlan plan_;
  std::shared_ptr<samplers::MicroBatchSampler> sampler_;
  std::vector<std::pair<std::int64_t, double>> micro_losses_;  // (micro-batch index, loss) of the step's passes
  double loss_sum_ = 0, steps_ = 0;  // of the epoch in progress: the same on every rank and world size
};

}  // namespace

std::unique_ptr<StepPlan> make_step_plan(const TrainConfig& c, int world) {
  if (c.exact) return std::make_unique<MicroBatchStep>(c, world);
  return std::make_unique<ShardStep>(c, world);
}

}  // namespace phalanx::trainer
