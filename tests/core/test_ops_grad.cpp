// Every op's gradient against central finite differences, at several shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;
using phalanx::test::gradcheck;

namespace {
const std::vector<Shape> kShapes = {{1}, {5}, {3, 4}, {2, 3, 2}};
Tensor positive(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return rand(s, 0.5f, 2.f, &g);
}
}  // namespace

TEST_CASE("unary ops") {
  for (const auto& s : kShapes) {
    CAPTURE(shape_str(s));
    gradcheck([](auto& in) { return neg(in[0]); }, {away_from_zero(s, 1)});
    gradcheck([](auto& in) { return exp(in[0]); }, {away_from_zero(s, 2)});
    gradcheck([](auto& in) { return log(in[0]); }, {positive(s, 3)});
    gradcheck([](auto& in) { return relu(in[0]); }, {away_from_zero(s, 4)});
    gradcheck([](auto& in) { return tanh(in[0]); }, {away_from_zero(s, 5)});
    gradcheck([](auto& in) { return sigmoid(in[0]); }, {away_from_zero(s, 6)});
  }
}

TEST_CASE("relu keeps NaN (as PyTorch does) and passes its gradient on; zero and below give 0") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // 37 values: the vectorised body and its tail both see a NaN.
  std::vector<float> v(37, -1.f);
  v[3] = nan;
  v[5] = 2.f;
  v[6] = -0.f;
  v[35] = nan;
  v[36] = inf;
  Tensor x = tensor(v, {37}).requires_grad_(true);
  Tensor y = relu(x);
  const auto out = y.to_vector<float>();
  CHECK(std::isnan(out[3]));
  CHECK(std::isnan(out[35]));
  CHECK(out[5] == 2.f);
  CHECK(out[6] == 0.f);
  CHECK(out[0] == 0.f);
  CHECK(out[36] == inf);
  sum(y).backward();
  const auto g = x.grad().to_vector<float>();
  CHECK(g[3] == 1.f);  // PyTorch: threshold_backward passes the gradient where y is NaN
  CHECK(g[35] == 1.f);
  CHECK(g[5] == 1.f);
  CHECK(g[0] == 0.f);
  CHECK(g[6] == 0.f);
}

TEST_CASE("binary ops, same shape and broadcast rows and scalars") {
  for (const auto& s : kShapes) {
    CAPTURE(shape_str(s));
    const Shape row{s.back()};
    for (const Shape& sb : {s, row, Shape{}}) {
      CAPTURE(shape_str(sb));
      gradcheck([](auto& in) { return add(in[0], in[1]); }, {away_from_zero(s, 1), away_from_zero(sb, 2)});
      gradcheck([](auto& in) { return sub(in[0], in[1]); }, {away_from_zero(s, 3), away_from_zero(sb, 4)});
      gradcheck([](auto& in) { return mul(in[0], in[1]); }, {away_from_zero(s, 5), away_from_zero(sb, 6)});
      gradcheck([](auto& in) { return div(in[0], in[1]); }, {away_from_zero(s, 7), positive(sb, 8)});
      // the broadcast operand on the left
      gradcheck([](auto& in) { return sub(in[1], in[0]); }, {away_from_zero(s, 9), away_from_zero(sb, 10)});
      gradcheck([](auto& in) { return div(in[1], in[0]); }, {positive(s, 11), away_from_zero(sb, 12)});
    }
    gradcheck([](auto& in) { return add(in[0], 2.5f); }, {away_from_zero(s, 13)});
    gradcheck([](auto& in) { return mul(in[0], -1.5f); }, {away_from_zero(s, 14)});
  }
}

