#include <doctest/doctest.h>

#include <cmath>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

TEST_CASE("gradients accumulate into leaves across backward calls") {
  Tensor w = tensor(std::vector<float>{1, 2, 3}, {3}).requires_grad_();
  sum(mul(w, w)).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{2, 4, 6});
  sum(mul(w, w)).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{4, 8, 12});
  w.set_grad(Tensor());
  sum(w).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{1, 1, 1});
}

TEST_CASE("a tensor used twice gets the sum of both paths") {
  Tensor x = tensor(std::vector<float>{1, -2}, {2}).requires_grad_();
  Tensor y = add(mul(x, 3.f), exp(x));  // dy/dx = 3 + e^x
  sum(y).backward();
  const auto g = x.grad().to_vector<float>();
  CHECK(g[0] == doctest::Approx(3 + std::exp(1.f)));
  CHECK(g[1] == doctest::Approx(3 + std::exp(-2.f)));
  // through a reshape view (shares storage with the gradient it came from)
  Tensor z = tensor(std::vector<float>{1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor s = add(reshape(z, {4}), reshape(z, {4}));
  sum(mul(s, s)).backward();
  CHECK(z.grad().to_vector<float>() == std::vector<float>{8, 16, 24, 32});
}

TEST_CASE("no_grad records nothing") {
  Tensor w = ones({2}).requires_grad_();
  {
    NoGradGuard g;
    Tensor y = mul(w, 2.f);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    CHECK_THROWS_AS(sum(y).backward(), AutogradError);
  }
  CHECK(grad_mode_enabled());
  CHECK(mul(w, 2.f).requires_grad());
}

TEST_CASE("a second backward through a freed graph is a clear error") {
  Tensor w = ones({2}).requires_grad_();
  Tensor loss = sum(exp(w));
  loss.backward();
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("second time"), AutogradError);
  Tensor loss2 = sum(exp(w));
  w.set_grad(Tensor());
  loss2.backward(Tensor(), /*retain_graph=*/true);
  loss2.backward();
  CHECK(w.grad().to_vector<float>()[0] == doctest::Approx(2 * std::exp(1.f)));
}

TEST_CASE("non-scalar backward needs a gradient of the output's shape") {
  Tensor w = ones({3}).requires_grad_();
  Tensor y = mul(w, 2.f);
  CHECK_THROWS_AS(y.backward(), AutogradError);
  CHECK_THROWS_AS(y.backward(ones({2})), ShapeError);
  y.backward(tensor(std::vector<float>{1, 2, 3}, {3}));
  CHECK(w.grad().to_vector<float>() == std::vector<float>{2, 4, 6});
  CHECK_THROWS_AS(mul(w, 2.f).requires_grad_(false), AutogradError);
  CHECK_THROWS_AS(arange(3, DType::Int64).requires_grad_(), TypeError);
}

TEST_CASE("hooks fire per leaf, last layer first; callbacks run once at the end") {
  auto model = nn::mlp({4, 8, 8, 3});
  std::vector<std::string> order;
  int callbacks = 0;
  for (auto& [name, p] : model->named_parameters()) {
    const std::string n = name;
    p.register_grad_accumulated_hook([&order, &callbacks, n](const Tensor& leaf) {
      CHECK(leaf.grad().defined());
      CHECK(in_backward());
      if (order.empty()) queue_backward_callback([&] { ++callbacks; });
      order.push_back(n);
    });
  }
  Tensor x = randn({5, 4});
  Tensor y = tensor(std::vector<std::int64_t>{0, 1, 2, 0, 1}, {5});
  cross_entropy(model->forward(x), y).backward();
  REQUIRE(order.size() == 6);
  CHECK(order.front().rfind("4.", 0) == 0);  // the last Linear's gradients are ready first
  CHECK(order.back().rfind("0.", 0) == 0);
  CHECK(callbacks == 1);
  CHECK_FALSE(in_backward());
  CHECK_THROWS_AS(queue_backward_callback([] {}), AutogradError);
}

TEST_CASE("inputs that do not require grad get none, and are not computed") {
  Tensor x = randn({3, 4});
  Tensor w = randn({2, 4}).requires_grad_();
  sum(linear(x, w, Tensor())).backward();
  CHECK_FALSE(x.grad().defined());
  CHECK(w.grad().defined());
}

TEST_CASE("a grad destination receives the gradient without a copy, unless two paths meet") {
  Tensor w = randn({4, 3}).requires_grad_();
  Tensor dest = zeros({4, 3});
  w.set_grad_destination(dest);
  Tensor x = randn({5, 3});
  sum(linear(x, w, Tensor())).backward();
  CHECK(w.grad().raw_data() == dest.raw_data());  // written in place by LinearBackward
  Tensor plain = randn({4, 3}).requires_grad_();
  plain.copy_(w);
  sum(linear(x, plain, Tensor())).backward();
  CHECK(w.grad().to_vector<float>() == plain.grad().to_vector<float>());
  // second pass with a defined grad: accumulates into it (still the destination)
  sum(linear(x, w, Tensor())).backward();
  CHECK(w.grad().raw_data() == dest.raw_data());
  // two paths into the same leaf: the destination is not written twice, the sum is right
  w.set_grad(Tensor());
  Tensor y = add(linear(x, w, Tensor()), linear(x, w, Tensor()));
  sum(y).backward();
  CHECK(w.grad().raw_data() != dest.raw_data());
  const auto two = w.grad().to_vector<float>(), one = plain.grad().to_vector<float>();
  for (std::size_t i = 0; i < two.size(); ++i) CHECK(two[i] == doctest::Approx(2 * one[i]));  // two paths, plain holds one
  CHECK_THROWS_AS(w.set_grad_destination(zeros({2})), ShapeError);
}
