#include "phalanx/optim/sgd.hpp"

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx::optim {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o)
    : Optimizer(std::move(params), {{"lr", o.lr},
                                    {"momentum", o.momentum},
                                    {"dampening", o.dampening},
                                    {"weight_decay", o.weight_decay},
                                    {"nesterov", o.nesterov ? 1.0 : 0.0}}) {
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw ValueError("SGD: Nesterov momentum requires a momentum > 0 and zero dampening");
}

void SGD::step() {
  const timeline::Span span("optimizer step", "optim");
  NoGradGuard no_grad;
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    ParamGroup& group = param_groups()[g];
    SgdUpdate u{};
    u.lr = static_cast<float>(group.options.at("lr"));
    u.momentum = static_cast<float>(group.options.at("momentum"));
    u.dampening = static_cast<float>(group.options.at("dampening"));
    u.weight_decay = static_cast<float>(group.options.at("weight_decay"));
    u.nesterov = group.options.at("nesterov") != 0.0;
    for (std::size_t i = 0; i < group.params.size(); ++i) {
      Tensor& p = group.params[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ParamState& st = state_of(g, i);
      Tensor buf;
      u.first_step = false;
      if (u.momentum != 0.f) {
        auto it = st.buffers.find("momentum_buffer");
        if (it == st.buffers.end()) {
          it = st.buffers.emplace("momentum_buffer", Tensor::empty(p.shape(), DType::Float32, p.device())).first;
          u.first_step = true;
        }
        buf = it->second;
      }
      ++st.step;
      kernels_for(p.device()).sgd_update(p, grad, buf, u);
    }
  }
}

}  // namespace phalanx::optim