TEST_CASE("matmul and linear") {
  for (auto [m, k, n] : {std::tuple{1, 1, 1}, {3, 4, 5}, {7, 2, 3}}) {
    CAPTURE(m);
    CAPTURE(k);
    CAPTURE(n);
    gradcheck([](auto& in) { return matmul(in[0], in[1]); },
              {away_from_zero({m, k}, 1), away_from_zero({k, n}, 2)});
    gradcheck([](auto& in) { return linear(in[0], in[1], in[2]); },
              {away_from_zero({m, k}, 3), away_from_zero({n, k}, 4), away_from_zero({n}, 5)});
    gradcheck([](auto& in) { return linear(in[0], in[1], Tensor()); },
              {away_from_zero({m, k}, 6), away_from_zero({n, k}, 7)});
  }
  // leading dims are flattened: [2, 3, k] -> [2, 3, n]
  gradcheck([](auto& in) { return linear(in[0], in[1], in[2]); },
            {away_from_zero({2, 3, 4}, 8), away_from_zero({5, 4}, 9), away_from_zero({5}, 10)});
}

TEST_CASE("reductions") {
  for (const auto& s : kShapes) {
    CAPTURE(shape_str(s));
    gradcheck([](auto& in) { return sum(in[0]); }, {away_from_zero(s, 1)});
    gradcheck([](auto& in) { return mean(in[0]); }, {away_from_zero(s, 2)});
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(s.size()); ++d) {
      CAPTURE(d);
      gradcheck([d](auto& in) { return sum(in[0], d); }, {away_from_zero(s, 3)});
      gradcheck([d](auto& in) { return mean(in[0], d, true); }, {away_from_zero(s, 4)});
    }
  }
  CHECK(sum(arange(4)).item() == 6.f);
  CHECK(mean(arange(4)).item() == 1.5f);
  CHECK(sum(arange(6).reshape({2, 3}), 1).to_vector<float>() == std::vector<float>{3, 12});
  CHECK(mean(arange(6).reshape({2, 3}), 0, true).shape() == Shape{1, 3});
}

TEST_CASE("reshape and transpose") {
  gradcheck([](auto& in) { return mul(reshape(in[0], {4, 3}), in[1]); },
            {away_from_zero({3, 4}, 1), away_from_zero({4, 3}, 2)});
  gradcheck([](auto& in) { return transpose(in[0], 0, 1); }, {away_from_zero({3, 4}, 3)});
  gradcheck([](auto& in) { return transpose(in[0], 0, 2); }, {away_from_zero({2, 3, 4}, 4)});
}

TEST_CASE("narrow: values, views, gradients and range errors") {
  const Tensor x = arange(24).reshape({2, 3, 4});
  // x[:, 1:3, :] and x[..., 2:4] as PyTorch slices them
  CHECK(narrow(x, 1, 1, 2).to_vector<float>() ==
        std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23});
  CHECK(narrow(x, -1, 2, 2).to_vector<float>() == std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23});
  CHECK(narrow(x, 2, -1, 1).shape() == Shape{2, 3, 1});
  // one block of memory (dim 0): a view of the same storage
  const Tensor rows = narrow(x, 0, 1, 1);
  CHECK(rows.impl()->storage() == x.impl()->storage());
  CHECK(rows.to_vector<float>().front() == 12);
  CHECK(narrow(x, 1, 3, 0).numel() == 0);
  CHECK_THROWS_WITH_AS(narrow(x, 1, 2, 2), doctest::Contains("out of range"), ShapeError);
  CHECK_THROWS_AS(narrow(x, 3, 0, 1), std::exception);
  for (int dim = 0; dim < 3; ++dim) {
    CAPTURE(dim);
    gradcheck([dim](auto& in) { return mul(narrow(in[0], dim, 1, 1), narrow(in[0], dim, 0, 1)); },
              {away_from_zero({2, 3, 4}, 11 + dim)});
  }
  // two narrows of one input add their gradients
  gradcheck([](auto& in) { return add(narrow(in[0], 1, 0, 2), narrow(in[0], 1, 2, 2)); },
            {away_from_zero({3, 4}, 17)});
}

