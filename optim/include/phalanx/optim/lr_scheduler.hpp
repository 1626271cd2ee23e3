#pragma once
// Learning-rate schedules with PyTorch 1.13's semantics (torch.optim.lr_scheduler): each
// constructor performs the initial step (last_epoch 0); step() advances by one (call it per
// iteration or per epoch, as you choose); rates follow PyTorch's chainable (recursive) forms,
// so the sequences equal PyTorch's to the last bits.
#include <cstdint>
#include <memory>
#include <vector>

#include "phalanx/optim/optimizer.hpp"

namespace phalanx::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  /// Advances one step and writes the new rate into every group.
  void step();
  /// Jumps to `epoch` using the closed form when there is one (PyTorch's step(epoch)).
  void step_to(std::int64_t epoch);
  std::vector<double> get_last_lr() const { return last_lr_; }
  std::int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }

  /// The schedule's position: last_epoch, step_count, base_lrs, last_lr (rates as the
  /// int64 bits of their doubles, so a restore is exact). The rates in the optimizer's
  /// groups are the optimizer's state: restore both to resume a run.
  TensorMap state_dict() const;
  /// Restores state_dict()'s values; throws ValueError (changing nothing) when a key is
  /// missing or the group count differs.
  void load_state_dict(const TensorMap& state);

 protected:
  explicit LRScheduler(Optimizer& opt);
  /// The chainable form: the next rates given the groups' current ones.
  virtual std::vector<double> compute_lr() = 0;
  /// The closed form at last_epoch_; defaults to compute_lr().
  virtual std::vector<double> closed_form_lr() { return compute_lr(); }
  void initial_step();
  double group_lr(std::size_t g) const { return opt_.param_groups()[g].lr(); }

  Optimizer& opt_;
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;

 private:
  friend class SequentialLR;
  void apply(const std::vector<double>& lrs);
  std::vector<double> last_lr_;
};

/// Linear ramp of the factor from start_factor to end_factor over total_iters steps
/// (the gradual warmup of Goyal et al. with start_factor < 1).
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& opt, double start_factor = 1.0 / 3, double end_factor = 1.0,
           std::int64_t total_iters = 5);

 protected:
  std::vector<double> compute_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  double start_, end_;
  std::int64_t total_;
};

/// Multiplies by gamma every step_size steps.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, std::int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> compute_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  std::int64_t step_size_;
  double gamma_;
};

/// Multiplies by gamma at each milestone (a milestone listed twice applies gamma twice).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& opt, std::vector<std::int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> compute_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  std::vector<std::int64_t> milestones_;  // sorted
  double gamma_;
};

/// Cosine annealing from the base rate to eta_min over t_max steps.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, std::int64_t t_max, double eta_min = 0.0);

 protected:
  std::vector<double> compute_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  std::int64_t t_max_;
  double eta_min_;
};

/// Runs schedulers one after another, switching at the milestones
/// (e.g. LinearLR warmup for 5 steps, then CosineAnnealingLR).
class SequentialLR {
 public:
  SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<std::int64_t> milestones);
  void step();
  std::vector<double> get_last_lr() const { return last_lr_; }
  std::int64_t last_epoch() const { return last_epoch_; }
  /// last_epoch, last_lr and each scheduler's state under "schedulers.<i>.".
  TensorMap state_dict() const;
  void load_state_dict(const TensorMap& state);

 private:
  Optimizer& opt_;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<std::int64_t> milestones_;
  std::int64_t last_epoch_;
  std::vector<double> last_lr_;
};

}  // namespace phalanx::optim
