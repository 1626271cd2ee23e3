// conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d and their modules:
// finite differences, parity with PyTorch 1.13 (tests/fixtures/conv_parity.npz, made by
// scripts/fixtures/conv.py), the sim device equal to the CPU bit for bit, errors, modules.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::gradcheck;
using phalanx::test::max_rel_err;

namespace {

Tensor rnd(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, &g);
}

/// Random order, but every two values at least 0.05 apart: max pooling's finite differences
/// never swap a window's maximum.
Tensor distinct(const Shape& s, std::uint64_t seed) {
  const auto v = rnd(s, seed).to_vector<float>();
  std::vector<std::size_t> order(v.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<float> out(v.size());
  for (std::size_t r = 0; r < order.size(); ++r) out[order[r]] = 0.05f * static_cast<float>(r) - 1.f;
  return tensor(out, s);
}

struct ConvCase {
  Shape x, w;
  Size2 stride, padding, dilation;
  std::int64_t groups;
  bool bias;
};

const ConvCase kConvCases[] = {
    {{2, 3, 5, 4}, {4, 3, 3, 3}, 1, 1, 1, 1, true},               // padding, odd sizes
    {{2, 4, 7, 6}, {6, 2, 3, 2}, 2, {1, 0}, 1, 2, true},          // stride 2, groups 2, 3x2 kernel
    {{1, 2, 8, 9}, {3, 2, 3, 3}, {1, 2}, 2, 2, 1, false},         // dilation 2, no bias
    {{3, 6, 3, 3}, {6, 2, 1, 1}, 1, 0, 1, 3, true},               // 1x1: the direct path
    {{2, 4, 5, 5}, {4, 1, 3, 3}, 2, 1, 1, 4, true},               // depthwise, stride 2
    {{1, 3, 5, 6}, {2, 3, 1, 1}, {2, 1}, 0, 1, 1, true},          // 1x1 with stride: im2col
};

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  if (x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

TensorMap fixture() { return load_npz(std::string(PHALANX_FIXTURES) + "/conv_parity.npz"); }

std::vector<std::int64_t> params(const TensorMap& f, const std::string& key) {
  return f.at(key + "params").to_vector<std::int64_t>();
}

/// Runs `op` on a leaf copy of f[key + "x"] (and `extra` leaves), backpropagates f[key + "gy"],
/// and compares out and gx (and the named extra gradients) with PyTorch's.
void check_parity(const TensorMap& f, const std::string& key, std::vector<std::string> leaves,
                  const std::function<Tensor(const std::vector<Tensor>&)>& op) {
  CAPTURE(key);
  std::vector<Tensor> in;
  for (const auto& name : leaves) in.push_back(f.at(key + name).clone().requires_grad_(true));
  Tensor y = op(in);
  CHECK(max_rel_err(y, f.at(key + "out")) < 1e-5);
  y.backward(f.at(key + "gy"));
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    CAPTURE(leaves[i]);
    CHECK(max_rel_err(in[i].grad(), f.at(key + "g" + leaves[i])) < 1e-5);
  }
}

}  // namespace

