// The transformer's building blocks (docs/transformer_ops.md): torch.matmul's batched and
// broadcast forms, permute, cat/stack/split/chunk, masked_fill and tril/triu, with Bool masks.
// Values against closed forms and naive loops, gradients against finite differences, the sim
// device against the CPU bit for bit, bad input, and PyTorch 1.13's values (fixture).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "phalanx/core/kernels.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;
using phalanx::test::gradcheck;

namespace {

const Device kSim = Device::sim(0);

Tensor floats(std::vector<float> v, const Shape& s) { return tensor(v, s); }

/// Row-major strides of `s`.
std::vector<std::int64_t> strides(const Shape& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

/// torch.matmul by loops (double accumulation): the reference for the batched forms.
Tensor naive_matmul(const Tensor& a, const Tensor& b) {
  Shape as = a.shape(), bs = b.shape();
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const std::int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const std::size_t nb = std::max(as.size(), bs.size()) - 2;
  Shape batch(nb, 1);
  Shape ab(nb, 1), bb(nb, 1);
  for (std::size_t i = 0; i < nb; ++i) {
    ab[i] = i + as.size() - 2 >= nb ? as[i + as.size() - 2 - nb] : 1;
    bb[i] = i + bs.size() - 2 >= nb ? bs[i + bs.size() - 2 - nb] : 1;
    batch[i] = std::max(ab[i], bb[i]);
  }
  const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  Shape full = batch;
  full.push_back(m);
  full.push_back(n);
  std::vector<float> out(static_cast<std::size_t>(numel_of(full)));
  const auto sab = strides(ab), sbb = strides(bb);
  std::int64_t count = numel_of(batch);
  for (std::int64_t bi = 0; bi < count; ++bi) {
    std::int64_t r = bi, ao = 0, bo = 0;
    for (std::size_t d = nb; d-- > 0;) {
      const std::int64_t idx = r % batch[d];
      r /= batch[d];
      if (ab[d] != 1) ao += idx * sab[d];
      if (bb[d] != 1) bo += idx * sbb[d];
    }
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t q = 0; q < k; ++q)
          s += static_cast<double>(av[ao * m * k + i * k + q]) * bv[bo * k * n + q * n + j];
        out[bi * m * n + i * n + j] = static_cast<float>(s);
      }
  }
  Shape os = batch;
  if (!a1) os.push_back(m);
  if (!b1) os.push_back(n);
  return tensor(out, os);
}

void check_close(const Tensor& got, const Tensor& want, double tol = 1e-5) {
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector<float>(), w = want.to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])));
  }
}

/// Same bytes (NaN payloads and signed zeros included).
bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  if (x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

/// f on CPU inputs and on their sim copies: equal outputs and input gradients, bit for bit.
void same_on_sim(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> cpu) {
  std::vector<Tensor> sim;
  for (auto& t : cpu) {
    sim.push_back(t.to(kSim));
    if (t.dtype() == DType::Float32) {
      t.requires_grad_();
      sim.back().requires_grad_();
    }
  }
  Tensor yc = f(cpu), ys = f(sim);
  CHECK(ys.device() == kSim);
  CHECK(same_bits(ys, yc));
  if (!yc.requires_grad()) return;
  Generator g(1);
  Tensor r = randn(yc.shape(), &g);
  yc.backward(r);
  ys.backward(r.to(kSim));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i].dtype() == DType::Float32) {
      REQUIRE(sim[i].grad().defined());
      CHECK(same_bits(sim[i].grad(), cpu[i].grad()));
    }
}

}  // namespace

// ---------------------------------------------------------------- matmul

