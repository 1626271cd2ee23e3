#include "phalanx/core/nn/module.hpp"

#include <set>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/type_name.hpp"

namespace phalanx::nn {

Tensor Module::forward(const Tensor&) {
  const std::string name = short_type_name(typeid(*this));
  throw ValueError(name + " has no forward(const Tensor&): call its own forward(...), or ddp->forward<" + name +
                   ">(inputs...) under DDP");
}

std::string Module::describe() const { return short_type_name(typeid(*this)); }

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  // A fresh tensor does not require grad yet; one that does is probably registered already
  // (here or in another module), so named_parameters must look for duplicates.
  if (t.defined() && t.requires_grad()) may_share_ = true;
  if (t.defined() && !t.requires_grad()) t.requires_grad_(true);
  params_.emplace_back(name, t);
  return params_.back().second;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  // The layers pass a fresh tensor (held only by `t`); one held elsewhere too may be another
  // module's buffer.
  if (t.defined() && t.impl_ptr().use_count() > 1) may_share_ = true;
  buffers_.emplace_back(name, t);
  return buffers_.back().second;
}

Tensor Module::replace_parameter(const std::string& name, const Tensor& t) {
  const std::string where = short_type_name(typeid(*this)) + ".replace_parameter('" + name + "')";
  for (auto& [n, p] : params_) {
    if (n != name) continue;
    if (!t.defined()) throw ValueError(where + ": the tensor is undefined");
    // A computed tensor never gets a .grad of its own (its gradient flows on to its inputs),
    // so an optimizer holding it would skip it silently.
    if (!t.is_leaf())
      throw ValueError(where + ": the tensor is computed (not a leaf): pass another module's parameter, or "
                               "detach() it");
    if (p.defined() && p.shape() != t.shape())
      throw ShapeError(where + ": the tensor has shape " + shape_str(t.shape()) + " but the parameter has " +
                       shape_str(p.shape()));
    if (p.defined() && p.dtype() != t.dtype())
      throw TypeError(where + ": the tensor is " + dtype_name(t.dtype()) + " but the parameter is " +
                      dtype_name(p.dtype()));
    if (p.defined() && p.device() != t.device())
      throw ValueError(where + ": the tensor is on " + t.device().str() + " but the parameter is on " +
                       p.device().str() + ": move one of the modules with to() first");
    // A parameter trains: a leaf that did not require grad (a detach()ed or fresh tensor)
    // does from now on, as nn.Parameter(t) in PyTorch (documented in module.hpp).
    if (!t.requires_grad()) Tensor(t).requires_grad_(true);
    p = t;
    may_share_ = true;
    on_parameter_replaced(name, t);
    return t;
  }
  std::string have;
  for (const auto& [n, p] : params_) have += (have.empty() ? "" : ", ") + n;
  throw ValueError(short_type_name(typeid(*this)) + " has no parameter '" + name + "' to replace (it has: " +
                   (have.empty() ? std::string("none") : have) + ")");
}

void Module::collect(const std::string& prefix, bool buffers, std::vector<std::pair<std::string, Tensor>>& out,
                     std::set<const TensorImpl*>* seen) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_)
    if (t.defined() && (!seen || seen->insert(t.impl()).second)) out.emplace_back(prefix + name, t);
  // An unnamed child (a wrapper's inner module) contributes under the parent's own prefix.
  for (const auto& [name, child] : children_)
    child->collect(name.empty() ? prefix : prefix + name + ".", buffers, out, seen);
}

bool Module::may_share() const {
  if (may_share_) return true;
  for (const auto& [name, child] : children_)
    if (child->may_share()) return true;
  return false;
}

// zero_grad and clip_grad_norm_ call these every step: the set of seen tensors is only built
// when some module of the tree may hold a tensor twice (a tie).
std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool remove_duplicate) const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!remove_duplicate || !may_share()) {
    collect("", false, out, nullptr);
    return out;
  }
  std::set<const TensorImpl*> seen;
  collect("", false, out, &seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool remove_duplicate) const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!remove_duplicate || !may_share()) {
    collect("", true, out, nullptr);
    return out;
  }
  std::set<const TensorImpl*> seen;
  collect("", true, out, &seen);
  return out;
}

