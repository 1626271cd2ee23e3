// The transformer's building blocks (docs/transformer_ops.md): torch.matmul's batched and
// broadcast forms, permute, cat/stack/split/chunk, masked_fill and tril/triu, with Bool masks.
// Values against closed forms and naive loops, gradients against finite differences, the sim
// device against the CPU bit for bit, bad input, and PyTorch 1.13's values (fixture).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>

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
  // Views are compared by their values.
  const Tensor x = a.contiguous().to(Device::cpu()), y = b.contiguous().to(Device::cpu());
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
  // full transposes (the tiled path, partial tiles at the edges) against loops; transpose()
  // runs on the same kernel
  Tensor big = away_from_zero({37, 53}, 10);
  const auto bv = big.to_vector<float>(), tv = permute(big, {1, 0}).to_vector<float>();
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 53; ++j) REQUIRE(tv[j * 37 + i] == bv[i * 53 + j]);
  CHECK(same_bits(permute(big, {1, 0}), transpose(big, 0, 1)));
  Tensor big3 = away_from_zero({3, 19, 41}, 11);
  const auto b3 = big3.to_vector<float>(), t3 = permute(big3, {0, 2, 1}).to_vector<float>(),
             r3 = permute(big3, {2, 1, 0}).to_vector<float>();
  for (int a = 0; a < 3; ++a)
    for (int i = 0; i < 19; ++i)
      for (int j = 0; j < 41; ++j) {
        REQUIRE(t3[(a * 41 + j) * 19 + i] == b3[(a * 19 + i) * 41 + j]);
        REQUIRE(r3[(j * 19 + i) * 3 + a] == b3[(a * 19 + i) * 41 + j]);
      }
  CHECK(same_bits(permute(big3, {0, 2, 1}), transpose(big3, 1, 2)));
  CHECK(same_bits(permute(big3, {2, 1, 0}), transpose(big3, 0, 2)));
  // 1-, 2- and 8-byte elements through the tiled path
  Tensor h = to_dtype(big, DType::Float16);
  CHECK(same_bits(to_dtype(permute(h, {1, 0}), DType::Float32), to_dtype(to_dtype(permute(big, {1, 0}), DType::Float16), DType::Float32)));
  Tensor i64 = arange(37 * 53, DType::Int64).reshape({37, 53});
  const auto iv = permute(i64, {1, 0}).to_vector<std::int64_t>();
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 53; ++j) REQUIRE(iv[j * 37 + i] == i * 53 + j);
  Tensor m = triu(ones({37, 53}, DType::Bool));
  const auto mv = permute(m, {1, 0}).to_vector<bool>();
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 53; ++j) REQUIRE(mv[j * 37 + i] == (j >= i));
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

TEST_CASE("split's backward: unused pieces, a second pass, the input used elsewhere too") {
  // only the middle piece used: the other slots of the gradient are zero
  Tensor x = away_from_zero({2, 6}, 25).requires_grad_();
  auto p = split(x, 2, 1);
  sum(mul(p[1], 3.f)).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 0, 3, 3, 0, 0, 0, 0, 3, 3, 0, 0});
  // retain_graph: a second pass assembles the gradient again (and accumulates into .grad)
  Tensor y = away_from_zero({4, 3}, 26).requires_grad_();
  auto q = split(y, 3, 0);  // pieces of 3 and 1 rows: views
  Tensor loss = add(sum(q[0]), mul(sum(q[1]), 2.f));
  loss.backward(Tensor(), true);
  const std::vector<float> once{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2};
  CHECK(y.grad().to_vector<float>() == once);
  loss.backward();
  std::vector<float> twice = once;
  for (float& v : twice) v *= 2;
  CHECK(y.grad().to_vector<float>() == twice);
  CHECK_THROWS_AS(loss.backward(), AutogradError);
  // x used by two splits and directly: the gradients add up
  gradcheck([](auto& in) {
    auto a = split(in[0], 1, 1);
    auto b = chunk(in[0], 2, 0);
    return add(mul(in[0], 0.5f), add(b[1].reshape({3}), sum(mul(a[0], a[2]))));
  }, {away_from_zero({2, 3}, 27)});
  // a piece whose path multiplies its gradient by zero
  Tensor z = away_from_zero({2, 4}, 28).requires_grad_();
  auto r = split(z, 2, 1);
  Tensor unused_path = mul(r[0], 0.f);
  sum(add(r[1], mul(sum(unused_path), 0.f))).backward();
  CHECK(z.grad().to_vector<float>() == std::vector<float>{0, 0, 1, 1, 0, 0, 1, 1});
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

