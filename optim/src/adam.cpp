#include "phalanx/optim/adam.hpp"

#include <cmath>
#include <vector>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx::optim {

namespace {
template <typename O>  // AdamOptions or AdamWOptions: the same fields
Options adam_options(const O& o) {
  return {{"lr", o.lr()},
          {"beta1", o.beta1()},
          {"beta2", o.beta2()},
          {"eps", o.eps()},
          {"weight_decay", o.weight_decay()},
          {"amsgrad", o.amsgrad() ? 1.0 : 0.0}};
}
}  // namespace

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o)
    : Adam(std::move(params), adam_options(o), false) {}

Adam::Adam(std::vector<Tensor> params, Options defaults, bool decoupled)
    : Optimizer(std::move(params), std::move(defaults)), decoupled_(decoupled) {}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& o)
    : Adam(std::move(params), adam_options(o), true) {}

void Adam::step() {
  const timeline::Span span("optimizer step", "optim");
  NoGradGuard no_grad;
  // One kernel call per group and device (a group's parameters share one device in practice).
  std::vector<Tensor> grads, vmaxes;
  std::vector<AdamGroupEntry> entries;
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    ParamGroup& group = param_groups()[g];
    const double lr = group.options.at("lr"), beta1 = group.options.at("beta1"),
                 beta2 = group.options.at("beta2"), wd = group.options.at("weight_decay");
    const bool amsgrad = group.options.at("amsgrad") != 0.0;
    const std::size_t n = group.params.size();
    grads.assign(n, Tensor());
    vmaxes.assign(n, Tensor());
    entries.clear();
    Device device = Device::cpu();
    // A call that throws updates none of its entries: their step counts are taken back (the
    // bias corrections depend on them); buffers created here hold zeros, as new ones would.
    std::vector<ParamState*> taken;
    const auto flush = [&] {
      try {
        if (!entries.empty()) kernels_for(device).adam_update_group(entries);
      } catch (...) {
        for (ParamState* st : taken) --st->step;
        throw;
      }
      entries.clear();
      taken.clear();
    };
    for (std::size_t i = 0; i < n; ++i) {
      Tensor& p = group.params[i];
      grads[i] = p.grad();
      if (!grads[i].defined()) continue;
      ParamState& st = state_of(g, i);
      auto buffer = [&](const char* name) -> Tensor& {
        auto it = st.buffers.find(name);
        if (it == st.buffers.end())
          it = st.buffers.emplace(name, zeros(p.shape(), DType::Float32, p.device())).first;
        return it->second;
      };
      Tensor& m = buffer("exp_avg");
      Tensor& v = buffer("exp_avg_sq");
      if (amsgrad) vmaxes[i] = buffer("max_exp_avg_sq");
      ++st.step;
      // Scalars in double, as PyTorch computes them in Python, then cast for the kernel.
      const double t = static_cast<double>(st.step);
      AdamUpdate u{};
      u.lr = static_cast<float>(lr);
      u.beta1 = static_cast<float>(beta1);
      u.beta2 = static_cast<float>(beta2);
      u.eps = static_cast<float>(group.options.at("eps"));
      u.weight_decay = static_cast<float>(wd);
      u.decoupled = decoupled_;
      u.amsgrad = amsgrad;
      u.one_minus_beta1 = static_cast<float>(1.0 - beta1);
      u.one_minus_beta2 = static_cast<float>(1.0 - beta2);
      u.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
      u.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
      u.decay_factor = static_cast<float>(1.0 - lr * wd);
      if (!entries.empty() && p.device() != device) flush();
      device = p.device();
      entries.push_back({&p, &grads[i], &m, &v, &vmaxes[i], u});
      taken.push_back(&st);
    }
    flush();
  }
}

}  // namespace phalanx::optim
