// Views of non-contiguous tensors (docs/transformer_ops.md, "Views"): strides equal to PyTorch 1.13's for
// every view op (values printed by torch 1.13 on this machine), aliasing both ways, views of
// views, gradients through chains of views against finite differences, writes through
// transposed and narrowed views, and the refusals (data<T>() of a view, view() that needs a
// copy, a collective on a view).
#include <doctest/doctest.h>

#include <cstdio>
#include <vector>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/backends/world_of_one.hpp"
#include "phalanx/core/ops.hpp"
#include "phalanx/data/dataset.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::gradcheck;

namespace {

using St = std::vector<std::int64_t>;

Tensor ar(const Shape& s) { return arange(numel_of(s)).reshape(s); }

std::vector<float> vals(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

TEST_CASE("view ops: strides and offsets equal PyTorch 1.13's") {
  const Tensor x = ar({2, 3, 4});
  CHECK(x.strides() == St{12, 4, 1});
  CHECK(x.is_contiguous());

  const Tensor p = permute(x, {2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == St{1, 12, 4});
  CHECK_FALSE(p.is_contiguous());

  CHECK(transpose(x, 0, 2).strides() == St{1, 4, 12});
  CHECK(x.transpose(0, 2).stride(-1) == 12);

  const Tensor n1 = narrow(x, 1, 1, 2), n2 = narrow(x, 2, 1, 2);
  CHECK(n1.strides() == St{12, 4, 1});
  CHECK(n1.storage_offset() == 4);
  CHECK(n2.strides() == St{12, 4, 1});
  CHECK(n2.storage_offset() == 1);
  CHECK_FALSE(n2.is_contiguous());

  const auto pieces = split(x, 2, 2);
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[1].shape() == Shape{2, 3, 2});
  CHECK(pieces[1].strides() == St{12, 4, 1});
  CHECK(pieces[1].storage_offset() == 2);
  const auto ch = chunk(x, 3, 1);
  REQUIRE(ch.size() == 3);
  CHECK(ch[2].storage_offset() == 8);
  CHECK(ch[2].strides() == St{12, 4, 1});

  CHECK(unsqueeze(x, 1).strides() == St{12, 12, 4, 1});
  CHECK(unsqueeze(x, 3).strides() == St{12, 4, 1, 1});
  CHECK(unsqueeze(transpose(x, 1, 2), 0).strides() == St{24, 12, 1, 4});
  CHECK(squeeze(zeros({2, 1, 3}), 1).strides() == St{3, 1});
  CHECK(squeeze(zeros({2, 1, 3})).strides() == St{3, 1});

  // reshape: a view when the strides allow it, else a copy; view refuses the copy.
  CHECK(permute(x, {0, 2, 1}).reshape({2, 4, 3}).strides() == St{12, 1, 4});
  const Tensor t = transpose(x, 1, 2);
  const Tensor r = t.reshape({2, 12});
  CHECK(r.strides() == St{12, 1});
  CHECK(r.is_contiguous());
  CHECK_THROWS_WITH_AS(t.view({2, 12}), doctest::Contains("is not compatible with the input's size"), ShapeError);
  CHECK_THROWS_WITH_AS(t.view({2, 12}), doctest::Contains("use .reshape(...) instead"), ShapeError);
  CHECK(n2.view({2, 3, 2, 1}).strides() == St{12, 4, 1, 1});
  CHECK(n2.view({6, 2}).strides() == St{4, 1});

  // nanoGPT's q: c_attn(x).split(C, 2)[1].view(B, T, H, E).transpose(1, 2)
  const std::int64_t B = 2, T = 3, C = 8, H = 2;
  const Tensor q = split(ar({B, T, 3 * C}), C, 2)[1].view({B, T, H, C / H}).transpose(1, 2);
  CHECK(q.shape() == Shape{2, 2, 3, 4});
  CHECK(q.strides() == St{72, 4, 24, 1});
  CHECK(q.storage_offset() == 8);
}

TEST_CASE("is_contiguous: size-1 dims' strides do not matter, empty tensors are contiguous") {
  CHECK(unsqueeze(transpose(ar({3, 1}), 0, 1), 0).is_contiguous());  // [1, 1, 3]
  CHECK(transpose(zeros({0, 3}), 0, 1).is_contiguous());
  CHECK(transpose(ar({1, 4}), 0, 1).is_contiguous());
  CHECK_FALSE(transpose(ar({2, 4}), 0, 1).is_contiguous());
}

TEST_CASE("contiguous(): the values PyTorch gives; itself when already contiguous") {
  const Tensor x = ar({2, 3, 4});
  CHECK(contiguous(x).is_same(x));
  const Tensor c = transpose(x, 0, 2).contiguous();
  CHECK(c.is_contiguous());
  const auto v = vals(c);
  CHECK(std::vector<float>(v.begin(), v.begin() + 8) == std::vector<float>{0, 12, 4, 16, 8, 20, 1, 13});
  // to_vector, clone, printing and to() read a view as its values.
  CHECK(vals(transpose(x, 0, 2)) == v);
  CHECK(transpose(x, 0, 2).clone().is_contiguous());
  CHECK(vals(transpose(x, 0, 2).clone()) == v);
}

TEST_CASE("views alias their base both ways") {
  Tensor x = zeros({3, 4});
  Tensor t = x.t();
  Tensor n = narrow(x, 1, 1, 2);
  x.fill_(2.0);
  CHECK(vals(t)[0] == 2.0f);
  CHECK(vals(n) == std::vector<float>(6, 2.0f));
  // Through the transposed view into the base.
  t.copy_(ar({4, 3}));
  // x = arange(12).view(4, 3).t()
  CHECK(vals(x) == std::vector<float>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11});
  // Through a narrowed view (a column block) into the base.
  n.fill_(-1.0);
  CHECK(vals(x) == std::vector<float>{0, -1, -1, 9, 1, -1, -1, 10, 2, -1, -1, 11});
  n.zero_();
  CHECK(vals(x) == std::vector<float>{0, 0, 0, 9, 1, 0, 0, 10, 2, 0, 0, 11});
  // Views of views: a narrow of a transpose writes into the base.
  narrow(x.t(), 0, 3, 1).fill_(7.0);  // x[:, 3] = 7
  CHECK(vals(x) == std::vector<float>{0, 0, 0, 7, 1, 0, 0, 7, 2, 0, 0, 7});
  // detach() keeps the view's strides and storage.
  CHECK(t.detach().strides() == t.strides());
  // A source that shares the destination's storage: x.t() <- x (square), values as PyTorch's clone.
  Tensor sq = ar({2, 2});
  sq.t().copy_(sq);
  CHECK(vals(sq) == std::vector<float>{0, 2, 1, 3});
}

TEST_CASE("add_ and mul_ on a non-contiguous view refuse in one line") {
  Tensor x = zeros({3, 4});
  Tensor t = x.t();
  CHECK_THROWS_WITH_AS(t.mul_(2.f), doctest::Contains("add_ and mul_ need a contiguous tensor"), TypeError);
  CHECK_THROWS_AS(t.add_(ones({4, 3})), TypeError);
  // A contiguous destination may take a view as its source.
  Tensor y = zeros({4, 3});
  y.add_(ar({3, 4}).t());
  CHECK(vals(y) == vals(ar({3, 4}).t().contiguous()));
}

TEST_CASE("data<T>() and raw_data() of a view throw, naming .contiguous()") {
  const Tensor t = ar({2, 3}).t();
  CHECK_THROWS_WITH_AS(t.data<float>(), doctest::Contains(".contiguous()"), TypeError);
  CHECK_THROWS_WITH_AS(t.raw_data(), doctest::Contains("non-contiguous view"), TypeError);
  CHECK_NOTHROW(t.contiguous().data<float>());
}

TEST_CASE("ops take views: the values of the materialised input") {
  const Tensor a = ar({3, 4}), b = ar({4, 3});
  CHECK(vals(add(a.t(), b)) == vals(add(a.t().contiguous(), b)));
  CHECK(vals(matmul(a.t(), a)) == vals(matmul(a.t().contiguous(), a)));
  CHECK(vals(relu(narrow(a, 1, 1, 2))) == vals(narrow(a, 1, 1, 2).contiguous()));
  CHECK(vals(sum(narrow(a, 1, 1, 2))) == std::vector<float>{1 + 2 + 5 + 6 + 9 + 10});
  CHECK(vals(cat({a.t(), b}, 0)) == vals(cat({a.t().contiguous(), b}, 0)));
}

TEST_CASE("gradients through chains of views match finite differences") {
  Generator g(7);
  gradcheck([](const std::vector<Tensor>& in) { return mul(transpose(in[0], 0, 1), in[1]); },
            {randn({3, 4}, &g), randn({4, 3}, &g)});
  gradcheck([](const std::vector<Tensor>& in) {
              // split along the last dim, view, transpose, matmul, transpose back, contiguous, view
              const auto p = split(in[0], 4, 2);  // [2, 3, 4] x 3
              const Tensor q = p[0].view({2, 3, 2, 2}).transpose(1, 2);
              const Tensor k = p[1].view({2, 3, 2, 2}).transpose(1, 2);
              const Tensor y = matmul(q, k.transpose(-2, -1));  // [2, 2, 3, 3]
              return mul(y.transpose(1, 2).contiguous().view({2, 3, 6}), 0.5f);
            },
            {randn({2, 3, 12}, &g)});
  gradcheck([](const std::vector<Tensor>& in) {
              return tanh(squeeze(unsqueeze(narrow(permute(in[0], {2, 0, 1}), 0, 1, 2), 1), 1));
            },
            {randn({2, 3, 4}, &g)});
  gradcheck([](const std::vector<Tensor>& in) { return in[0].t().reshape({12}); }, {randn({3, 4}, &g)});
}

TEST_CASE("a collective on a view is refused, as c10d does") {
  auto pg = make_world_of_one();
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH_AS(pg->allreduce(x.t()), doctest::Contains("tensors must be contiguous"), ValueError);
  CHECK_NOTHROW(pg->allreduce(x)->wait());
}

TEST_CASE("npy saves a view as its values") {
  const Tensor t = ar({2, 3}).t();
  const std::string path = "test_views_view.npy";
  save_npy(path, t);
  const Tensor back = load_npy(path);
  CHECK(back.shape() == Shape{3, 2});
  CHECK(vals(back) == vals(t.contiguous()));
  std::remove(path.c_str());
}

TEST_CASE("attention reads nanoGPT's q/k/v views in place: the contiguous path's values and gradients") {
  const std::int64_t B = 2, T = 5, C = 8, H = 2, E = C / H;
  Generator g(11);
  const Tensor base = randn({B, T, 3 * C}, &g);
  const Tensor w = randn({B, H, T, E}, &g);
  auto run = [&](bool materialise, Tensor& grad) {
    Tensor x = base.clone().requires_grad_(true);
    const auto p = split(x, C, 2);
    auto head = [&](int i) {
      Tensor t = p[i].view({B, T, H, E}).transpose(1, 2);
      return materialise ? t.contiguous() : t;
    };
    const Tensor q = head(0), k = head(1), v = head(2);
    std::string st;
    for (auto v : q.strides()) st += std::to_string(v) + " ";
    INFO("q strides " << st);
    if (!materialise) CHECK(q.strides() == St{3 * T * C, E, 3 * C, 1});
    const Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), 0.f, true);
    sum(mul(y, w)).backward();
    grad = x.grad();
    return vals(y);
  };
  Tensor g_view, g_copy;
  const auto y_view = run(false, g_view);
  const auto y_copy = run(true, g_copy);
  CHECK(y_view == y_copy);
  CHECK(vals(g_view) == vals(g_copy));
}