TEST_CASE("matmul: 1-D, 2-D, batched and broadcast forms equal torch.matmul's definition") {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4}, {4}},                    // dot product -> []
      {{4}, {4, 3}},                 // row vector -> [3]
      {{3, 4}, {4}},                 // column vector -> [3]
      {{2, 3, 4}, {4, 5}},           // batch folded into rows
      {{2, 3, 4}, {4}},              // batched matrix-vector
      {{4}, {2, 4, 5}},              // vector-batched matrix
      {{3, 4}, {2, 4, 5}},           // 2-D left operand broadcast over b's batch
      {{2, 3, 4}, {2, 4, 5}},        // same batch
      {{2, 1, 3, 4}, {1, 3, 4, 2}},  // both broadcast
      {{1, 3, 4}, {2, 4, 5}},        // size-1 batch dim broadcast
      {{2, 2, 3, 4}, {4, 5}},        // 4-D folded
      {{5, 1, 3, 4}, {2, 4, 6}},     // batch dims of different lengths
  };
  for (const auto& [sa, sb] : cases) {
    CAPTURE(shape_str(sa));
    CAPTURE(shape_str(sb));
    Tensor a = away_from_zero(sa, 1), b = away_from_zero(sb, 2);
    Tensor want = naive_matmul(a, b);
    check_close(matmul(a, b), want);
  }
  // closed form: [1, 2] . [3, 4] = 11; [[1, 2], [3, 4]] [1, 1] = [3, 7]
  const Tensor dot = matmul(floats({1, 2}, {2}), floats({3, 4}, {2}));
  CHECK(dot.item() == 11.f);
  CHECK(dot.dim() == 0);
  CHECK(matmul(floats({1, 2, 3, 4}, {2, 2}), floats({1, 1}, {2})).to_vector<float>() == std::vector<float>{3.f, 7.f});
  CHECK(matmul(zeros({7, 1, 3, 4}), zeros({2, 4, 5})).shape() == Shape{7, 2, 3, 5});
}

TEST_CASE("matmul: gradients of every form, broadcast operands summed over their batches") {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4}, {4}},       {{4}, {4, 3}},      {{3, 4}, {4}},          {{2, 3, 4}, {4, 2}},
      {{2, 3, 4}, {4}}, {{4}, {2, 4, 2}},   {{3, 4}, {2, 4, 2}},    {{2, 3, 4}, {2, 4, 2}},
      {{2, 1, 3, 2}, {1, 3, 2, 2}},         {{1, 3, 2}, {2, 2, 3}}, {{2, 2, 2, 3}, {3, 2}},
  };
  for (const auto& [sa, sb] : cases) {
    CAPTURE(shape_str(sa));
    CAPTURE(shape_str(sb));
    gradcheck([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero(sa, 3), away_from_zero(sb, 4)});
  }
}

TEST_CASE("matmul: only the wanted gradient is computed; empty products give zero gradients") {
  Tensor a = away_from_zero({2, 3, 4}, 5).requires_grad_(), b = away_from_zero({2, 4, 5}, 6);
  sum(matmul(a, b)).backward();
  CHECK(a.grad().shape() == Shape{2, 3, 4});
  CHECK_FALSE(b.grad().defined());
  Tensor e = zeros({2, 3, 0}).requires_grad_(), f = zeros({2, 0, 5}).requires_grad_();
  Tensor y = matmul(e, f);
  CHECK(y.shape() == Shape{2, 3, 5});
  CHECK(y.to_vector<float>() == std::vector<float>(30, 0.f));
  sum(y).backward();
  CHECK(e.grad().numel() == 0);
  Tensor g = away_from_zero({0, 3, 4}, 7).requires_grad_(), h = away_from_zero({4, 2}, 8).requires_grad_();
  Tensor z = matmul(g, h);
  CHECK(z.shape() == Shape{0, 3, 2});
  sum(z).backward();
  CHECK(h.grad().to_vector<float>() == std::vector<float>(8, 0.f));
}

