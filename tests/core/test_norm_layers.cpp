// BatchNorm1d/2d, LayerNorm, Embedding, GELU, Softmax/LogSoftmax, argmax, clip_grad_*:
// finite differences, parity with PyTorch 1.13 (tests/fixtures/norm_parity.npz, made by
// scripts/fixtures/norm.py), the sim device equal to the CPU bit for bit, errors, modules.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <phalanx/core/kernels.hpp>

#include "support/bits_and_env.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::gradcheck;
using phalanx::test::max_rel_err;

namespace {

const TensorMap& fx() {
  static const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/norm_parity.npz");
  return f;
}
const Tensor& F(const std::string& k) { return fx().at(k); }

Tensor rnd(const Shape& s, std::uint64_t seed, float scale = 1.f, float shift = 0.f) {
  Generator g(seed);
  return randn(s, &g) * scale + shift;
}

std::string one_line_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("batch_norm (training and eval), layer_norm: finite differences at several shapes") {
  for (const Shape& s : {Shape{5, 3}, Shape{3, 2, 5}, Shape{2, 3, 3, 4}, Shape{3, 1, 1, 7}}) {
    CAPTURE(shape_str(s));
    const std::int64_t c = s[1];
    for (bool training : {true, false}) {
      CAPTURE(training);
      Tensor rm = rnd({c}, 5, 0.3f), rv = rnd({c}, 6, 0.1f, 1.0f);
      gradcheck(
          [&](const std::vector<Tensor>& in) {
            Tensor m = rm.clone(), v = rv.clone();  // running stats change in training
            return batch_norm(in[0], m, v, in[1], in[2], training, 0.1, 1e-5);
          },
          {rnd(s, 1, 1.5f, 0.3f), rnd({c}, 2, 0.5f, 1.f), rnd({c}, 3)}, 1e-2f, 3e-3, 3e-2);
    }
    gradcheck([&](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
              {rnd(s, 4, 2.f)}, 1e-2f, 3e-3, 3e-2);
  }
  for (auto [s, ns] : {std::pair{Shape{4, 7}, Shape{7}}, {Shape{2, 3, 5}, Shape{3, 5}}, {Shape{3, 2}, Shape{2}}}) {
    CAPTURE(shape_str(s));
    gradcheck([&](const std::vector<Tensor>& in) { return layer_norm(in[0], ns, in[1], in[2]); },
              {rnd(s, 7, 1.5f), rnd(ns, 8, 0.5f, 1.f), rnd(ns, 9)}, 1e-2f, 3e-3, 3e-2);
  }
}

TEST_CASE("gelu, softmax, log_softmax, embedding: finite differences") {
  for (const Shape& s : {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}}) {
    CAPTURE(shape_str(s));
    gradcheck([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {rnd(s, 10, 2.f)});
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(s.size()); ++d) {
      gradcheck([d](const std::vector<Tensor>& in) { return softmax(in[0], d); }, {rnd(s, 11)});
      gradcheck([d](const std::vector<Tensor>& in) { return log_softmax(in[0], d); }, {rnd(s, 12)});
    }
  }
  const Tensor idx = tensor(std::vector<std::int64_t>{0, 3, 3, 1, 4, 0, 2}, {7});
  // (the padding row gets no gradient by design: the fixture checks that; 5 is not among idx)
  for (std::int64_t pad : {-1, 5}) {
    CAPTURE(pad);
    gradcheck([&](const std::vector<Tensor>& in) { return embedding(idx, in[0], pad); }, {rnd({6, 3}, 13)});
  }
}

TEST_CASE("BatchNorm1d/2d: three train steps, running stats, num_batches_tracked and eval match PyTorch") {
  struct Case {
    const char* name;
    int kind;  // 1 or 2
    std::int64_t c;
    std::optional<double> momentum;
    bool affine, track;
  };
  for (const Case& k : {Case{"bn1d_2d", 1, 4, 0.1, true, true}, Case{"bn1d_3d", 1, 3, 0.1, true, true},
                        Case{"bn2d", 2, 3, 0.1, true, true}, Case{"bn2d_cumulative", 2, 5, std::nullopt, true, true},
                        Case{"bn2d_noaffine", 2, 2, 0.3, false, true}, Case{"bn2d_notrack", 2, 3, 0.1, true, false}}) {
    CAPTURE(k.name);
    const std::string n = k.name;
    std::shared_ptr<nn::BatchNorm> m;
    if (k.kind == 1)
      m = std::make_shared<nn::BatchNorm1d>(k.c, 1e-5, k.momentum, k.affine, k.track);
    else
      m = std::make_shared<nn::BatchNorm2d>(k.c, 1e-5, k.momentum, k.affine, k.track);
    if (k.affine) {
      m->weight.copy_(F(n + ".init.weight"));
      m->bias.copy_(F(n + ".init.bias"));
    }
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      const std::string i = std::to_string(s);
      Tensor x = F(n + ".x" + i).clone().requires_grad_();
      m->zero_grad();
      Tensor y = m->forward(x);
      CHECK(max_rel_err(y, F(n + ".y" + i)) < 1e-5);
      y.backward(F(n + ".gy" + i));
      CHECK(max_rel_err(x.grad(), F(n + ".gx" + i)) < 1e-5);
      if (k.affine) {
        CHECK(max_rel_err(m->weight.grad(), F(n + ".gw" + i)) < 1e-5);
        CHECK(max_rel_err(m->bias.grad(), F(n + ".gb" + i)) < 1e-5);
      }
    }
    // state_dict: PyTorch's keys, values after the steps
    TensorMap sd = m->state_dict();
    std::size_t expected_keys = 0;
    for (const auto& [key, t] : fx())
      if (key.rfind(n + ".state.", 0) == 0) {
        ++expected_keys;
        const std::string name = key.substr(n.size() + 7);
        CAPTURE(name);
        REQUIRE(sd.find(name) != nullptr);
        if (name == "num_batches_tracked") {
          CHECK(sd.at(name).dtype() == DType::Int64);
          CHECK(sd.at(name).dim() == 0);
          CHECK(sd.at(name).item_int() == t.item_int());
        } else {
          CHECK(max_rel_err(sd.at(name), t) < 1e-5);
        }
      }
    CHECK(sd.size() == expected_keys);
    m->eval();
    m->zero_grad();
    Tensor x = F(n + ".xe").clone().requires_grad_();
    Tensor y = m->forward(x);
    CHECK(max_rel_err(y, F(n + ".ye")) < 1e-5);
    y.backward(F(n + ".gye"));
    CHECK(max_rel_err(x.grad(), F(n + ".gxe")) < 1e-5);
    if (k.affine) {
      CHECK(max_rel_err(m->weight.grad(), F(n + ".gwe")) < 1e-5);
      CHECK(max_rel_err(m->bias.grad(), F(n + ".gbe")) < 1e-5);
    }
  }
}