TEST_CASE("log_softmax over each dimension") {
  for (const auto& s : kShapes)
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(s.size()); ++d) {
      CAPTURE(shape_str(s));
      CAPTURE(d);
      gradcheck([d](auto& in) { return log_softmax(in[0], d); }, {away_from_zero(s, 5)});
    }
}

TEST_CASE("log_softmax and cross_entropy keep log(sum) at large magnitudes") {
  // Every value near -1e9 (a row masked with -1e9; floats there are 64 apart): the
  // log-probabilities of 8 equal values are -log 8, not the 0 that x - (max + log sum) gives.
  Tensor x = full({1, 8}, -1e9f);
  for (float v : log_softmax(x, 1).to_vector<float>()) CHECK(v == doctest::Approx(-std::log(8.f)));
  for (float v : softmax(x, 1).to_vector<float>()) CHECK(v == doctest::Approx(0.125f));
  Tensor big = full({1, 8}, 1e9f);
  CHECK(cross_entropy(big, zeros({1}, DType::Int64)).item() == doctest::Approx(std::log(8.f)));
}

TEST_CASE("losses") {
  for (std::int64_t n : {1, 4, 9}) {
    CAPTURE(n);
    Generator g(n);
    Tensor target = randint(5, {n}, &g);
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
      gradcheck([&](auto& in) { return cross_entropy(in[0], target, r); },
                {away_from_zero({n, 5}, 6)});
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
      gradcheck([&](auto& in) { return mse_loss(in[0], in[1], r); },
                {away_from_zero({n, 3}, 7), away_from_zero({n, 3}, 8)});
  }
}

TEST_CASE("dropout: gradient through the kept elements, identity in eval") {
  Generator g(3);
  Tensor x = away_from_zero({50}, 1).requires_grad_();
  Tensor y = dropout(x, 0.3f, true, &g);
  y.backward(ones({50}));
  const auto yv = y.to_vector<float>(), xv = x.to_vector<float>(), gv = x.grad().to_vector<float>();
  int dropped = 0;
  for (int i = 0; i < 50; ++i) {
    if (yv[i] == 0.f) {
      ++dropped;
      CHECK(gv[i] == 0.f);
    } else {
      CHECK(yv[i] == doctest::Approx(xv[i] / 0.7f));
      CHECK(gv[i] == doctest::Approx(1.f / 0.7f));
    }
  }
  CHECK(dropped > 5);
  CHECK(dropped < 30);
  CHECK(dropout(x, 0.3f, false).is_same(x));
  CHECK_THROWS_AS(dropout(x, 1.5f, true), ValueError);
}

TEST_CASE("shape errors name the op and both shapes") {
  CHECK_THROWS_WITH_AS(matmul(zeros({2, 3}), zeros({4, 5})),
                       doctest::Contains("matmul: expected [M, K] x [K, N], got [2, 3] x [4, 5]"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(add(zeros({2, 3}), zeros({2})), doctest::Contains("[2, 3] and [2]"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(linear(zeros({2, 3}), zeros({4, 5}), zeros({4})),
                       doctest::Contains("in_features = 5"), ShapeError);
  CHECK_THROWS_WITH_AS(cross_entropy(zeros({2, 3}), tensor(std::vector<std::int64_t>{0, 3}, {2})),
                       doctest::Contains("target[1] = 3 is not a class index in [0, 3)"), ValueError);
  CHECK_THROWS_AS(cross_entropy(zeros({2, 3}), zeros({2})), TypeError);
  CHECK_THROWS_AS(cross_entropy(zeros({2, 3}), tensor(std::vector<std::int64_t>{0}, {1})), ShapeError);
  CHECK_THROWS_AS(mse_loss(zeros({2, 3}), zeros({3, 2})), ShapeError);
  CHECK_THROWS_AS(exp(arange(3, DType::Int64)), TypeError);
  CHECK_THROWS_AS(sum(zeros({2, 3}), 2), ValueError);
}