TEST_CASE("matmul: bad shapes get one line naming both shapes") {
  CHECK_THROWS_WITH_AS(matmul(zeros({2, 3, 4}), zeros({2, 5, 6})),
                       "matmul: [2, 3, 4] x [2, 5, 6]: a's last dim (4) must equal b's second-to-last dim (5)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(matmul(zeros({3}), zeros({4})),
                       "matmul: [3] x [4]: a's last dim (3) must equal b's only dim (4)", ShapeError);
  CHECK_THROWS_WITH_AS(matmul(zeros({2, 3, 4}), zeros({3, 4, 5})),
                       "matmul: the batch dims of [2, 3, 4] and [3, 4, 5] ([2] and [3]) do not broadcast",
                       ShapeError);
  CHECK_THROWS_WITH_AS(matmul(zeros({}), zeros({3})), "matmul: both operands need at least one dim, got [] x [3]",
                       ShapeError);
  CHECK_THROWS_WITH_AS(matmul(zeros({2, 3}), zeros({4, 5})),
                       doctest::Contains("matmul: expected [M, K] x [K, N], got [2, 3] x [4, 5]"), ShapeError);
  CHECK_THROWS_AS(matmul(zeros({2, 3, 4}), zeros({4}, DType::Int64)), TypeError);
}

// ---------------------------------------------------------------- permute, cat, split

TEST_CASE("permute: values, gradients, the attention layout and the identity") {
  Tensor x = arange(24).reshape({2, 3, 4});
  Tensor y = permute(x, {2, 0, 1});
  CHECK(y.shape() == Shape{4, 2, 3});
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(yv[(k * 2 + i) * 3 + j] == xv[(i * 3 + j) * 4 + k]);
  CHECK(permute(x, {-1, -3, -2}).to_vector<float>() == yv);
  CHECK(permute(x, {0, 1, 2}).to_vector<float>() == xv);
  CHECK(contiguous(x).is_same(x));
  // [B, T, H, D] -> [B, H, T, D] and back: the round trip is exact
  Tensor a = away_from_zero({2, 5, 3, 4}, 9);
  Tensor b = permute(a, {0, 2, 1, 3});
  CHECK(b.shape() == Shape{2, 3, 5, 4});
  CHECK(same_bits(permute(b, {0, 2, 1, 3}), a));
  CHECK(same_bits(b, transpose(a, 1, 2)));
  // a full transpose (the tiled path) against transpose()
  Tensor big = away_from_zero({37, 53}, 10);
  CHECK(same_bits(permute(big, {1, 0}), transpose(big, 0, 1)));
  Tensor big3 = away_from_zero({3, 19, 41}, 11);
  CHECK(same_bits(permute(big3, {0, 2, 1}), transpose(big3, 1, 2)));
  CHECK(same_bits(permute(big3, {2, 1, 0}), transpose(big3, 0, 2)));
  // int64 and scalars
  Tensor i = tensor(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(permute(i, {1, 0}).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 4, 2, 5, 3, 6});
  CHECK(permute(scalar_tensor(3.f), {}).item() == 3.f);
  for (const auto& dims : std::vector<std::vector<std::int64_t>>{{0, 2, 1, 3}, {3, 1, 0, 2}, {1, 0, 3, 2}})
    gradcheck([dims](auto& in) { return permute(in[0], dims); }, {away_from_zero({2, 3, 2, 3}, 12)});
}

TEST_CASE("permute: bad dims are named") {
  CHECK_THROWS_WITH_AS(permute(zeros({2, 3}), {0}), "permute: dims (0,) name 1 dims but the input [2, 3] has 2",
                       ShapeError);
  CHECK_THROWS_WITH_AS(permute(zeros({2, 3}), {0, 0}),
                       "permute: dims (0, 0) repeat dim 0; give each dim of [2, 3] once", ShapeError);
  CHECK_THROWS_WITH_AS(permute(zeros({2, 3}), {0, 2}), "permute: dim 2 in (0, 2) is out of range for [2, 3]",
                       ShapeError);
}

