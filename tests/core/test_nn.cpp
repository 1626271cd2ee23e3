#include <doctest/doctest.h>

#include <cmath>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

TEST_CASE("Sequential names parameters like PyTorch") {
  auto model = nn::mlp({64, 32, 10});
  std::vector<std::string> names;
  for (auto& [n, p] : model->named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(model->parameters()[0].shape() == Shape{32, 64});
  CHECK(model->parameters()[3].shape() == Shape{10});
  for (auto& p : model->parameters()) CHECK(p.requires_grad());
  CHECK(model->str().find("(2): Linear(in_features=32, out_features=10") != std::string::npos);
}

TEST_CASE("Linear initialisation: uniform in +-1/sqrt(in), reproducible from a generator") {
  Generator g1(11), g2(11);
  nn::Linear a(100, 50, true, &g1), b(100, 50, true, &g2);
  CHECK(a.weight.to_vector<float>() == b.weight.to_vector<float>());
  const float bound = 1.f / std::sqrt(100.f);
  float lo = 1, hi = -1;
  for (float v : a.weight.to_vector<float>()) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo >= -bound);
  CHECK(hi < bound);
  CHECK(lo < -0.9f * bound);  // fills the range
  CHECK(hi > 0.9f * bound);
  for (float v : a.bias.to_vector<float>()) CHECK(std::abs(v) <= bound);
  CHECK_THROWS_AS(nn::Linear(0, 3), ValueError);
}

TEST_CASE("state_dict round trip and strict loading") {
  Generator g(1), h(2);
  auto a = nn::mlp({4, 3, 2}, "tanh", &g);
  auto b = nn::mlp({4, 3, 2}, "tanh", &h);
  CHECK(a->parameters()[0].to_vector<float>() != b->parameters()[0].to_vector<float>());
  b->load_state_dict(a->state_dict());
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(a->parameters()[i].to_vector<float>() == b->parameters()[i].to_vector<float>());
  // loading copies values: parameters keep their identity
  Tensor w = b->parameters()[0];
  b->load_state_dict(a->state_dict());
  CHECK(w.is_same(b->parameters()[0]));

  TensorMap partial;
  partial.set("0.weight", a->state_dict().at("0.weight"));
  CHECK_THROWS_WITH_AS(b->load_state_dict(partial), doctest::Contains("missing: 0.bias"), ValueError);
  b->load_state_dict(partial, /*strict=*/false);
  TensorMap wrong = a->state_dict();
  wrong.set("0.weight", zeros({2, 2}));
  CHECK_THROWS_WITH_AS(b->load_state_dict(wrong), doctest::Contains("'0.weight' has shape [2, 2]"),
                       ShapeError);
  TensorMap extra = a->state_dict();
  extra.set("9.weight", zeros({1}));
  CHECK_THROWS_WITH_AS(b->load_state_dict(extra), doctest::Contains("unexpected: 9.weight"), ValueError);
  // a state dict saved from a model wrapped in PyTorch's DDP: "module." before every key
  TensorMap from_torch_ddp;
  for (const auto& [name, t] : a->state_dict()) from_torch_ddp.set("module." + name, t);
  CHECK_THROWS_WITH_AS(b->load_state_dict(from_torch_ddp),
                       doctest::Contains("every key starts with 'module.' (saved from a model wrapped in PyTorch's "
                                         "DDP): load nn::strip_prefix(state, \"module.\") instead"),
                       ValueError);
  b->load_state_dict(nn::strip_prefix(from_torch_ddp, "module."));
  CHECK(nn::strip_prefix(from_torch_ddp, "module.").size() == 4);
}

TEST_CASE("train/eval reaches children; zero_grad clears or zeroes") {
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(3, 3), std::make_shared<nn::Dropout>(0.5f)});
  Tensor x = ones({2, 3});
  model->eval();
  CHECK_FALSE((*model)[1]->is_training());
  Tensor y1 = model->forward(x), y2 = model->forward(x);
  CHECK(y1.to_vector<float>() == y2.to_vector<float>());
  model->train();
  CHECK((*model)[1]->is_training());
  sum(model->forward(x)).backward();
  model->zero_grad(/*set_to_none=*/false);
  for (float v : model->parameters()[0].grad().to_vector<float>()) CHECK(v == 0.f);
  model->zero_grad();
  CHECK_FALSE(model->parameters()[0].grad().defined());
  CHECK_THROWS_AS(nn::mlp({3}), ValueError);
  CHECK_THROWS_AS(nn::mlp({3, 2}, "gelu"), ValueError);
}