TEST_CASE("split of a permuted tensor: the gradient comes back through permute's view") {
  Generator g(5);
  // nn::GPT's form: [B, T, 3, H, E] -> [3, B, H, T, E], pieces along dim 0.
  gradcheck([](const std::vector<Tensor>& in) {
              const Tensor qkv = permute(in[0].reshape({2, 3, 3, 2, 2}), {2, 0, 3, 1, 4});
              const auto parts = split(qkv, 1, 0);
              return add(mul(parts[0].reshape({2, 2, 3, 2}), parts[2].reshape({2, 2, 3, 2})),
                         parts[1].reshape({2, 2, 3, 2}));
            },
            {randn({2, 3, 12}, &g)});
  // A piece no gradient reaches gets zeros in the permuted buffer.
  Tensor x = randn({2, 3, 12}, &g).requires_grad_(true);
  const auto parts = split(permute(x.reshape({2, 3, 3, 4}), {2, 0, 1, 3}), 1, 0);
  sum(parts[1]).backward();
  const auto gx = vals(x.grad());
  for (std::size_t i = 0; i < gx.size(); ++i) CHECK(gx[i] == ((i % 12) / 4 == 1 ? 1.f : 0.f));
}

TEST_CASE("views: an empty view is contiguous, whatever its strides") {
  const Tensor e = narrow(transpose(ar({2, 3}), 0, 1), 0, 0, 0);  // shape [0, 2], strides (1, 3)
  CHECK(e.numel() == 0);
  CHECK(e.is_contiguous());
}