// ---------------------------------------------------------------- Bool, masks, triangles

TEST_CASE("Bool: one byte per element, created, printed, saved and read back as numpy's bool") {
  CHECK(element_size(DType::Bool) == 1);
  CHECK(std::string(dtype_name(DType::Bool)) == "bool");
  Tensor t = ones({2, 3}, DType::Bool);
  CHECK(t.nbytes() == 6);
  CHECK(t.to_vector<bool>() == std::vector<bool>(6, true));
  CHECK(zeros({3}, DType::Bool).to_vector<bool>() == std::vector<bool>(3, false));
  CHECK(full({2}, 0.5, DType::Bool).to_vector<bool>() == std::vector<bool>{true, true});
  CHECK(full({1}, 0.0, DType::Bool).item_int() == 0);
  CHECK(ones({1}, DType::Bool).item() == 1.f);
  CHECK_THROWS_AS(t.to_vector<float>(), TypeError);
  CHECK_THROWS_AS(zeros({2}).to_vector<bool>(), TypeError);
  std::ostringstream os;
  os << tril(ones({2, 3}, DType::Bool));
  CHECK(os.str() == "tensor([[ True, False, False],\n        [ True,  True, False]])");
  std::ostringstream os2;
  os2 << ones({3}, DType::Bool) << " " << zeros({0}, DType::Bool) << " " << zeros({2, 0}, DType::Bool);
  CHECK(os2.str() == "tensor([True, True, True]) tensor([], dtype=torch.bool) tensor([], size=(2, 0), dtype=torch.bool)");
  // npy: '|b1' both ways, any non-zero byte reads as true
  Tensor m = tril(ones({3, 3}, DType::Bool));
  const std::string bytes = serialize_npy(m);
  CHECK(bytes.find("'descr': '|b1'") != std::string::npos);
  Tensor back = parse_npy(bytes.data(), bytes.size(), "m");
  CHECK(back.dtype() == DType::Bool);
  CHECK(back.shape() == Shape{3, 3});
  CHECK(same_bits(back, m));
  std::string odd = bytes;
  odd[odd.size() - 1] = 7;  // the last element (true) stored as 7
  CHECK(static_cast<const std::uint8_t*>(parse_npy(odd.data(), odd.size(), "odd").raw_data())[8] == 1);
  // layout ops carry bools
  CHECK(permute(m, {1, 0}).to_vector<bool>() == triu(ones({3, 3}, DType::Bool)).to_vector<bool>());
  CHECK(cat({m, m}, 0).shape() == Shape{6, 3});
  CHECK(transpose(m, 0, 1).to_vector<bool>() == triu(ones({3, 3}, DType::Bool)).to_vector<bool>());
  // on the sim device
  CHECK(same_bits(tril(ones({3, 3}, DType::Bool, kSim)), m));
  CHECK(ones({2}, DType::Bool, kSim).to_vector<bool>() == std::vector<bool>{true, true});
}

