#include "phalanx/optim/sgd.hpp"

#include <vector>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx::optim {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o)
    : Optimizer(std::move(params), {{"lr", o.lr()},
                                    {"momentum", o.momentum()},
                                    {"dampening", o.dampening()},
                                    {"weight_decay", o.weight_decay()},
                                    {"nesterov", o.nesterov() ? 1.0 : 0.0}}) {
  if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0))
    throw ValueError("SGD: Nesterov momentum requires a momentum > 0 and zero dampening");
}

void SGD::step() {
  const timeline::Span span("optimizer step", "optim");
  NoGradGuard no_grad;
  // One kernel call per group and device (a group's parameters share one device in practice).
  std::vector<Tensor> grads, bufs;
  std::vector<SgdGroupEntry> entries;
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    ParamGroup& group = param_groups()[g];
    SgdUpdate u{};
    u.lr = static_cast<float>(group.options.at("lr"));
    u.momentum = static_cast<float>(group.options.at("momentum"));
    u.dampening = static_cast<float>(group.options.at("dampening"));
    u.weight_decay = static_cast<float>(group.options.at("weight_decay"));
    u.nesterov = group.options.at("nesterov") != 0.0;
    u.first_step = false;
    const std::size_t n = group.params.size();
    grads.assign(n, Tensor());
    bufs.assign(n, Tensor());
    entries.clear();
    Device device = Device::cpu();
    // A call that throws (a gradient on another device, say) updates none of its entries:
    // their step counts and new momentum buffers are taken back, as if step() never ran.
    std::vector<std::pair<ParamState*, bool>> taken;  // per entry: its state, buffer created here
    const auto flush = [&] {
      try {
        if (!entries.empty()) kernels_for(device).sgd_update_group(entries, u);
      } catch (...) {
        for (auto& [st, created] : taken) {
          --st->step;
          if (created) st->buffers.erase("momentum_buffer");
        }
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
      bool first = false;
      if (u.momentum != 0.f) {
        auto it = st.buffers.find("momentum_buffer");
        if (it == st.buffers.end()) {
          it = st.buffers.emplace("momentum_buffer", Tensor::empty(p.shape(), DType::Float32, p.device())).first;
          first = true;
        }
        bufs[i] = it->second;
      }
      ++st.step;
      if (!entries.empty() && p.device() != device) flush();
      device = p.device();
      entries.push_back({&p, &grads[i], &bufs[i], first});
      taken.emplace_back(&st, first);
    }
    flush();
  }
}

}  // namespace phalanx::optim