TEST_CASE("conv2d: finite differences (padding, stride, groups, dilation, 1x1, odd sizes)") {
  int seed = 1;
  for (const ConvCase& c : kConvCases) {
    CAPTURE(shape_str(c.x));
    CAPTURE(shape_str(c.w));
    std::vector<Tensor> in{rnd(c.x, seed), rnd(c.w, seed + 1)};
    if (c.bias) in.push_back(rnd({c.w[0]}, seed + 2));
    seed += 3;
    gradcheck(
        [&](const std::vector<Tensor>& t) {
          return conv2d(t[0], t[1], c.bias ? t[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
        },
        in);
  }
}

TEST_CASE("pooling: finite differences") {
  SUBCASE("max_pool2d, padding, stride, dilation, rectangular windows") {
    gradcheck([](const std::vector<Tensor>& t) { return max_pool2d(t[0], 3, 2, 1); }, {distinct({2, 2, 7, 5}, 11)});
    gradcheck([](const std::vector<Tensor>& t) { return max_pool2d(t[0], 2); }, {distinct({1, 3, 6, 6}, 12)});
    gradcheck([](const std::vector<Tensor>& t) { return max_pool2d(t[0], 3, 1, 1, 2); }, {distinct({1, 2, 7, 8}, 13)});
    gradcheck([](const std::vector<Tensor>& t) { return max_pool2d(t[0], {2, 3}, {2, 1}, {1, 1}); },
              {distinct({2, 1, 5, 6}, 14)});
  }
  SUBCASE("avg_pool2d, with and without counting the padding") {
    for (bool inc : {true, false}) {
      gradcheck([&](const std::vector<Tensor>& t) { return avg_pool2d(t[0], 3, 2, 1, inc); },
                {rnd({2, 2, 7, 5}, 15)});
      gradcheck([&](const std::vector<Tensor>& t) { return avg_pool2d(t[0], {3, 2}, {1, 2}, {1, 0}, inc); },
                {rnd({1, 2, 5, 6}, 16)});
    }
  }
  SUBCASE("adaptive_avg_pool2d, overlapping and global windows") {
    gradcheck([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], {3, 4}); }, {rnd({2, 2, 7, 9}, 17)});
    gradcheck([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], 1); }, {rnd({2, 3, 5, 5}, 18)});
    gradcheck([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], {4, 5}); }, {rnd({1, 2, 6, 6}, 19)});
  }
}

TEST_CASE("conv2d and pooling: forward and backward match PyTorch 1.13 (fixture)") {
  const TensorMap f = fixture();
  int cases = 0;
  for (int i = 0; f.contains("conv" + std::to_string(i) + ".x"); ++i, ++cases) {
    const std::string key = "conv" + std::to_string(i) + ".";
    const auto p = params(f, key);
    const bool bias = f.contains(key + "b");
    std::vector<std::string> leaves{"x", "w"};
    if (bias) leaves.push_back("b");
    check_parity(f, key, leaves, [&](const std::vector<Tensor>& t) {
      return conv2d(t[0], t[1], bias ? t[2] : Tensor(), {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, p[6]);
    });
  }
  for (int i = 0; f.contains("max" + std::to_string(i) + ".x"); ++i, ++cases) {
    const std::string key = "max" + std::to_string(i) + ".";
    const auto p = params(f, key);
    check_parity(f, key, {"x"}, [&](const std::vector<Tensor>& t) {
      return max_pool2d(t[0], {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, {p[6], p[7]});
    });
  }
  for (int i = 0; f.contains("avg" + std::to_string(i) + ".x"); ++i, ++cases) {
    const std::string key = "avg" + std::to_string(i) + ".";
    const auto p = params(f, key);
    check_parity(f, key, {"x"}, [&](const std::vector<Tensor>& t) {
      return avg_pool2d(t[0], {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, p[6] != 0);
    });
  }
  for (int i = 0; f.contains("adaptive" + std::to_string(i) + ".x"); ++i, ++cases) {
    const std::string key = "adaptive" + std::to_string(i) + ".";
    const auto p = params(f, key);
    check_parity(f, key, {"x"}, [&](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], {p[0], p[1]}); });
  }
  CHECK(cases == 18);  // 7 conv, 4 max, 4 avg, 3 adaptive
}

TEST_CASE("conv2d and pooling on the sim device equal the CPU bit for bit") {
  const Device sim = Device::sim(0);
  auto run = [](Device dev, const std::function<Tensor(const std::vector<Tensor>&)>& op,
                const std::vector<Tensor>& host, const Tensor& gy) {
    std::vector<Tensor> in;
    for (const Tensor& t : host) {
      Tensor c = (dev == Device::cpu() ? t.clone() : t.to(dev)).detach();
      in.push_back(c.requires_grad_(true));
    }
    Tensor y = op(in);
    y.backward(gy.to(dev));
    std::vector<Tensor> res{y};
    for (const Tensor& t : in) res.push_back(t.grad());
    return res;
  };
  auto same = [&](const std::function<Tensor(const std::vector<Tensor>&)>& op, const std::vector<Tensor>& host) {
    Tensor probe;
    {
      NoGradGuard ng;
      probe = op(host);
    }
    const Tensor gy = rnd(probe.shape(), 99);
    const auto a = run(Device::cpu(), op, host, gy), b = run(sim, op, host, gy);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      CHECK(b[i].device() == sim);
      CHECK(same_bits(a[i], b[i]));
    }
  };
  int seed = 40;
  for (const ConvCase& c : kConvCases) {
    CAPTURE(shape_str(c.w));
    std::vector<Tensor> host{rnd(c.x, seed), rnd(c.w, seed + 1)};
    if (c.bias) host.push_back(rnd({c.w[0]}, seed + 2));
    seed += 3;
    same([&](const std::vector<Tensor>& t) {
      return conv2d(t[0], t[1], c.bias ? t[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
    }, host);
  }
  const std::vector<Tensor> x{rnd({2, 3, 9, 7}, 50)};
  same([](const std::vector<Tensor>& t) { return max_pool2d(t[0], 3, 2, 1, 2); }, x);
  same([](const std::vector<Tensor>& t) { return max_pool2d(t[0], 2); }, x);  // the 2x2 fast path
  same([](const std::vector<Tensor>& t) { return avg_pool2d(t[0], 3, 2, 1, false); }, x);
  same([](const std::vector<Tensor>& t) { return avg_pool2d(t[0], 2); }, x);
  same([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], {4, 3}); }, x);
}