TEST_CASE("tril and triu: PyTorch's diagonals, batches, dtypes, gradients") {
  Tensor x = arange(12).reshape({3, 4});
  CHECK(tril(x).to_vector<float>() == std::vector<float>{0, 0, 0, 0, 4, 5, 0, 0, 8, 9, 10, 0});
  CHECK(tril(x, 1).to_vector<float>() == std::vector<float>{0, 1, 0, 0, 4, 5, 6, 0, 8, 9, 10, 11});
  CHECK(tril(x, -1).to_vector<float>() == std::vector<float>{0, 0, 0, 0, 4, 0, 0, 0, 8, 9, 0, 0});
  CHECK(triu(x).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 0, 5, 6, 7, 0, 0, 10, 11});
  CHECK(triu(x, 2).to_vector<float>() == std::vector<float>{0, 0, 2, 3, 0, 0, 0, 7, 0, 0, 0, 0});
  CHECK(triu(x, -1).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11});
  CHECK(tril(x, 10).to_vector<float>() == x.to_vector<float>());
  CHECK(triu(x, -10).to_vector<float>() == x.to_vector<float>());
  CHECK(tril(x, -10).to_vector<float>() == std::vector<float>(12, 0.f));
  // a batch: every matrix the same triangle
  Tensor b = tril(ones({2, 2, 3, 3}));
  const auto bv = b.to_vector<float>();
  for (int m = 0; m < 4; ++m)
    CHECK(std::vector<float>(bv.begin() + m * 9, bv.begin() + m * 9 + 9) ==
          std::vector<float>{1, 0, 0, 1, 1, 0, 1, 1, 1});
  Tensor i = tensor(std::vector<std::int64_t>{1, 2, 3, 4}, {2, 2});
  CHECK(triu(i).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, 0, 4});
  // NaN outside the triangle becomes 0, as in PyTorch
  Tensor n = full({2, 2}, std::nan(""));
  CHECK(tril(n).to_vector<float>()[1] == 0.f);
  for (std::int64_t d : {-1, 0, 2}) {
    gradcheck([d](auto& in) { return tril(in[0], d); }, {away_from_zero({2, 3, 4}, 50)});
    gradcheck([d](auto& in) { return triu(in[0], d); }, {away_from_zero({3, 4}, 51)});
  }
  CHECK_THROWS_WITH_AS(tril(zeros({3})), "tril: the input [3] has fewer than 2 dims; it works on the last two (matrices)",
                       ShapeError);
  CHECK_THROWS_AS(triu(Tensor()), ValueError);
}

TEST_CASE("masked_fill: values, broadcast masks, gradients zero where masked") {
  Tensor x = arange(6).reshape({2, 3});
  Tensor m = triu(ones({2, 3}, DType::Bool), 1);  // [[F, T, T], [F, F, T]]
  CHECK(masked_fill(x, m, -1.f).to_vector<float>() == std::vector<float>{0, -1, -1, 3, 4, -1});
  // a row mask (suffix broadcast) and a column mask (expanded)
  Tensor row = permute(triu(ones({3, 1}, DType::Bool), 0), {1, 0});  // [[T, F, F]]
  CHECK(masked_fill(x, row, 9.f).to_vector<float>() == std::vector<float>{9, 1, 2, 9, 4, 5});
  Tensor col = narrow(tril(ones({2, 2}, DType::Bool)), 1, 1, 1);  // [[F], [T]]
  CHECK(col.shape() == Shape{2, 1});
  CHECK(masked_fill(x, col, 7.f).to_vector<float>() == std::vector<float>{0, 1, 2, 7, 7, 7});
  CHECK(masked_fill(x, ones({}, DType::Bool), 2.f).to_vector<float>() == std::vector<float>(6, 2.f));
  // the attention pattern: a causal [T, T] mask over [B, H, T, T] scores, filled with -inf
  const std::int64_t T = 5;
  Tensor scores = away_from_zero({2, 3, T, T}, 52);
  Tensor causal = triu(ones({T, T}, DType::Bool), 1);
  const auto f = masked_fill(scores, causal, -INFINITY).to_vector<float>(), s = scores.to_vector<float>();
  for (std::int64_t k = 0; k < 6 * T * T; ++k) {
    const std::int64_t i = (k / T) % T, j = k % T;
    if (j > i)
      CHECK(std::isinf(f[k]));
    else
      CHECK(f[k] == s[k]);
  }
  // the mask broadcast over a middle dim: [B, 1, 1, T] (padding) over [B, H, T, T]
  Tensor pad = cat({zeros({2, 1, 1, 3}, DType::Bool), ones({2, 1, 1, 2}, DType::Bool)}, 3);
  const auto pf = masked_fill(scores, pad, 0.f).to_vector<float>();
  for (std::int64_t k = 0; k < 6 * T * T; ++k) CHECK(pf[k] == (k % T >= 3 ? 0.f : s[k]));
  gradcheck([m](auto& in) { return masked_fill(in[0], m, 3.f); }, {away_from_zero({2, 3}, 53)});
  gradcheck([col](auto& in) { return masked_fill(in[0], col, 3.f); }, {away_from_zero({2, 3}, 54)});
  gradcheck([pad](auto& in) { return masked_fill(in[0], pad, 0.f); }, {away_from_zero({2, 2, 3, 5}, 55)});
  Tensor g = away_from_zero({2, 3}, 56).requires_grad_();
  sum(masked_fill(g, m, 5.f)).backward();
  CHECK(g.grad().to_vector<float>() == std::vector<float>{1, 0, 0, 1, 1, 0});
}

