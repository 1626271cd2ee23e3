#pragma once
// phalanx-train's set-up: the group, the data, the model under DDP, the optimizer and its
// rate schedule, the sampler and the loader. Every check happens here, before training.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <phalanx/optim/grad_scaler.hpp>
#include <phalanx/parallel/found_inf_agreement.hpp>
#include <phalanx/phalanx.hpp>

#include "model_spec.hpp"
#include "step_plan.hpp"
#include "train_config.hpp"
#include "trainer_data.hpp"

namespace phalanx::trainer {

/// The rate schedule: the warmup (LinearLR), then constant, cosine, step or multistep.
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

/// The optimizer of --optimizer over `params` at rate `lr`. With `no_decay` (a GPT under
/// adamw: nn::decay_groups' no_decay tensors), AdamW gets nanoGPT's two groups: the
/// parameters in `no_decay` without weight decay, the others with --weight-decay.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const std::vector<Tensor>& params, double lr,
                                                 const std::vector<Tensor>* no_decay = nullptr);
/// nanoGPT's AdamW groups over `params`: the parameters not in `no_decay` (with the
/// optimizer's weight decay), then those in it (weight decay 0); an empty one is left out.
/// make_optimizer and --zero's ZeroRedundancyOptimizer both use it, so their parameter
/// numbering (a checkpoint's optimizer state) is the same.
std::vector<parallel::ZeroGroup> decay_param_groups(const std::vector<Tensor>& params,
                                                    const std::vector<Tensor>& no_decay);

struct TrainingSetup {
  ProcessGroupPtr pg;
  Device dev;
  int world = 1, rank = 0;
  Datasets data;
  std::string model_desc;  ///< the MLP's widths, the CNN's spec with its classes ("cnn:32-64:10"), or "gpt:4-4-128:128"
  /// A GPT's tensors without weight decay (nn::decay_groups), for make_optimizer.
  std::vector<Tensor> no_decay;
  /// A GPT's dropout stream: PCG stream `rank` of --seed (each rank its own masks); a run
  /// resumed at step S draws from stream `rank` of --seed + S.
  std::unique_ptr<Generator> dropout_gen;
  std::uint64_t seed = 0;  ///< --seed
  std::int64_t n = 0;      ///< training samples (a GPT's: windows)
  optim::ScalingPlan plan{};
  std::shared_ptr<nn::Module> net;
  std::shared_ptr<parallel::DDP> model;
  std::unique_ptr<optim::Optimizer> opt;
  parallel::ZeroRedundancyOptimizer* zero = nullptr;  ///< --zero: opt, as ZeRO
  /// fp16 loss scaling (null: none). When set, the loop scales the loss before backward,
  /// unscales before the norm and the clipping, lets the scaler skip a step with inf/NaN
  /// gradients instead of stopping, and saves and restores its state with the checkpoints.
  /// Build it with parallel::found_inf_agreement(pg) so every rank skips the same steps.
  std::unique_ptr<optim::GradScaler> scaler;
  std::unique_ptr<StepPlan> step;  ///< how a step runs (exact mode or not)
  samplers::SamplerPtr sampler;
  std::unique_ptr<samplers::DataLoader> loader;
  std::int64_t steps_per_epoch = 0;
  Schedule schedule;
  /// The settings a resume must keep (compared with a checkpoint's).
  std::map<std::string, std::string> settings;
};

/// Initialises the group (--backend, --device), loads and checks the data, checks that the
/// ranks agree, builds everything; throws a one-line error on bad input.
TrainingSetup set_up_training(const TrainConfig& c);

}  // namespace phalanx::trainer
