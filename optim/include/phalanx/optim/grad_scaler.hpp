#pragma once
// Loss scaling for fp16 training, with the semantics and defaults of PyTorch's
// torch.cuda.amp.GradScaler / torch.amp.GradScaler:
//
//   optim::GradScaler scaler;                              // 2^16, x2 after 2000 clean steps, x0.5 on inf
//   for (...) {
//     opt.zero_grad();
//     scaler.scale(loss_fn(model->forward(x), y)).backward();
//     scaler.unscale_(opt);                                // optional: before clipping
//     nn::clip_grad_norm_(params, 1.0);
//     scaler.step(opt);                                    // skipped when a gradient is inf/NaN
//     scaler.update();
//   }
//
// With several workers, give the scaler an agreement (parallel::found_inf_agreement(pg)):
// the found-inf flag is then one decision taken on every rank (an allreduce MAX of one number
// per unscale_), so every rank skips the same steps and backs off identically, whatever the
// reduction did with the gradients. optim never talks to a process group itself.
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "phalanx/core/arg.hpp"
#include "phalanx/core/tensor.hpp"
#include "phalanx/core/tensor_map.hpp"
#include "phalanx/optim/optimizer.hpp"

namespace phalanx::optim {

/// Chainable: `GradScalerOptions().init_scale(1024).growth_interval(100)`. PyTorch's defaults.
struct GradScalerOptions {
  PHALANX_ARG(double, init_scale) = 65536.0;  ///< 2^16
  PHALANX_ARG(double, growth_factor) = 2.0;   ///< > 1
  PHALANX_ARG(double, backoff_factor) = 0.5;  ///< < 1
  PHALANX_ARG(std::int64_t, growth_interval) = 2000;
  PHALANX_ARG(bool, enabled) = true;
};

/// Combines this rank's found-inf flag with every rank's: returns true when any rank found an
/// inf/NaN. Every rank must call it at the same point (it is a collective). Empty: this rank
/// decides alone (one process).
using FoundInfAgreement = std::function<bool(bool found_inf)>;

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {}, FoundInfAgreement agreement = nullptr);

  /// loss * scale (a new tensor, autograd-tracked); `loss` itself when disabled.
  Tensor scale(const Tensor& loss) const;
  /// Divides the gradients of `opt`'s parameters by the scale and records whether any was
  /// inf/NaN (agreed across ranks when there is an agreement). Once per optimizer between
  /// update()s: a second call, or one after step(), throws ValueError. A no-op when disabled.
  void unscale_(Optimizer& opt);
  /// unscale_(opt) unless done already, then opt.step() unless a gradient was inf/NaN.
  /// Returns whether opt.step() ran. Once per optimizer between update()s.
  bool step(Optimizer& opt);
  /// The next scale: x backoff_factor (and the growth tracker to 0) when any optimizer found
  /// an inf/NaN since the last update; else x growth_factor after growth_interval clean steps
  /// in a row (never to an infinite scale). Throws ValueError when no optimizer was unscaled
  /// or stepped since the last update.
  void update();
  /// Sets the scale to `new_scale` (the growth tracker is kept), as update(new_scale).
  void update(double new_scale);

  /// The current scale (a float32 value, as PyTorch's); 1 when disabled.
  double get_scale() const { return enabled_ ? static_cast<double>(scale_) : 1.0; }
  bool is_enabled() const { return enabled_; }
  double get_growth_factor() const { return growth_factor_; }
  void set_growth_factor(double f) { growth_factor_ = f; }
  double get_backoff_factor() const { return backoff_factor_; }
  void set_backoff_factor(double f) { backoff_factor_ = f; }
  std::int64_t get_growth_interval() const { return growth_interval_; }
  void set_growth_interval(std::int64_t n) { growth_interval_ = n; }
  /// Clean steps in a row since the scale last changed (PyTorch's _growth_tracker).
  std::int64_t growth_tracker() const { return enabled_ ? growth_tracker_ : 0; }
  /// Whether the last unscale_ of `opt` since update() found an inf/NaN (agreed); false when
  /// `opt` was not unscaled.
  bool found_inf(const Optimizer& opt) const;
  void set_agreement(FoundInfAgreement agreement) { agreement_ = std::move(agreement); }

  /// PyTorch's keys: "scale", "growth_factor", "backoff_factor" (doubles, stored as the int64
  /// bits of the double, as the optimizers' options: exact), "growth_interval",
  /// "_growth_tracker" (int64). Empty when disabled. Take it after update().
  TensorMap state_dict() const;
  /// Restores state_dict()'s values (a no-op when disabled). Throws ValueError, changing
  /// nothing, on an empty map (saved from a disabled scaler), a missing key or a bad value.
  void load_state_dict(const TensorMap& state);

 private:
  enum class Stage : std::uint8_t { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    const Optimizer* opt;
    Stage stage;
    bool found_inf;
  };
  PerOptimizer& state_of(const Optimizer& opt);
  const PerOptimizer* find(const Optimizer& opt) const;

  bool enabled_;
  float scale_;  // float32, as PyTorch's scale tensor
  double growth_factor_, backoff_factor_;
  std::int64_t growth_interval_;
  std::int64_t growth_tracker_ = 0;
  FoundInfAgreement agreement_;
  // One entry per optimizer seen since the last update(); cleared (capacity kept) by update(),
  // so a step allocates nothing after the first.
  std::vector<PerOptimizer> per_optimizer_;
};

}  // namespace phalanx::optim