TEST_CASE("masked_fill: bad masks") {
  CHECK_THROWS_WITH_AS(masked_fill(zeros({2, 3}), ones({3, 3}, DType::Bool), 0.f),
                       "masked_fill: the mask [3, 3] does not broadcast to the input [2, 3]", ShapeError);
  CHECK_THROWS_WITH_AS(masked_fill(zeros({3}), ones({2, 3}, DType::Bool), 0.f),
                       "masked_fill: the mask [2, 3] does not broadcast to the input [3]", ShapeError);
  CHECK_THROWS_WITH_AS(masked_fill(zeros({2, 3}), ones({2, 3}), 0.f),
                       doctest::Contains("masked_fill: the mask must be bool, got float32 [2, 3]"), TypeError);
  CHECK_THROWS_AS(masked_fill(zeros({2}, DType::Int64), ones({2}, DType::Bool), 0.f), TypeError);
  CHECK_THROWS_AS(masked_fill(zeros({2}), ones({2}, DType::Bool, kSim), 0.f), TypeError);
}

TEST_CASE("masks on the sim device equal the CPU bit for bit") {
  Tensor causal = triu(ones({4, 4}, DType::Bool), 1);
  same_on_sim([](auto& in) { return masked_fill(in[0], in[1], -INFINITY); }, {away_from_zero({2, 4, 4}, 60), causal});
  Tensor col = narrow(tril(ones({2, 2}, DType::Bool)), 1, 1, 1);
  same_on_sim([](auto& in) { return masked_fill(in[0], in[1], 1.f); }, {away_from_zero({2, 3}, 61), col});
  same_on_sim([](auto& in) { return tril(in[0], -1); }, {away_from_zero({2, 3, 4}, 62)});
  same_on_sim([](auto& in) { return triu(in[0], 1); }, {away_from_zero({4, 3}, 63)});
}

TEST_CASE("the kernel boundary refuses layouts that leave their tensors") {
  DeviceKernels& k = kernels_for(Device::cpu());
  Tensor src = zeros({6}), dst = zeros({6});
  StridedLayout l;
  l.ndim = 2;
  l.sizes[0] = 2;
  l.sizes[1] = 3;
  l.src_strides[0] = 3;
  l.src_strides[1] = 1;
  l.dst_strides[0] = 4;  // reaches element 4 + 2 = 6 of a 6-element dst
  l.dst_strides[1] = 1;
  CHECK_THROWS_WITH_AS(k.strided_copy(src, l, dst), doctest::Contains("reaches past the end of dst"), InternalError);
  l.dst_strides[0] = 3;
  k.strided_copy(src, l, dst);  // fits
  Tensor bad_dtype = zeros({6}, DType::Int64);
  CHECK_THROWS_AS(k.strided_copy(src, l, bad_dtype), InternalError);
  Tensor x = zeros({6});
  CHECK_THROWS_AS(k.masked_fill(x, ones({4}, DType::Bool), 0.f, x), InternalError);
  CHECK_THROWS_AS(k.masked_fill(x, ones({3}), 0.f, x), InternalError);
  CHECK_THROWS_AS(k.triangle(x, 4, 4, 0, false, x), InternalError);
}

