#include <doctest/doctest.h>

#include <phalanx/core/finite.hpp>
#include <phalanx/phalanx.hpp>

#include <algorithm>
#include <limits>
#include <vector>

using namespace phalanx;

TEST_CASE("creation fills and reports shape, dtype, device") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.numel() == 6);
  CHECK(z.dtype() == DType::Float32);
  CHECK(z.device() == Device::cpu());
  for (float v : z.to_vector<float>()) CHECK(v == 0.f);
  for (float v : ones({4}).to_vector<float>()) CHECK(v == 1.f);
  for (float v : full({2, 2}, 2.5).to_vector<float>()) CHECK(v == 2.5f);
  CHECK(arange(4).to_vector<float>() == std::vector<float>{0, 1, 2, 3});
  CHECK(arange(3, DType::Int64).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2});
  CHECK(scalar_tensor(3.f).item() == 3.f);
  CHECK(scalar_tensor(3.f).dim() == 0);
}

TEST_CASE("tensors alias on copy and views share storage") {
  Tensor a = arange(6).reshape({2, 3});
  Tensor b = a;
  b.data<float>()[0] = 42.f;
  CHECK(a.data<float>()[0] == 42.f);
  Tensor v = a.reshape({3, 2});
  v.data<float>()[5] = -1.f;
  CHECK(a.data<float>()[5] == -1.f);
  Tensor c = a.clone();
  c.data<float>()[1] = 7.f;
  CHECK(a.data<float>()[1] == 1.f);
  Tensor rows = arange(10).reshape({5, 2}).narrow_rows(1, 3);
  CHECK(rows.shape() == Shape{2, 2});
  CHECK(rows.to_vector<float>() == std::vector<float>{2, 3, 4, 5});
  CHECK(a.reshape({-1}).shape() == Shape{6});
  CHECK(arange(12).reshape({2, -1, 3}).shape() == Shape{2, 2, 3});
}

TEST_CASE("wrong dtype, shape and sizes are clear errors") {
  Tensor f = zeros({2});
  CHECK_THROWS_AS(f.data<std::int64_t>(), TypeError);
  CHECK_THROWS_WITH_AS(arange(6).reshape({4, 2}), doctest::Contains("[6]"), ShapeError);
  CHECK_THROWS_AS(arange(6).reshape({-1, -1}), ValueError);
  CHECK_THROWS_AS(zeros({2, 2}).item(), ShapeError);
  CHECK_THROWS_AS(tensor(std::vector<float>{1, 2, 3}, {2, 2}), ShapeError);
  CHECK_THROWS_AS(Tensor().shape(), ValueError);
  CHECK_THROWS_AS(Tensor::empty({-1}), ValueError);
  CHECK_THROWS_AS(arange(3).narrow_rows(2, 5), ValueError);
  // CUDA: a TypeError naming the device where there is none (or no plugin); a zeroed CUDA
  // tensor on a GPU machine. Any other outcome fails.
  try {
    const Tensor g = zeros({2}, DType::Float32, Device::cuda(0));
    CHECK(g.device() == Device::cuda(0));
    CHECK(g.to(Device::cpu()).to_vector<float>() == std::vector<float>{0, 0});
  } catch (const TypeError& e) {
    CHECK(std::string(e.what()).find("cuda:0") != std::string::npos);
  }
  CHECK_THROWS_AS(Device::parse("tpu"), ValueError);
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
}

TEST_CASE("in-place updates") {
  Tensor a = ones({4});
  a.add_(arange(4), 2.f);
  CHECK(a.to_vector<float>() == std::vector<float>{1, 3, 5, 7});
  a.mul_(0.5f);
  CHECK(a.to_vector<float>() == std::vector<float>{0.5, 1.5, 2.5, 3.5});
  a.zero_();
  CHECK(a.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  a.copy_(arange(4));
  CHECK(a.to_vector<float>() == std::vector<float>{0, 1, 2, 3});
  CHECK_THROWS_AS(a.copy_(arange(3)), ShapeError);
}

TEST_CASE("transpose materialises a permuted copy") {
  Tensor a = arange(6).reshape({2, 3});
  Tensor t = a.t();
  CHECK(t.shape() == Shape{3, 2});
  CHECK(t.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor b = arange(24).reshape({2, 3, 4});
  Tensor bt = b.transpose(0, 2);
  CHECK(bt.shape() == Shape{4, 3, 2});
  const auto v = bt.to_vector<float>();
  // bt[k][j][i] == b[i][j][k] == i*12 + j*4 + k
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) CHECK(v[(k * 3 + j) * 2 + i] == i * 12 + j * 4 + k);
}

TEST_CASE("all_finite: an infinity or a NaN anywhere (vector body or tail) is found; -0, subnormals, the largest float pass") {
  for (const std::int64_t n : {0, 1, 3, 8, 15, 16, 17, 33, 64, 100, 1031}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[i] = (i % 3 == 0 ? -1.f : 1.f) * static_cast<float>(i) * 0.37f;
    if (n > 2) {
      v[1] = -0.f;
      v[2] = std::numeric_limits<float>::denorm_min();
      v[0] = -std::numeric_limits<float>::max();
    }
    CAPTURE(n);
    CHECK(all_finite(v.data(), n));
    for (std::int64_t at = 0; at < n; at += std::max<std::int64_t>(1, n / 7)) {
      for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
        auto w = v;
        w[static_cast<std::size_t>(at)] = bad;
        CAPTURE(at);
        CHECK_FALSE(all_finite(w.data(), n));
      }
    }
    if (n > 0) {  // the last element: the tail
      auto w = v;
      w.back() = std::numeric_limits<float>::infinity();
      CHECK_FALSE(all_finite(w.data(), n));
    }
  }
}