TEST_CASE("layer_norm, embedding, gelu, softmax, log_softmax, argmax match PyTorch") {
  for (auto [n, ns, affine] : {std::tuple{"ln_a", Shape{7}, true}, {"ln_b", Shape{3, 5}, true}, {"ln_c", Shape{6}, false}}) {
    CAPTURE(n);
    const std::string p = n;
    nn::LayerNorm ln(ns, 1e-5, affine);
    if (affine) {
      ln.weight.copy_(F(p + ".w"));
      ln.bias.copy_(F(p + ".b"));
    }
    Tensor x = F(p + ".x").clone().requires_grad_();
    Tensor y = ln(x);
    CHECK(max_rel_err(y, F(p + ".y")) < 1e-5);
    y.backward(F(p + ".gy"));
    CHECK(max_rel_err(x.grad(), F(p + ".gx")) < 1e-5);
    if (affine) {
      CHECK(max_rel_err(ln.weight.grad(), F(p + ".gw")) < 1e-5);
      CHECK(max_rel_err(ln.bias.grad(), F(p + ".gb")) < 1e-5);
    }
  }
  {
    nn::Embedding emb(10, 4, 2);
    emb.weight.copy_(F("emb.w"));
    Tensor y = emb(F("emb.idx"));
    CHECK(y.shape() == Shape{3, 5, 4});
    CHECK(max_rel_err(y, F("emb.y")) < 1e-5);
    y.backward(F("emb.gy"));
    CHECK(max_rel_err(emb.weight.grad(), F("emb.gw")) < 1e-5);
  }
  {
    nn::GELU g;
    Tensor x = F("gelu.x").clone().requires_grad_();
    Tensor y = g(x);
    CHECK(max_rel_err(y, F("gelu.y")) < 1e-5);
    y.backward(F("gelu.gy"));
    CHECK(max_rel_err(x.grad(), F("gelu.gx")) < 1e-5);
  }
  for (int i = 0; i < 2; ++i) {
    const std::int64_t dim = i == 0 ? 1 : -1;
    for (const std::string key : {"softmax", "log_softmax"}) {
      CAPTURE(key);
      CAPTURE(dim);
      const std::string p = key + std::to_string(i);
      nn::ModulePtr m = key == "softmax" ? nn::ModulePtr(std::make_shared<nn::Softmax>(dim))
                                         : nn::ModulePtr(std::make_shared<nn::LogSoftmax>(dim));
      Tensor x = F(p + ".x").clone().requires_grad_();
      Tensor y = m->forward(x);
      CHECK(max_rel_err(y, F(p + ".y")) < 1e-5);
      y.backward(F(p + ".gy"));
      CHECK(max_rel_err(x.grad(), F(p + ".gx")) < 1e-5);
    }
  }
  const Tensor& ax = F("argmax.x");
  CHECK(argmax(ax, 0).to_vector<std::int64_t>() == F("argmax.d0").to_vector<std::int64_t>());
  CHECK(argmax(ax, 1).to_vector<std::int64_t>() == F("argmax.d1").to_vector<std::int64_t>());
  CHECK(argmax(ax).item_int() == F("argmax.flat").to_vector<std::int64_t>()[0]);
  CHECK(argmax(ax, 1, true).shape() == Shape{5, 1});
  CHECK(argmax(ax).dim() == 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(argmax(tensor(std::vector<float>{1.f, nan, 5.f, nan}, {4})).item_int() == 1);  // NaN is the maximum, as PyTorch
}

TEST_CASE("clip_grad_norm_ (orders 2, 1, inf, 3) and clip_grad_value_ match PyTorch") {
  auto params = [] {
    std::vector<Tensor> ps{zeros({5, 3}).requires_grad_(), zeros({7}).requires_grad_()};
    ps[0].set_grad(F("clip.g1").clone());
    ps[1].set_grad(F("clip.g2").clone());
    return ps;
  };
  const double inf = std::numeric_limits<double>::infinity();
  for (auto [tag, p, mx] : {std::tuple{"n2", 2.0, 1.0}, {"n1", 1.0, 2.0}, {"ninf", inf, 0.5}, {"n3", 3.0, 1.5},
                            {"n2big", 2.0, 100.0}}) {
    CAPTURE(tag);
    const std::string k = std::string("clip.") + tag;
    auto ps = params();
    const double total = nn::clip_grad_norm_(ps, mx, p);
    CHECK(std::abs(total - F(k + ".total").item()) <= 1e-5 * std::abs(total));
    CHECK(max_rel_err(ps[0].grad(), F(k + ".g1")) < 1e-5);
    CHECK(max_rel_err(ps[1].grad(), F(k + ".g2")) < 1e-5);
  }
  auto ps = params();
  nn::clip_grad_value_(ps, 0.5);
  CHECK(max_rel_err(ps[0].grad(), F("clip.value.g1")) == 0);
  CHECK(max_rel_err(ps[1].grad(), F("clip.value.g2")) == 0);
  // no gradients: total 0; a parameter without a gradient is skipped
  std::vector<Tensor> none{zeros({2}).requires_grad_()};
  CHECK(nn::clip_grad_norm_(none, 1.0) == 0.0);
  // non-finite total
  std::vector<Tensor> bad{zeros({2}).requires_grad_()};
  bad[0].set_grad(tensor(std::vector<float>{1.f, std::numeric_limits<float>::infinity()}, {2}));
  CHECK(std::isinf(nn::clip_grad_norm_(bad, 1.0)));
  const std::string e = one_line_error([&] { nn::clip_grad_norm_(bad, 1.0, 2.0, true); });
  CHECK(e.find("non-finite") != std::string::npos);
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("norm layers, embedding, gelu, softmax, argmax, clamp on the sim device equal the CPU bit for bit") {
  const Device sim = Device::sim(0);
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
    return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
  };
  auto run = [](Device d) {
    std::vector<Tensor> out;
    auto on = [d](const Tensor& t) { return t.to(d); };
    auto bn = std::make_shared<nn::BatchNorm2d>(3);
    bn->weight.copy_(F("bn2d.init.weight"));
    bn->bias.copy_(F("bn2d.init.bias"));
    bn->to(d);
    for (int s = 0; s < 2; ++s) {
      Tensor x = on(F("bn2d.x" + std::to_string(s))).requires_grad_();
      bn->zero_grad();
      Tensor y = bn->forward(x);
      y.backward(on(F("bn2d.gy" + std::to_string(s))));
      out.insert(out.end(), {y, x.grad(), bn->weight.grad(), bn->bias.grad()});
    }
    bn->eval();
    Tensor xe = on(F("bn2d.xe")).requires_grad_();
    Tensor ye = bn->forward(xe);
    ye.backward(on(F("bn2d.gye")));
    out.insert(out.end(), {ye, xe.grad(), bn->running_mean, bn->running_var, bn->num_batches_tracked});
    nn::LayerNorm ln(Shape{3, 5});
    ln.to(d);
    Tensor xl = on(F("ln_b.x")).requires_grad_();
    Tensor yl = ln(xl);
    yl.backward(on(F("ln_b.gy")));
    out.insert(out.end(), {yl, xl.grad(), ln.weight.grad(), ln.bias.grad()});
    Tensor w = on(F("emb.w")).requires_grad_();
    Tensor ye2 = embedding(on(F("emb.idx")), w, 2);
    ye2.backward(on(F("emb.gy")));
    out.insert(out.end(), {ye2, w.grad()});
    Tensor xg = on(F("gelu.x")).requires_grad_();
    Tensor yg = gelu(xg);
    yg.backward(on(F("gelu.gy")));
    Tensor xs = on(F("softmax0.x")).requires_grad_();
    Tensor ys = softmax(xs, 1);
    ys.backward(on(F("softmax0.gy")));
    out.insert(out.end(), {yg, xg.grad(), ys, xs.grad(), argmax(on(F("argmax.x")), 1), argmax(on(F("argmax.x"))),
                           clamp(on(F("gelu.x")), -0.5f, 0.25f)});
    return out;
  };
  const auto a = run(Device::cpu()), b = run(sim);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(b[i].device() == sim);
    CHECK(same_bits(a[i], b[i]));
  }
}