// ---------------------------------------------------------------- PyTorch 1.13 parity

TEST_CASE("PyTorch 1.13 parity: matmul, permute, cat, split, masked_fill, tril/triu (within 1e-5)") {
  // made by scripts/fixtures/transformer_ops.py
  const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/transformer_ops_parity.npz");
  for (int i = 0; f.contains("mm" + std::to_string(i) + ".a"); ++i) {
    const std::string p = "mm" + std::to_string(i) + ".";
    CAPTURE(p);
    Tensor a = f.at(p + "a").clone().requires_grad_(), b = f.at(p + "b").clone().requires_grad_();
    Tensor y = matmul(a, b);
    check_close(y, f.at(p + "out"));
    y.backward(f.at(p + "gy"));
    check_close(a.grad(), f.at(p + "ga"));
    check_close(b.grad(), f.at(p + "gb"));
  }
  for (int i = 0; f.contains("perm" + std::to_string(i) + ".x"); ++i) {
    const std::string p = "perm" + std::to_string(i) + ".";
    CAPTURE(p);
    Tensor x = f.at(p + "x").clone().requires_grad_();
    Tensor y = permute(x, f.at(p + "dims").to_vector<std::int64_t>());
    CHECK(same_bits(y, f.at(p + "out")));
    y.backward(f.at(p + "gy"));
    CHECK(same_bits(x.grad(), f.at(p + "gx")));
  }
  {
    std::vector<Tensor> xs;
    for (int j = 0; j < 3; ++j) xs.push_back(f.at("cat.x" + std::to_string(j)).clone().requires_grad_());
    Tensor y = cat(xs, f.at("cat.dim").item_int());
    CHECK(same_bits(y, f.at("cat.out")));
    y.backward(f.at("cat.gy"));
    for (int j = 0; j < 3; ++j) CHECK(same_bits(xs[j].grad(), f.at("cat.gx" + std::to_string(j))));
  }
  {
    Tensor x = f.at("split.x").clone().requires_grad_();
    auto parts = split(x, f.at("split.sizes").to_vector<std::int64_t>(), f.at("split.dim").item_int());
    REQUIRE(parts.size() == 3);
    Tensor loss;
    for (int j = 0; j < 3; ++j) {
      CHECK(same_bits(parts[j], f.at("split.out" + std::to_string(j))));
      Tensor term = sum(mul(parts[j], f.at("split.gy" + std::to_string(j))));
      loss = j ? add(loss, term) : term;
    }
    loss.backward();
    check_close(x.grad(), f.at("split.gx"));
  }
  {
    Tensor x = f.at("mf.x").clone().requires_grad_();
    const Tensor& mask = f.at("mf.mask");
    CHECK(mask.dtype() == DType::Bool);
    Tensor y = masked_fill(x, mask, -1e9f);
    CHECK(same_bits(y, f.at("mf.out")));
    y.backward(f.at("mf.gy"));
    CHECK(same_bits(x.grad(), f.at("mf.gx")));
  }
  {
    Tensor x = f.at("tri.x").clone().requires_grad_();
    for (int d : {-1, 0, 1}) {
      CAPTURE(d);
      CHECK(same_bits(tril(x, d), f.at("tril" + std::to_string(d))));
      CHECK(same_bits(triu(x, d), f.at("triu" + std::to_string(d))));
    }
    tril(x, 1).backward(f.at("tri.gy"));
    CHECK(same_bits(x.grad(), f.at("trilgx1")));
  }
}
