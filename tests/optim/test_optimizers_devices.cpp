// The optimizers on the sim test accelerator (memory the host cannot read; the CPU kernels
// behind it): every optimizer's fused update, its state, zero_grad and a state_dict round
// trip on sim tensors equal the CPU bit for bit; GradScaler with gradients on sim.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include "support/gradcheck.hpp"
#include "support/optim_cases.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {
std::vector<Tensor> fresh_params(const TensorMap& f, Device dev) {
  std::vector<Tensor> ps;
  for (int i = 0; i < 2; ++i) ps.push_back(f.at("init." + std::to_string(i)).clone().to(dev).requires_grad_());
  return ps;
}

void run_steps(optim::Optimizer& opt, std::vector<Tensor>& ps, const TensorMap& f, int from, int to) {
  for (int k = from; k < to; ++k) {
    for (int i = 0; i < 2; ++i)
      ps[i].set_grad(f.at("grad." + std::to_string(k) + "." + std::to_string(i)).clone().to(ps[i].device()));
    opt.step();
  }
}

std::vector<std::vector<float>> host(const std::vector<Tensor>& ps) {
  std::vector<std::vector<float>> out;
  for (const auto& p : ps) out.push_back(p.to_vector<float>());
  return out;
}
}  // namespace

TEST_CASE("20 steps of every optimizer on sim equal the CPU bit for bit (and PyTorch within 1e-6)") {
  const TensorMap f = optim_fixture();
  for (const char* name : kOptimCases) {
    CAPTURE(name);
    auto cpu = fresh_params(f, Device::cpu()), sim = fresh_params(f, Device::sim());
    auto opt_cpu = make_optimizer(name, cpu), opt_sim = make_optimizer(name, sim);
    run_steps(*opt_cpu, cpu, f, 0, 20);
    run_steps(*opt_sim, sim, f, 0, 20);
    CHECK(sim[0].device() == Device::sim());
    CHECK(host(sim) == host(cpu));
    for (int i = 0; i < 2; ++i)
      CHECK(max_rel_err(sim[i].to(Device::cpu()), f.at(std::string(name) + "." + std::to_string(i))) < 1e-6);
  }
}

TEST_CASE("optimizer state on sim: state_dict round trip, zero_grad, equal to the CPU bit for bit") {
  const TensorMap f = optim_fixture();
  for (const char* name : kOptimCases) {
    CAPTURE(name);
    auto cpu = fresh_params(f, Device::cpu()), sim = fresh_params(f, Device::sim());
    auto opt_cpu = make_optimizer(name, cpu), opt_sim = make_optimizer(name, sim);
    run_steps(*opt_cpu, cpu, f, 0, 10);
    run_steps(*opt_sim, sim, f, 0, 5);
    // The state of the sim optimizer, handed to a fresh one (in memory: the tensors stay
    // where state_dict put them), continues exactly.
    auto resumed = make_optimizer(name, sim);
    resumed->load_state_dict(opt_sim->state_dict());
    run_steps(*resumed, sim, f, 5, 10);
    CHECK(host(sim) == host(cpu));
    opt_sim->zero_grad(false);  // zero-filled on the device
    CHECK(sim[0].grad().device() == Device::sim());
    CHECK(sim[0].grad().to_vector<float>() == std::vector<float>(sim[0].numel(), 0.f));
    opt_sim->zero_grad();
    CHECK_FALSE(sim[0].grad().defined());
  }
}

TEST_CASE("training an MLP on sim (autograd gradients, SGD momentum and AdamW) equals the CPU bit for bit") {
  Generator g(4);
  const Tensor x = randn({32, 16}, &g), y = randint(5, {32}, &g);
  for (const std::string opt_name : {"sgd_momentum", "adamw"}) {
    CAPTURE(opt_name);
    std::vector<std::vector<float>> result[2];
    for (int d = 0; d < 2; ++d) {
      const Device dev = d == 0 ? Device::cpu() : Device::sim();
      Generator init(3);
      auto model = nn::mlp({16, 32, 5}, "relu", &init);
      model->to(dev);
      auto opt = make_optimizer(opt_name, model->parameters());
      const Tensor xd = x.to(dev), yd = y.to(dev);
      for (int step = 0; step < 10; ++step) {
        opt->zero_grad();
        cross_entropy(model->forward(xd), yd).backward();
        opt->step();
      }
      result[d] = host(model->parameters());
    }
    CHECK(result[0] == result[1]);
  }
}

TEST_CASE("GradScaler on sim (gradients the host cannot read): PyTorch's fixture, skips and weights equal the CPU's") {
  const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/grad_scaler_parity.npz");
  const auto bits_double = [](std::int64_t b) {
    double v;
    std::memcpy(&v, &b, sizeof v);
    return v;
  };
  for (const std::string run : {"sgd_momentum", "sgd_clip"}) {
    CAPTURE(run);
    const auto c = f.at(run + ".config").to_vector<std::int64_t>();
    const auto options = optim::GradScalerOptions()
                             .init_scale(bits_double(c[0]))
                             .growth_factor(bits_double(c[1]))
                             .backoff_factor(bits_double(c[2]))
                             .growth_interval(static_cast<std::int64_t>(bits_double(c[3])));
    const float clip = f.at(run + ".clip").item();
    const auto want_stepped = f.at(run + ".stepped").to_vector<std::int64_t>();
    const auto want_scale = f.at(run + ".scale").to_vector<float>();
    std::vector<std::vector<float>> weights;
    for (Device dev : {Device::cpu(), Device::sim()}) {
      CAPTURE(dev.str());
      auto ps = fresh_params(f, dev);
      optim::SGD opt(ps, optim::SGDOptions(0.1).momentum(0.9));
      optim::GradScaler scaler(options);
      for (int k = 0; k < 24; ++k) {
        CAPTURE(k);
        opt.zero_grad();
        const Tensor g0 = f.at("grad." + std::to_string(k) + ".0").to(dev), g1 = f.at("grad." + std::to_string(k) + ".1").to(dev);
        scaler.scale(sum(ps[0] * g0) + sum(ps[1] * g1)).backward();
        if (clip > 0) {
          scaler.unscale_(opt);
          nn::clip_grad_norm_(ps, clip);
        }
        CHECK(scaler.step(opt) == (want_stepped[k] == 1));
        scaler.update();
        CHECK(static_cast<float>(scaler.get_scale()) == want_scale[k]);
      }
      for (const auto& p : host(ps)) weights.push_back(p);
    }
    CHECK(weights[0] == weights[2]);
    CHECK(weights[1] == weights[3]);
  }
}
