#pragma once
// Module: named parameters, buffers and submodules with PyTorch's naming ("0.weight").
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "phalanx/core/tensor.hpp"
#include "phalanx/core/tensor_map.hpp"

namespace phalanx::nn {

class Module {
 public:
  virtual ~Module() = default;
  /// The one-input forward. A module whose forward takes other arguments (several inputs)
  /// just declares its own forward(...) and calls it directly, or under DDP through
  /// ddp->forward<ItsClass>(inputs...); this default then throws ValueError naming it.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  /// One line for printing and messages: the class name without namespaces by default
  /// ("TwoTower"); built-in layers add their arguments, as PyTorch's extra_repr
  /// ("Linear(in_features=64, out_features=10, bias=True)").
  virtual std::string describe() const;

  /// Parameters in registration order, depth first, with dotted names. A tensor registered
  /// under several names (a tied weight: nanoGPT's lm_head.weight is transformer.wte.weight)
  /// is listed once, under the first name, as PyTorch's remove_duplicate: DDP reduces it
  /// once, an optimizer steps it once, ZeRO owns it once. remove_duplicate false lists every
  /// name (what state_dict() stores).
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool remove_duplicate = true) const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool remove_duplicate = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }

  /// Parameters then buffers, sharing storage with the module (like PyTorch's state_dict).
  /// A tied tensor appears under each of its names, as in PyTorch.
  TensorMap state_dict() const;
  /// Copies values in. strict: every name must match both ways (a tied tensor's every name
  /// too, as PyTorch); shapes always must. A tied tensor given under several names takes the
  /// value of the last of them in state_dict() order (PyTorch's order).
  void load_state_dict(const TensorMap& state, bool strict = true);

  /// Makes this module's parameter `name` (registered here, not dotted) the tensor `t` itself,
  /// as PyTorch's `module.weight = other.weight`: the way to tie weights. Shape and dtype must
  /// match (ShapeError / TypeError), and the device (ValueError); `t` must be a leaf (a
  /// computed tensor never gets a gradient: ValueError); a leaf that does not require grad
  /// (a detach()ed tensor) is made to, as nn.Parameter(t). An unknown name is a ValueError. Returns `t`: a layer that
  /// Returns `t`. The module's own member (Linear::weight, ...) is updated too, through
  /// on_parameter_replaced, so forward reads the tensor the optimizer steps.
  Tensor replace_parameter(const std::string& name, const Tensor& t);

  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Moves every parameter and buffer to `device` in place (handles stay valid; gradients
  /// are dropped).
  void to(Device device);
  /// Clears gradients: set to undefined (default) or to zero.
  void zero_grad(bool set_to_none = true);
  /// Multi-line summary of the module tree.
  std::string str() const;

 protected:
  /// Called by replace_parameter once parameter `name` is `t`: a module that keeps a handle
  /// to the parameter (Linear::weight) reassigns it here, or forward would read the old
  /// tensor, which no optimizer holds any more (a silent untie).
  virtual void on_parameter_replaced(const std::string& name, const Tensor& t) {
    (void)name;
    (void)t;
  }
  /// Returns a handle to the registered tensor (it aliases the stored one, as every Tensor copy
  /// does; a reference into the list would dangle at the next registration).
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, bool buffers, std::vector<std::pair<std::string, Tensor>>& out,
               std::set<const TensorImpl*>* seen) const;
  /// Whether this module or a descendant may hold a tensor also held under another name.
  bool may_share() const;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  /// Set by replace_parameter and by registering a tensor that may be registered already:
  /// only then do named_parameters/named_buffers build a set to drop duplicates.
  bool may_share_ = false;
};

using ModulePtr = std::shared_ptr<Module>;

/// The state dict with `prefix` taken off every key that starts with it (PyTorch's
/// consume_prefix_in_state_dict_if_present): a file saved from a model wrapped in PyTorch's
/// DDP has "module.0.weight" where Phalanx's models (DDP-wrapped or not) say "0.weight".
TensorMap strip_prefix(const TensorMap& state, const std::string& prefix);

}  // namespace phalanx::nn