TensorMap Module::state_dict() const {
  TensorMap m;
  for (auto& [n, t] : named_parameters(false)) m.set(n, t.detach());
  for (auto& [n, t] : named_buffers(false)) m.set(n, t.detach());
  return m;
}

void Module::load_state_dict(const TensorMap& state, bool strict) {
  // Every name, a tied tensor's included: PyTorch's strict load wants each of them.
  auto entries = named_parameters(false);
  auto bufs = named_buffers(false);
  entries.insert(entries.end(), bufs.begin(), bufs.end());
  std::set<std::string> expected;
  std::string missing;
  for (const auto& [name, t] : entries) {
    expected.insert(name);
    const Tensor* src = state.find(name);
    if (!src) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    if (src->shape() != t.shape())
      throw ShapeError("load_state_dict: '" + name + "' has shape " + shape_str(src->shape()) +
                       " in the state dict but " + shape_str(t.shape()) + " in the model");
    if (src->dtype() != t.dtype())
      throw TypeError("load_state_dict: '" + name + "' is " + dtype_name(src->dtype()) +
                      " in the state dict but " + dtype_name(t.dtype()) + " in the model");
  }
  if (strict) {
    std::string unexpected;
    for (const auto& [name, t] : state)
      if (!expected.count(name)) unexpected += (unexpected.empty() ? "" : ", ") + name;
    if (!missing.empty() || !unexpected.empty()) {
      // PyTorch's DDP saves its model's keys as "module.<name>"; Phalanx's DDP keeps the plain
      // names, so such a file loads once the prefix is gone.
      bool all_prefixed = state.size() > 0;
      for (const auto& [name, t] : state) all_prefixed = all_prefixed && name.rfind("module.", 0) == 0;
      const std::string hint =
          all_prefixed ? "; every key starts with 'module.' (saved from a model wrapped in PyTorch's DDP): "
                         "load nn::strip_prefix(state, \"module.\") instead"
                       : "; pass strict=false to load a subset";
      throw ValueError("load_state_dict: keys do not match the model (missing: " +
                       (missing.empty() ? std::string("none") : missing) + "; unexpected: " +
                       (unexpected.empty() ? std::string("none") : unexpected) + ")" + hint);
    }
  }
  NoGradGuard no_grad;
  for (auto& [name, t] : entries)
    if (const Tensor* src = state.find(name)) Tensor(t).copy_(*src);
}

TensorMap strip_prefix(const TensorMap& state, const std::string& prefix) {
  TensorMap out;
  for (const auto& [name, t] : state)
    out.set(name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name, t);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, child] : children_) child->train(on);
}

void Module::to(Device device) {
  auto entries = named_parameters();
  auto bufs = named_buffers();
  entries.insert(entries.end(), bufs.begin(), bufs.end());
  for (auto& [name, t] : entries) {
    if (t.device() == device) continue;
    Tensor moved = t.to(device);
    t.set_grad(Tensor());
    t.impl()->set_storage(moved.impl()->storage(), moved.impl()->byte_offset());
  }
}

void Module::zero_grad(bool set_to_none) { zero_grads(parameters(), set_to_none); }

std::string Module::str() const {
  std::string out = describe();
  if (children_.empty()) return out;
  out += "(\n";
  for (const auto& [name, child] : children_) {
    std::string sub = child->str();
    std::string indented;
    for (char c : sub) {
      indented += c;
      if (c == '\n') indented += "  ";
    }
    // An unnamed child is a wrapper's inner module (DDP keeps the plain model's state_dict
    // names that way); PyTorch's wrappers print it as their `module` attribute.
    out += "  (" + (name.empty() ? std::string("module") : name) + "): " + indented + "\n";
  }
  return out + ")";
}

}  // namespace phalanx::nn