TEST_CASE("cat and stack: values along every dim, gradients, mixed sizes") {
  Tensor a = arange(6).reshape({2, 3}), b = add(arange(4).reshape({2, 2}), 10.f);
  CHECK(cat({a, b}, 1).to_vector<float>() == std::vector<float>{0, 1, 2, 10, 11, 3, 4, 5, 12, 13});
  CHECK(cat({a, b}, -1).shape() == Shape{2, 5});
  Tensor c = add(arange(3).reshape({1, 3}), 20.f);
  CHECK(cat({a, c}, 0).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 20, 21, 22});
  CHECK(cat({a}, 0).to_vector<float>() == a.to_vector<float>());
  CHECK(cat({a, zeros({2, 0})}, 1).to_vector<float>() == a.to_vector<float>());
  CHECK(stack({a, a}, 0).shape() == Shape{2, 2, 3});
  CHECK(stack({a, add(a, 6.f)}, 1).to_vector<float>() ==
        std::vector<float>{0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11});
  CHECK(stack({a, a}, 2).shape() == Shape{2, 3, 2});
  CHECK(stack({a, a}, -1).shape() == Shape{2, 3, 2});
  Tensor i = tensor(std::vector<std::int64_t>{1, 2}, {2});
  CHECK(cat({i, i}, 0).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, 1, 2});
  for (int d = 0; d < 3; ++d) {
    CAPTURE(d);
    Shape s1{2, 3, 2}, s2{2, 3, 2};
    s2[d] = 1;
    gradcheck([d](auto& in) { return cat({in[0], in[1], in[2]}, d); },
              {away_from_zero(s1, 13), away_from_zero(s2, 14), away_from_zero(s1, 15)});
    gradcheck([d](auto& in) { return stack({in[0], in[1]}, d); }, {away_from_zero(s1, 16), away_from_zero(s1, 17)});
  }
  // the same tensor twice: its gradient is the sum of both slices
  Tensor x = away_from_zero({2, 2}, 18).requires_grad_();
  sum(cat({x, x}, 0)).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>(4, 2.f));
  // only some inputs require grad
  Tensor p = away_from_zero({2, 2}, 19).requires_grad_(), q = away_from_zero({2, 2}, 20);
  sum(cat({q, p}, 1)).backward();
  CHECK(p.grad().to_vector<float>() == std::vector<float>(4, 1.f));
  CHECK_FALSE(q.grad().defined());
}

TEST_CASE("cat and stack: bad input") {
  CHECK_THROWS_WITH_AS(cat({zeros({2, 3}), zeros({3, 3})}, 1),
                       "cat: tensor 1 is [3, 3] but tensor 0 is [2, 3]; they must match in every dim but dim 1",
                       ShapeError);
  CHECK_THROWS_WITH_AS(cat({zeros({2, 3}), zeros({2, 3, 1})}, 0),
                       "cat: tensor 1 is [2, 3, 1] but tensor 0 is [2, 3]; they must match in every dim but dim 0",
                       ShapeError);
  CHECK_THROWS_AS(cat({}, 0), ValueError);
  CHECK_THROWS_AS(cat({zeros({2}), zeros({2}, DType::Int64)}, 0), TypeError);
  CHECK_THROWS_WITH_AS(cat({zeros({2})}, 1), "cat: dimension 1 is out of range for a tensor with 1 dimension(s)", ValueError);
  CHECK_THROWS_AS(cat({scalar_tensor(1.f)}, 0), ShapeError);
  CHECK_THROWS_WITH_AS(stack({zeros({2, 3}), zeros({3, 2})}, 0),
                       "stack: tensor 1 is [3, 2] but tensor 0 is [2, 3]; stack needs equal shapes", ShapeError);
  CHECK_THROWS_AS(stack({zeros({2, 3})}, 3), ValueError);
}