TEST_CASE("max_pool2d: a NaN in a window wins, as in PyTorch (2x2 fast path and general path)") {
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  v[5] = std::nanf("");  // window (0, 0) of the 2x2 pool; first row of the 3x3 windows
  const Tensor x = tensor(v, {1, 1, 4, 4});
  const auto a = max_pool2d(x, 2).to_vector<float>();
  CHECK(std::isnan(a[0]));
  CHECK(a[1] == 7.f);
  CHECK(a[3] == 15.f);
  const auto b = max_pool2d(x, 3, 1).to_vector<float>();
  CHECK(std::isnan(b[0]));
  CHECK(std::isnan(b[2]));
  CHECK(std::isnan(b[3]));  // every 3x3 window of the 4x4 plane holds (1, 1)
  Tensor leaf = x.clone().requires_grad_(true);
  sum(max_pool2d(leaf, 2)).backward();
  const auto g = leaf.grad().to_vector<float>();
  CHECK(g[5] == 1.f);  // the NaN's position got window (0, 0)'s gradient
  CHECK(g[0] == 0.f);
}

TEST_CASE("conv2d and pooling: bad shapes and arguments give one line naming the op and the shapes") {
  const Tensor x = rnd({2, 3, 8, 8}, 1), w = rnd({4, 3, 3, 3}, 2);
  std::string m = what_of([&] { conv2d(rnd({3, 8, 8}, 1), w); });
  CHECK(m.find("conv2d") != std::string::npos);
  CHECK(m.find("[3, 8, 8]") != std::string::npos);
  m = what_of([&] { conv2d(x, rnd({4, 2, 3, 3}, 3)); });
  CHECK(m.find("conv2d") != std::string::npos);
  CHECK(m.find("[2, 3, 8, 8]") != std::string::npos);
  CHECK(m.find("[4, 2, 3, 3]") != std::string::npos);
  m = what_of([&] { conv2d(x, rnd({4, 1, 3, 3}, 3), Tensor(), 1, 0, 1, 2); });  // 3 channels, 2 groups
  CHECK(m.find("groups") != std::string::npos);
  m = what_of([&] { conv2d(x, w, rnd({5}, 4)); });
  CHECK(m.find("bias [5]") != std::string::npos);
  m = what_of([&] { conv2d(x, rnd({4, 3, 9, 9}, 3)); });  // kernel larger than the input
  CHECK(m.find("smaller than") != std::string::npos);
  m = what_of([&] { conv2d(x, w, Tensor(), 0); });
  CHECK(m.find("stride") != std::string::npos);
  m = what_of([&] { max_pool2d(x, 2, 2, 2); });  // padding above half the kernel
  CHECK(m.find("max_pool2d") != std::string::npos);
  CHECK(m.find("half of kernel") != std::string::npos);
  m = what_of([&] { avg_pool2d(rnd({8, 8}, 1), 2); });
  CHECK(m.find("avg_pool2d") != std::string::npos);
  CHECK(m.find("[8, 8]") != std::string::npos);
  m = what_of([&] { max_pool2d(rnd({1, 1, 2, 2}, 1), 3); });
  CHECK(m.find("smaller than") != std::string::npos);
  m = what_of([&] { adaptive_avg_pool2d(x, {0, 2}); });
  CHECK(m.find("adaptive_avg_pool2d") != std::string::npos);
  CHECK(m.find('\n') == std::string::npos);
  CHECK_THROWS_AS(nn::Conv2d(3, 4, 3, 1, 0, 1, 2), ValueError);
}

