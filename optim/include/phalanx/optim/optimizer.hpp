#pragma once
// Optimizer base: parameter groups with per-group options, zero_grad, state dicts.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "phalanx/core/tensor.hpp"
#include "phalanx/core/tensor_map.hpp"

namespace phalanx::optim {

/// Options of one group by name ("lr", "momentum", "betas1", ...). Doubles, as in Python.
using Options = std::map<std::string, double>;

struct ParamGroup {
  std::vector<Tensor> params;
  Options options;
  double lr() const { return options.at("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
};

/// Per-parameter state: step count and named buffers (momentum_buffer, exp_avg, ...).
struct ParamState {
  std::int64_t step = 0;
  std::map<std::string, Tensor> buffers;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Applies one update to every parameter that has a gradient.
  virtual void step() = 0;
  virtual const char* name() const = 0;

  /// Adds a group; options missing from `overrides` take the optimizer's defaults.
  void add_param_group(std::vector<Tensor> params, const Options& overrides = {});
  /// Clears gradients: undefined (default, frees memory and lets backward reuse buffers)
  /// or zero-filled.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const Options& defaults() const { return defaults_; }

  /// Tensors and hyper-parameters, saved with checkpoints as .npz:
  ///   state.<i>.step (int64), state.<i>.<buffer> (float32), i counts parameters across groups
  ///   param_groups.<g>.<option>: int64 holding the IEEE-754 bits of the double, so a
  ///   round trip is exact.
  virtual TensorMap state_dict() const;  // virtual: ZeroRedundancyOptimizer's is sharded
  /// Restores state saved from an optimizer of the same type over the same parameter shapes.
  virtual void load_state_dict(const TensorMap& state);

 protected:
  Optimizer(std::vector<Tensor> params, Options defaults);
  ParamState& state_of(std::size_t group, std::size_t index);

 private:
  void validate_options(const Options& o) const;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;  // parallel to groups_
  Options defaults_;
};

}  // namespace phalanx::optim