TEST_CASE("split and chunk: both forms, views along dim 0, copies elsewhere, gradients") {
  Tensor x = arange(10).reshape({5, 2});
  auto parts = split(x, 2, 0);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].to_vector<float>() == std::vector<float>{0, 1, 2, 3});
  CHECK(parts[2].shape() == Shape{1, 2});
  CHECK(parts[2].to_vector<float>() == std::vector<float>{8, 9});
  CHECK(parts[1].raw_data() == static_cast<char*>(x.raw_data()) + 4 * sizeof(float));  // a view
  auto cols = split(x, 1, 1);
  REQUIRE(cols.size() == 2);
  CHECK(cols[1].to_vector<float>() == std::vector<float>{1, 3, 5, 7, 9});
  auto sized = split(x, std::vector<std::int64_t>{1, 0, 4}, 0);
  REQUIRE(sized.size() == 3);
  CHECK(sized[1].shape() == Shape{0, 2});
  CHECK(sized[2].shape() == Shape{4, 2});
  // chunk: ceil(n / chunks) per piece, so fewer pieces can come back (as torch.chunk)
  CHECK(chunk(arange(6), 4, 0).size() == 3);
  CHECK(chunk(arange(5), 2, 0)[1].to_vector<float>() == std::vector<float>{3, 4});
  CHECK(chunk(zeros({2, 9}), 3, -1)[2].shape() == Shape{2, 3});
  // the qkv split of attention: [B, T, 3C] into three [B, T, C]
  Tensor qkv = away_from_zero({2, 3, 12}, 21);
  auto q = split(qkv, 4, 2);
  REQUIRE(q.size() == 3);
  CHECK(same_bits(cat(q, 2), qkv));
  CHECK(same_bits(q[1], narrow(qkv, 2, 4, 4)));
  for (int d = 0; d < 3; ++d) {
    CAPTURE(d);
    gradcheck([d](auto& in) {
      auto p = split(in[0], 1, d);
      return add(mul(p[0], 2.f), p.back());
    }, {away_from_zero({2, 3, 2}, 22)});
    gradcheck([d](auto& in) { return chunk(in[0], 2, d)[0]; }, {away_from_zero({2, 3, 2}, 23)});
  }
  gradcheck([](auto& in) {
    auto p = split(in[0], std::vector<std::int64_t>{1, 3}, 1);
    return mul(sum(p[0]), p[1]);
  }, {away_from_zero({2, 4, 3}, 24)});
}

TEST_CASE("split and chunk: bad input") {
  CHECK_THROWS_WITH_AS(split(zeros({5, 2}), std::vector<std::int64_t>{2, 2}, 0),
                       "split: sizes (2, 2) sum to 4 but dim 0 of [5, 2] is 5", ShapeError);
  CHECK_THROWS_AS(split(zeros({5, 2}), 0, 0), ValueError);
  CHECK_THROWS_AS(split(zeros({5, 2}), 1, 2), ValueError);
  CHECK_THROWS_AS(split(scalar_tensor(1.f), 1, 0), ShapeError);
  CHECK_THROWS_AS(chunk(zeros({5, 2}), 0, 0), ValueError);
}

TEST_CASE("layout ops on the sim device equal the CPU bit for bit") {
  same_on_sim([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({2, 3, 4}, 30), away_from_zero({4, 5}, 31)});
  same_on_sim([](auto& in) { return matmul(in[0], in[1]); },
              {away_from_zero({3, 4}, 32), away_from_zero({2, 2, 4, 5}, 33)});
  same_on_sim([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({4}, 34), away_from_zero({4}, 35)});
  same_on_sim([](auto& in) { return permute(in[0], {0, 2, 1, 3}); }, {away_from_zero({2, 5, 3, 4}, 36)});
  same_on_sim([](auto& in) { return permute(in[0], {1, 0}); }, {away_from_zero({33, 17}, 37)});
  same_on_sim([](auto& in) { return cat({in[0], in[1]}, 1); }, {away_from_zero({2, 3}, 38), away_from_zero({2, 2}, 39)});
  same_on_sim([](auto& in) { return stack({in[0], in[1]}, 1); }, {away_from_zero({2, 3}, 40), away_from_zero({2, 3}, 41)});
  same_on_sim([](auto& in) {
    auto p = split(in[0], 2, 1);
    return add(p[0], mul(p[1], 3.f));
  }, {away_from_zero({3, 4}, 42)});
  same_on_sim([](auto& in) { return chunk(in[0], 3, 0)[1]; }, {away_from_zero({6, 2}, 43)});
}