TEST_CASE("nn::Conv2d, pooling modules and Flatten: PyTorch's names, repr, init and shapes") {
  Generator g(7);
  nn::Conv2d conv(4, 8, 3, 1, 1, 1, 2, true, &g);
  CHECK(conv.describe() == "Conv2d(4, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), groups=2)");
  CHECK(nn::Conv2d(1, 32, 3).describe() == "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))");
  CHECK(nn::Conv2d(2, 2, {3, 1}, 2, 0, 2, 1, false).describe() ==
        "Conv2d(2, 2, kernel_size=(3, 1), stride=(2, 2), dilation=(2, 2), bias=False)");
  const TensorMap sd = conv.state_dict();
  REQUIRE(sd.contains("weight"));
  REQUIRE(sd.contains("bias"));
  CHECK(sd.at("weight").shape() == Shape{8, 2, 3, 3});
  CHECK(sd.at("bias").shape() == Shape{8});
  const float bound = 1.f / std::sqrt(2.f * 9.f);  // fan_in = in / groups * kh * kw
  for (const Tensor& p : {conv.weight, conv.bias}) {
    float lo = 1e9f, hi = -1e9f;
    for (float v : p.to_vector<float>()) lo = std::min(lo, v), hi = std::max(hi, v);
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    CHECK(hi - lo > bound);  // spread over the range, not constant
  }
  CHECK(nn::MaxPool2d(2).describe() == "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  CHECK(nn::AvgPool2d(3, 2, 1).describe() == "AvgPool2d(kernel_size=3, stride=2, padding=1)");
  CHECK(nn::AvgPool2d(2, 0, 0, false).describe() == "AvgPool2d(kernel_size=2, stride=2, padding=0, count_include_pad=False)");
  CHECK(nn::AdaptiveAvgPool2d(1).describe() == "AdaptiveAvgPool2d(output_size=(1, 1))");
  CHECK(nn::Flatten().describe() == "Flatten(start_dim=1, end_dim=-1)");

  // The example CNN's shapes, and gradients reaching every parameter through Flatten.
  auto c1 = std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1, 1, 1, true, &g);
  auto c2 = std::make_shared<nn::Conv2d>(4, 8, 3, 1, 1, 1, 1, true, &g);
  nn::Sequential model{c1, std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2), c2,
                       std::make_shared<nn::AvgPool2d>(2), std::make_shared<nn::AdaptiveAvgPool2d>(Size2{2, 1}),
                       std::make_shared<nn::Flatten>()};
  Tensor y = model.forward(rnd({3, 1, 12, 12}, 5));
  CHECK(y.shape() == Shape{3, 16});
  sum(y).backward();
  for (auto& [name, p] : model.named_parameters()) {
    CAPTURE(name);
    CHECK(p.grad().defined());
  }
  CHECK(nn::Flatten(0, 1).forward(rnd({2, 3, 4}, 1)).shape() == Shape{6, 4});
  // An empty batch: empty output, zero weight and bias gradients.
  nn::Conv2d c3(2, 3, 3, 1, 1, 1, 1, true, &g);
  Tensor e = c3.forward(zeros({0, 2, 5, 5}));
  CHECK(e.shape() == Shape{0, 3, 5, 5});
  sum(e).backward();
  for (float v : c3.weight.grad().to_vector<float>()) CHECK(v == 0.f);
  for (float v : c3.bias.grad().to_vector<float>()) CHECK(v == 0.f);
  CHECK_THROWS_AS(nn::Flatten(2, 1).forward(rnd({2, 3, 4}, 1)), ValueError);
}