TEST_CASE("float32 gelu and its backward: the same bits at every SIMD level, NaN, inf, -0, subnormals, tails") {
  // PHALANX_GELU_SIMD caps the level (cpu_elementwise.cpp): scalar runs the baseline copy (libm
  // fmaf), avx2 the AVX2 + FMA one, avx512 the AVX-512F one where the CPU has it (else AVX2).
  // Bits compared as bits, NaNs included: a NaN x used to give +NaN on one level and -NaN on
  // another in the backward (exp_nonpositive's integer steps on a NaN, then an fma's choice).
  const std::uint32_t special[] = {0x7FC00000u, 0xFFC00000u, 0x7FC12345u, 0xFF812345u, 0x7FA00001u, 0xFF800001u, 0xFF800100u, 0xFF800B00u,
                                   0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u,
                                   0x007FFFFFu, 0x807FFFFFu, 0x3F6D8000u, 0xBF6D8000u, 0x407AE148u, 0xC07AE148u,
                                   0x40800000u, 0xC0800000u, 0x41533333u, 0xC1533333u, 0x7F7FFFFFu, 0xFF7FFFFFu};
  const std::size_t ns = sizeof special / sizeof special[0];
  std::uint64_t state = 88172645463325252ull;
  const auto next = [&] {  // xorshift64: any 32-bit pattern
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return static_cast<std::uint32_t>(state >> 11);
  };
  for (std::int64_t n : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 47, 64, 1000, 4099}) {
    std::vector<float> x(static_cast<std::size_t>(n)), g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      // a third specials, a third ordinary values in GELU's curved range, a third any pattern
      const std::uint32_t r = next();
      x[i] = i % 3 == 0 ? test::float_of(special[(i / 3 + static_cast<std::size_t>(n)) % ns])
             : i % 3 == 1 ? static_cast<float>(static_cast<std::int32_t>(r)) * 0x1p-28f
                          : test::float_of(r);
      g[i] = i % 5 == 4 ? test::float_of(special[(i + 7) % ns]) : static_cast<float>(static_cast<std::int32_t>(next())) * 0x1p-31f;
    }
    const Tensor xt = tensor(x, {n}), gt = tensor(g, {n});
    std::vector<std::uint32_t> want_y, want_gx;
    for (const char* level : {"scalar", "avx2", "avx512"}) {
      CAPTURE(n);
      CAPTURE(std::string(level));
      test::ScopedEnv env("PHALANX_GELU_SIMD", level);
      Tensor y = Tensor::empty({n}, DType::Float32), gx = Tensor::empty({n}, DType::Float32);
      kernels_for(Device::cpu()).unary(UnaryOp::Gelu, xt, y);
      kernels_for(Device::cpu()).unary_backward(UnaryOp::Gelu, gt, xt, Tensor(), gx);
      std::vector<std::uint32_t> yb, gb;
      for (float v : y.to_vector<float>()) yb.push_back(test::bits_of(v));
      for (float v : gx.to_vector<float>()) gb.push_back(test::bits_of(v));
      if (want_y.empty()) {
        want_y = yb, want_gx = gb;
        continue;
      }
      for (std::size_t i = 0; i < yb.size(); ++i) {
        CAPTURE(i);
        CAPTURE(x[i]);
        CAPTURE(g[i]);
        CHECK(yb[i] == want_y[i]);
        if (!(std::isnan(g[i]) && std::isnan(x[i]))) CHECK(gb[i] == want_gx[i]);  // two NaNs: either may pass
      }
    }
  }
  // what the values are: +-0 keep their sign, +inf -> +inf, a NaN x gives its own NaN in the backward
  const Tensor y = gelu(tensor(std::vector<float>{0.f, -0.f, std::numeric_limits<float>::infinity()}, {3}));
  const std::vector<float> yv = y.to_vector<float>();
  CHECK(test::bits_of(yv[0]) == 0x00000000u);
  CHECK(test::bits_of(yv[1]) == 0x80000000u);
  CHECK(yv[2] == std::numeric_limits<float>::infinity());
  Tensor gx = Tensor::empty({2}, DType::Float32);
  kernels_for(Device::cpu()).unary_backward(UnaryOp::Gelu, tensor(std::vector<float>{1.f, 2.f}, {2}),
                                            tensor(std::vector<float>{test::float_of(0xFF800100u), test::float_of(0x7FC00000u)}, {2}),
                                            Tensor(), gx);
  CHECK(test::bits_of(gx.to_vector<float>()[0]) == 0xFFC00100u);  // quieted
  CHECK(test::bits_of(gx.to_vector<float>()[1]) == 0x7FC00000u);
}

