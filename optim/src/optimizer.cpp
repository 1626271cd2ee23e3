#include "phalanx/optim/optimizer.hpp"

#include <cstring>
#include <set>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"

namespace phalanx::optim {

Optimizer::Optimizer(std::vector<Tensor> params, Options defaults) : defaults_(std::move(defaults)) {
  validate_options(defaults_);
  add_param_group(std::move(params));
}

void Optimizer::validate_options(const Options& o) const {
  for (const auto& [k, v] : o) {
    if (v < 0 && k != "maximize")
      throw ValueError(detail::concat("optimizer option '", k, "' must be >= 0, got ", v));
    if ((k == "beta1" || k == "beta2") && v >= 1.0)
      throw ValueError(detail::concat("optimizer option '", k, "' must be in [0, 1), got ", v));
  }
}

void Optimizer::add_param_group(std::vector<Tensor> params, const Options& overrides) {
  if (params.empty()) throw ValueError("optimizer got an empty parameter list");
  std::set<const TensorImpl*> seen;
  for (const auto& g : groups_)
    for (const auto& p : g.params) seen.insert(p.impl());
  for (const auto& p : params) {
    if (!p.defined()) throw ValueError("optimizer got an undefined parameter");
    if (p.dtype() != DType::Float32 || !p.is_leaf())
      throw ValueError("optimizer can only optimize float32 leaf tensors, got " + p.str());
    if (!seen.insert(p.impl()).second)
      throw ValueError("a parameter appears in more than one parameter group (or twice in one)");
  }
  for (const auto& [k, v] : overrides)
    if (!defaults_.count(k))
      throw ValueError("unknown option '" + k + "' for optimizer " + std::string(name()));
  validate_options(overrides);
  ParamGroup group{std::move(params), defaults_};
  for (const auto& [k, v] : overrides) group.options[k] = v;
  state_.emplace_back(group.params.size());
  groups_.push_back(std::move(group));
}

ParamState& Optimizer::state_of(std::size_t g, std::size_t i) { return state_[g][i]; }

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_) zero_grads(g.params, set_to_none);
}

namespace {
Tensor double_bits(double v) {
  std::int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return tensor(std::vector<std::int64_t>{bits}, {});
}
double from_bits(const Tensor& t, const std::string& key) {
  if (t.dtype() != DType::Int64 || t.numel() != 1)
    throw ValueError("optimizer state: '" + key + "' must be a one-element int64 (double bits)");
  const std::int64_t bits = t.item_int();
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
}  // namespace

TensorMap Optimizer::state_dict() const {
  TensorMap m;
  std::size_t idx = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& [k, v] : groups_[g].options)
      m.set("param_groups." + std::to_string(g) + "." + k, double_bits(v));
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i, ++idx) {
      const ParamState& s = state_[g][i];
      if (s.step == 0 && s.buffers.empty()) continue;
      const std::string prefix = "state." + std::to_string(idx) + ".";
      m.set(prefix + "step", tensor(std::vector<std::int64_t>{s.step}, {}));
      for (const auto& [name, buf] : s.buffers) m.set(prefix + name, buf.clone());
    }
  }
  return m;
}

void Optimizer::load_state_dict(const TensorMap& m) {
  // Validate everything before changing anything.
  std::size_t total = 0;
  for (const auto& g : groups_) total += g.params.size();
  for (const auto& [key, t] : m) {
    if (key.rfind("param_groups.", 0) == 0) {
      const auto dot = key.find('.', 13);
      const std::size_t g = std::stoul(key.substr(13, dot - 13));
      if (g >= groups_.size())
        throw ValueError(detail::concat("optimizer state has group ", g, " but this ", name(),
                                        " has ", groups_.size(), " group(s)"));
      const std::string opt = key.substr(dot + 1);
      if (!defaults_.count(opt) && opt != "initial_lr")
        throw ValueError("optimizer state option '" + opt + "' is unknown to " + name() +
                         ": was it saved from another optimizer type?");
      from_bits(t, key);
    } else if (key.rfind("state.", 0) == 0) {
      const auto dot = key.find('.', 6);
      const std::size_t idx = std::stoul(key.substr(6, dot - 6));
      if (idx >= total)
        throw ValueError(detail::concat("optimizer state names parameter ", idx, " but there are ",
                                        total));
    } else {
      throw ValueError("unexpected key '" + key + "' in optimizer state");
    }
  }
  std::size_t idx = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (auto& [k, v] : groups_[g].options) {
      if (const Tensor* t = m.find("param_groups." + std::to_string(g) + "." + k)) v = from_bits(*t, k);
    }
    if (const Tensor* t = m.find("param_groups." + std::to_string(g) + ".initial_lr"))
      groups_[g].options["initial_lr"] = from_bits(*t, "initial_lr");
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i, ++idx) {
      ParamState fresh;
      const std::string prefix = "state." + std::to_string(idx) + ".";
      for (const auto& [key, t] : m) {
        if (key.rfind(prefix, 0) != 0) continue;
        const std::string name = key.substr(prefix.size());
        if (name == "step") {
          fresh.step = t.item_int();
        } else {
          if (t.shape() != groups_[g].params[i].shape())
            throw ShapeError("optimizer state '" + key + "' has shape " + shape_str(t.shape()) +
                             " but the parameter has " + shape_str(groups_[g].params[i].shape()));
          fresh.buffers[name] = t.clone().to(groups_[g].params[i].device());
        }
      }
      state_[g][i] = std::move(fresh);
    }
  }
}

}  // namespace phalanx::optim
