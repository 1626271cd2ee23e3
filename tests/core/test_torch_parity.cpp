// Parity with PyTorch 1.13 through fixtures made by scripts/make_fixtures.py.
#include <doctest/doctest.h>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::max_rel_err;

namespace {
TensorMap fixture(const std::string& name) {
  return load_npz(std::string(PHALANX_FIXTURES) + "/" + name);
}

void check_mlp(const std::string& file, const std::string& act) {
  TensorMap f = fixture(file);
  auto model = nn::mlp({64, 32, 10}, act);
  TensorMap init;
  for (const auto& [name, t] : f)
    if (name.rfind("init.", 0) == 0) init.set(name.substr(5), t);
  model->load_state_dict(init);
  const Tensor& x = f.at("x");
  const Tensor& y = f.at("y");
  CHECK(max_rel_err(model->forward(x), f.at("logits")) < 1e-5);
  for (const std::string red : {"mean", "sum"}) {
    CAPTURE(red);
    model->zero_grad();
    Tensor loss = cross_entropy(model->forward(x), y, red == "mean" ? Reduction::Mean : Reduction::Sum);
    CHECK(max_rel_err(loss, f.at("loss_" + red)) < 1e-5);
    loss.backward();
    for (auto& [name, p] : model->named_parameters()) {
      CAPTURE(name);
      CHECK(max_rel_err(p.grad(), f.at("grad_" + red + "." + name)) < 1e-5);
    }
  }
}
}  // namespace

TEST_CASE("MLP 64-32-10 (ReLU): logits, loss and gradients match PyTorch") {
  check_mlp("mlp_relu_parity.npz", "relu");
}

TEST_CASE("MLP 64-32-10 (Tanh): logits, loss and gradients match PyTorch") {
  check_mlp("mlp_tanh_parity.npz", "tanh");
}

TEST_CASE("cross_entropy (every reduction), log_softmax and mse_loss match PyTorch") {
  TensorMap f = fixture("cross_entropy_parity.npz");
  const Tensor& target = f.at("target");
  for (auto [red, r] : {std::pair{"mean", Reduction::Mean}, {"sum", Reduction::Sum},
                        {"none", Reduction::None}}) {
    CAPTURE(red);
    Tensor l = f.at("logits").clone().requires_grad_();
    Tensor loss = cross_entropy(l, target, r);
    CHECK(max_rel_err(loss, f.at(std::string("loss_") + red)) < 1e-5);
    loss.backward(r == Reduction::None ? f.at("upstream_none") : Tensor());
    CHECK(max_rel_err(l.grad(), f.at(std::string("grad_") + red)) < 1e-5);
  }
  Tensor l = f.at("logits").clone().requires_grad_();
  Tensor ls = log_softmax(l, 1);
  CHECK(max_rel_err(ls, f.at("log_softmax")) < 1e-5);
  std::vector<float> upstream(40);  // torch.linspace(-1, 1, 40)
  for (int i = 0; i < 40; ++i) upstream[i] = -1.f + static_cast<float>(i) * (2.f / 39.f);
  ls.backward(tensor(upstream, {8, 5}));
  CHECK(max_rel_err(l.grad(), f.at("log_softmax_grad")) < 1e-4);
  Tensor a = f.at("mse_a").clone().requires_grad_();
  Tensor m = mse_loss(a, f.at("mse_b"));
  CHECK(max_rel_err(m, f.at("mse_loss")) < 1e-5);
  m.backward();
  CHECK(max_rel_err(a.grad(), f.at("mse_grad")) < 1e-5);
}