TEST_CASE("norm layers and friends: bad input gives one line naming the op and what to do") {
  auto check = [](const std::function<void()>& f, const std::string& part) {
    const std::string e = one_line_error(f);
    CAPTURE(e);
    CHECK(e.find(part) != std::string::npos);
    CHECK(e.find('\n') == std::string::npos);
  };
  nn::BatchNorm2d bn(3);
  check([&] { bn(zeros({1, 3, 1, 1})); }, "more than 1 value per channel");
  CHECK(bn.num_batches_tracked.item_int() == 0);  // the failed step did not count
  check([&] { bn(zeros({2, 3, 4})); }, "expected 4D input");
  check([&] { bn(zeros({2, 4, 2, 2})); }, "4 channels");
  {  // an empty batch, as PyTorch 1.13: empty output, a counted step, stats kept, zero grads
    const Tensor x = zeros({0, 3, 2, 2}).requires_grad_();
    const Tensor y = bn(x);
    CHECK(y.shape() == Shape{0, 3, 2, 2});
    sum(y).backward();
    CHECK(bn.num_batches_tracked.item_int() == 1);
    CHECK(bn.running_mean.to_vector<float>() == std::vector<float>{0, 0, 0});
    CHECK(bn.running_var.to_vector<float>() == std::vector<float>{1, 1, 1});
    REQUIRE(bn.weight.grad().defined());
    CHECK(bn.weight.grad().to_vector<float>() == std::vector<float>{0, 0, 0});
    CHECK(bn.bias.grad().to_vector<float>() == std::vector<float>{0, 0, 0});
    nn::BatchNorm1d untracked(3, 1e-5, 0.1, true, false);
    CHECK(untracked(zeros({0, 3})).shape() == Shape{0, 3});
  }
  nn::BatchNorm1d bn1(3);
  check([&] { bn1(zeros({2, 3, 4, 5})); }, "expected 2D or 3D input");
  check([&] { bn1(zeros({1, 3})); }, "more than 1 value per channel");
  bn1.eval();
  CHECK(bn1(ones({1, 3})).shape() == Shape{1, 3});  // eval mode takes a batch of one
  check([&] { nn::LayerNorm(Shape{4})(zeros({2, 5})); }, "does not end in normalized_shape");
  nn::Embedding emb(5, 2);
  check([&] { emb(tensor(std::vector<std::int64_t>{1, 5}, {2})); }, "index 5 at position 1 is out of range [0, 5)");
  check([&] { emb(zeros({2})); }, "indices must be int64");
  check([&] { argmax(zeros({2, 0}), 1); }, "empty");
  check([&] { nn::clip_grad_norm_({}, 1.0, -1.0); }, "norm_type");
  check([&] { nn::Embedding(4, 2, 4); }, "padding_idx");
  check([&] { nn::BatchNorm2d(3, 1e-5, 2.0); }, "momentum");
}

