// Optimizers against PyTorch 1.13 (fixtures from scripts/make_fixtures.py): 20 steps on the
// same recorded gradients.
#include <doctest/doctest.h>

#include "support/gradcheck.hpp"
#include "support/optim_cases.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {
std::vector<Tensor> fresh_params(const TensorMap& f) {
  return {f.at("init.0").clone().requires_grad_(), f.at("init.1").clone().requires_grad_()};
}

void run_steps(optim::Optimizer& opt, std::vector<Tensor>& ps, const TensorMap& f, int from, int to) {
  for (int k = from; k < to; ++k) {
    for (int i = 0; i < 2; ++i)
      ps[i].set_grad(f.at("grad." + std::to_string(k) + "." + std::to_string(i)).clone());
    opt.step();
  }
}

}  // namespace

TEST_CASE("20 steps of every optimizer equal PyTorch's within 1e-6 relative") {
  const TensorMap f = optim_fixture();
  for (const char* name : kOptimCases) {
    CAPTURE(name);
    auto ps = fresh_params(f);
    auto opt = make_optimizer(name, ps);
    run_steps(*opt, ps, f, 0, 20);
    for (int i = 0; i < 2; ++i) CHECK(max_rel_err(ps[i], f.at(std::string(name) + "." + std::to_string(i))) < 1e-6);
  }
}

TEST_CASE("state_dict round trip: 5 + save/load + 5 equals 10 steps, bit for bit") {
  const TensorMap f = optim_fixture();
  for (const char* name : kOptimCases) {
    CAPTURE(name);
    auto ref = fresh_params(f);
    auto opt_ref = make_optimizer(name, ref);
    run_steps(*opt_ref, ref, f, 0, 10);

    auto ps = fresh_params(f);
    auto opt = make_optimizer(name, ps);
    run_steps(*opt, ps, f, 0, 5);
    const std::string path = "/tmp/phalanx_optim_state_" + std::string(name) + ".npz";
    save_npz(path, opt->state_dict());
    auto resumed = make_optimizer(name, ps);
    resumed->load_state_dict(load_npz(path));
    run_steps(*resumed, ps, f, 5, 10);
    for (int i = 0; i < 2; ++i) CHECK(ps[i].to_vector<float>() == ref[i].to_vector<float>());
    std::remove(path.c_str());
  }
}

TEST_CASE("parameter groups take their own options; parameters without grad are skipped") {
  Tensor a = ones({2}).requires_grad_(), b = ones({2}).requires_grad_(), c = ones({2}).requires_grad_();
  optim::SGD opt({a}, optim::SGDOptions{0.1});
  opt.add_param_group({b}, {{"lr", 1.0}});
  opt.add_param_group({c});
  a.set_grad(ones({2}));
  b.set_grad(ones({2}));
  opt.step();
  CHECK(a.to_vector<float>()[0] == doctest::Approx(0.9f));
  CHECK(b.to_vector<float>()[0] == doctest::Approx(0.f));
  CHECK(c.to_vector<float>()[0] == 1.f);
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  b.set_grad(ones({2}));
  opt.zero_grad(false);
  CHECK(b.grad().to_vector<float>() == std::vector<float>{0, 0});
}

TEST_CASE("bad options and parameters are clear errors") {
  Tensor a = ones({2}).requires_grad_();
  CHECK_THROWS_AS(optim::SGD({a}, optim::SGDOptions{-0.1}), ValueError);
  CHECK_THROWS_WITH_AS(optim::SGD({a}, optim::SGDOptions(0.1).nesterov(true)), doctest::Contains("Nesterov"),
                       ValueError);
  CHECK_THROWS_AS(optim::Adam({a}, optim::AdamOptions().beta1(1.0)), ValueError);
  CHECK_THROWS_AS(optim::SGD({}, optim::SGDOptions{}), ValueError);
  CHECK_THROWS_AS(optim::SGD({a, a}, optim::SGDOptions{}), ValueError);
  optim::SGD opt({a}, optim::SGDOptions{});
  CHECK_THROWS_WITH_AS(opt.add_param_group({ones({1}).requires_grad_()}, {{"betas", 0.5}}),
                       doctest::Contains("unknown option 'betas'"), ValueError);
  optim::Adam adam({ones({2}).requires_grad_()}, optim::AdamOptions{});
  adam.param_groups()[0].params[0].set_grad(ones({2}));
  adam.step();
  CHECK_THROWS_WITH_AS(opt.load_state_dict(adam.state_dict()), doctest::Contains("another optimizer type"),
                       ValueError);
}
