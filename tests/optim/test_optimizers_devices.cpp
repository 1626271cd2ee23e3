// The optimizers on the sim test accelerator (memory the host cannot read; the CPU kernels
// behind it): every optimizer's fused update, its state, zero_grad and a state_dict round
// trip on sim tensors equal the CPU bit for bit.
#include <doctest/doctest.h>

#include <cstdio>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::max_rel_err;

namespace {
TensorMap fixture() { return load_npz(std::string(PHALANX_FIXTURES) + "/optim_parity.npz"); }

std::unique_ptr<optim::Optimizer> make(const std::string& name, std::vector<Tensor> ps) {
  if (name == "sgd") return std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.1});
  if (name == "sgd_momentum") return std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.1, 0.9});
  if (name == "sgd_nesterov") {
    optim::SGDOptions o{0.05, 0.9};
    o.nesterov = true;
    return std::make_unique<optim::SGD>(ps, o);
  }
  if (name == "sgd_wd_dampening") return std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.1, 0.8, 0.1, 1e-2});
  optim::AdamOptions a;
  a.lr = 1e-2;
  if (name == "adam") return std::make_unique<optim::Adam>(ps, a);
  if (name == "adam_wd") {
    a.beta1 = 0.8;
    a.beta2 = 0.99;
    a.weight_decay = 0.1;
    return std::make_unique<optim::Adam>(ps, a);
  }
  a.weight_decay = 0.1;
  if (name == "adamw") return std::make_unique<optim::AdamW>(ps, a);
  a.amsgrad = true;
  return std::make_unique<optim::AdamW>(ps, a);
}

const char* const kNames[] = {"sgd",  "sgd_momentum", "sgd_nesterov", "sgd_wd_dampening",
                              "adam", "adam_wd",      "adamw",        "adamw_amsgrad"};

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
  const TensorMap f = fixture();
  for (const char* name : kNames) {
    CAPTURE(name);
    auto cpu = fresh_params(f, Device::cpu()), sim = fresh_params(f, Device::sim());
    auto opt_cpu = make(name, cpu), opt_sim = make(name, sim);
    run_steps(*opt_cpu, cpu, f, 0, 20);
    run_steps(*opt_sim, sim, f, 0, 20);
    CHECK(sim[0].device() == Device::sim());
    CHECK(host(sim) == host(cpu));
    for (int i = 0; i < 2; ++i)
      CHECK(max_rel_err(sim[i].to(Device::cpu()), f.at(std::string(name) + "." + std::to_string(i))) < 1e-6);
  }
}

TEST_CASE("optimizer state on sim: state_dict round trip, zero_grad, equal to the CPU bit for bit") {
  const TensorMap f = fixture();
  for (const char* name : kNames) {
    CAPTURE(name);
    auto cpu = fresh_params(f, Device::cpu()), sim = fresh_params(f, Device::sim());
    auto opt_cpu = make(name, cpu), opt_sim = make(name, sim);
    run_steps(*opt_cpu, cpu, f, 0, 10);
    run_steps(*opt_sim, sim, f, 0, 5);
    // The state of the sim optimizer, handed to a fresh one (in memory: the tensors stay
    // where state_dict put them), continues exactly.
    auto resumed = make(name, sim);
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
      auto opt = make(opt_name, model->parameters());
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