TEST_CASE("views: storage moved under a view (Module::to's way) leaves it contiguous over the new bytes") {
  Tensor v = transpose(ar({2, 3}), 0, 1);  // [[0, 3], [1, 4], [2, 5]]
  REQUIRE_FALSE(v.is_contiguous());
  const Tensor moved = v.contiguous();  // what Tensor::to writes on another device: the values row-major
  v.impl()->set_storage(moved.impl()->storage(), moved.impl()->byte_offset());
  CHECK(v.is_contiguous());
  CHECK(vals(v) == std::vector<float>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("views: batch_norm refuses running statistics that are views (they are updated in place)") {
  Tensor st = zeros({4, 2});
  Tensor rm = squeeze(narrow(st, 1, 0, 1), 1), rv = squeeze(narrow(st, 1, 1, 1), 1);  // stride 2
  rv.fill_(1);
  Generator g(3);
  CHECK_THROWS_AS(batch_norm(randn({8, 4}, &g), rm, rv, Tensor(), Tensor(), true, 0.1, 1e-5), ValueError);
  // contiguous running statistics are updated in place, as before
  Tensor rm2 = zeros({4}), rv2 = ones({4});
  batch_norm(randn({8, 4}, &g), rm2, rv2, Tensor(), Tensor(), true, 0.1, 1e-5);
  CHECK(vals(rm2) != std::vector<float>(4, 0.f));
}

TEST_CASE("views: a TensorDataset made of a table's columns reads them by their values") {
  const Tensor table = ar({5, 3});  // rows: [3r, 3r + 1, 3r + 2]
  samplers::TensorDataset ds(narrow(table, 1, 0, 2), squeeze(narrow(table, 1, 2, 1), 1));
  Tensor x = Tensor::empty({2, 2}), y = Tensor::empty({2});
  const std::int64_t idx[] = {4, 1};
  ds.gather(idx, 2, x, y);
  CHECK(vals(x) == std::vector<float>{12, 13, 3, 4});
  CHECK(vals(y) == std::vector<float>{14, 5});
}