TEST_CASE("layer_norm and a broadcast bias row on an empty batch: empty output, zero gradients (PyTorch)") {
  const Tensor x = zeros({0, 5}).requires_grad_(), w = ones({5}).requires_grad_(), b = ones({5}).requires_grad_();
  const Tensor y = layer_norm(x, {5}, w, b);  // mul/add of [0, 5] with a row [5]
  CHECK(y.shape() == Shape{0, 5});
  sum(y).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>(5, 0.f));
  CHECK(b.grad().to_vector<float>() == std::vector<float>(5, 0.f));
  CHECK(x.grad().shape() == Shape{0, 5});
  const Tensor r = ones({3}).requires_grad_();
  sum(div(zeros({0, 3}), r)).backward();  // the row operand on the right of an empty one
  CHECK(r.grad().to_vector<float>() == std::vector<float>(3, 0.f));
  CHECK_THROWS_AS(add(zeros({0}), ones({4})), ShapeError);
}

TEST_CASE("nn modules: PyTorch's names, repr, defaults and initialisation") {
  nn::BatchNorm2d bn(4);
  CHECK(bn.describe() == "BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  std::vector<std::string> keys;
  for (const auto& [k, t] : bn.state_dict()) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"});
  CHECK(bn.weight.to_vector<float>() == std::vector<float>(4, 1.f));
  CHECK(bn.running_var.to_vector<float>() == std::vector<float>(4, 1.f));
  CHECK(nn::BatchNorm1d(3, 1e-3, std::nullopt, false, false).describe() ==
        "BatchNorm1d(3, eps=0.001, momentum=None, affine=False, track_running_stats=False)");
  CHECK(nn::BatchNorm1d(3, 1e-5, 0.1, false, false).state_dict().size() == 0);
  CHECK(nn::LayerNorm(Shape{8}).describe() == "LayerNorm((8,), eps=1e-05, elementwise_affine=True)");
  nn::Embedding emb(6, 3, -1);
  CHECK(emb.describe() == "Embedding(6, 3, padding_idx=5)");
  CHECK(emb.weight.narrow_rows(5, 6).to_vector<float>() == std::vector<float>(3, 0.f));
  CHECK(nn::GELU().describe() == "GELU(approximate='none')");
  CHECK(nn::Softmax(1).describe() == "Softmax(dim=1)");
  CHECK(nn::LogSoftmax(-1).describe() == "LogSoftmax(dim=-1)");
  // N(0, 1) init: the sample's moments over a large table
  nn::Embedding big(1000, 50);
  const auto v = big.weight.to_vector<float>();
  double s = 0, q = 0;
  for (float x : v) s += x, q += double(x) * x;
  CHECK(std::abs(s / v.size()) < 0.02);
  CHECK(std::abs(q / v.size() - 1.0) < 0.03);
}
