// phalanx::autocast against PyTorch 1.13's torch.autocast("cpu", dtype=torch.bfloat16):
// the scope's rules, the cast cache, gradients reaching float32 masters, per-op outputs and
// dtypes, and a 200-step MLP loss curve (fixture: scripts/fixtures/autocast.py).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "phalanx/core/autocast.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/gpt.hpp"
#include "phalanx/core/npy.hpp"
#include "phalanx/core/ops.hpp"
#include "phalanx/core/tensor_map.hpp"

using namespace phalanx;

namespace {

const TensorMap& fixture() {
  static const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/autocast_parity.npz");
  return f;
}

std::vector<float> values(const Tensor& t) {
  return (t.dtype() == DType::Float32 ? t : to_dtype(t.detach(), DType::Float32)).to_vector<float>();
}

DType expected_dtype(const std::string& name) {
  return fixture().at(name + ".bf16").item_int() == 1 ? DType::BFloat16 : DType::Float32;
}

/// max |a - b| / max |b|: the error relative to the tensor's scale.
double scaled_err(const Tensor& a, const Tensor& b) {
  const auto va = values(a), vb = values(b);
  REQUIRE(va.size() == vb.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(va[i]) - vb[i]));
    den = std::max(den, std::fabs(static_cast<double>(vb[i])));
  }
  return den > 0 ? num / den : num;
}

/// Share of elements whose bits equal PyTorch's (as bf16 when the output is bf16).
double bit_equal_share(const Tensor& a, const Tensor& b) {
  const auto va = values(a), vb = values(b);
  std::size_t same = 0;
  for (std::size_t i = 0; i < va.size(); ++i) same += std::memcmp(&va[i], &vb[i], 4) == 0;
  return va.empty() ? 1.0 : static_cast<double>(same) / static_cast<double>(va.size());
}

void check_op(const std::string& name, const Tensor& y, double tol = 1e-2) {
  CAPTURE(name);
  const Tensor& ref = fixture().at(name);
  CHECK(y.dtype() == expected_dtype(name));
  CHECK(y.shape() == ref.shape());
  const double err = scaled_err(y, ref);
  CHECK(err <= tol);
  MESSAGE(name << ": scaled error " << err << ", bit-equal share " << bit_equal_share(y, ref));
}

Tensor in(const std::string& k) { return fixture().at("in." + k); }
Tensor bf16(const Tensor& t) { return to_dtype(t, DType::BFloat16); }

}  // namespace

TEST_CASE("autocast scope: thread-local, nestable, enabled=false, dtype, errors") {
  CHECK_FALSE(autocast::is_enabled());
  {
    autocast outer(DType::BFloat16);
    CHECK(autocast::is_enabled());
    CHECK(autocast::dtype() == DType::BFloat16);
    CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));
    {
      autocast off(DType::BFloat16, false);
      CHECK_FALSE(autocast::is_enabled());
      Tensor y = linear(ones({2, 3}), ones({4, 3}), Tensor());
      CHECK(y.dtype() == DType::Float32);  // disabled: float32 in, float32 out
      {
        autocast inner(DType::BFloat16);
        CHECK(autocast::is_enabled());
      }
      CHECK_FALSE(autocast::is_enabled());
    }
    CHECK(autocast::is_enabled());
    CHECK(linear(ones({2, 3}), ones({4, 3}), Tensor()).dtype() == DType::BFloat16);
    {
      autocast cuda(DeviceType::CUDA, DType::Float16);
      CHECK(autocast::is_enabled(DeviceType::CUDA));
      CHECK(autocast::dtype(DeviceType::CUDA) == DType::Float16);
      CHECK(autocast::is_enabled(DeviceType::CPU));
    }
    CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));
  }
  CHECK_FALSE(autocast::is_enabled());
  CHECK(linear(ones({2, 3}), ones({4, 3}), Tensor()).dtype() == DType::Float32);
  CHECK_THROWS_AS(autocast(DType::Float16), ValueError);  // the CPU autocasts to bf16 only
  CHECK_THROWS_AS(autocast(DeviceType::CUDA, DType::Float32), ValueError);
  CHECK_NOTHROW(autocast(DType::Float16, false));  // a disabled scope takes any dtype
  CHECK_FALSE(autocast::is_enabled());
}

TEST_CASE("autocast: a weight is cast once per forward (the cast cache)") {
  Tensor w1 = randn({8, 4}).requires_grad_(), b1 = zeros({8}).requires_grad_();
  Tensor w2 = randn({3, 8}).requires_grad_();
  Tensor x = randn({5, 4});  // input: no grad, not cached
  auto forward = [&] {
    Tensor h = relu(linear(x, w1, b1));
    h = linear(h, w2, Tensor());
    return add(h, linear(linear(x, w1, b1), w2, Tensor()));  // w1, b1, w2 used twice
  };
  for (int step = 0; step < 2; ++step) {
    const std::uint64_t before = autocast::cast_count();
    {
      autocast guard(DType::BFloat16);
      Tensor y = forward();
      CHECK(y.dtype() == DType::BFloat16);
      // w1, b1, w2 once each, x twice (not a leaf that requires grad: never cached)
      CHECK(autocast::cast_count() - before == 5);
      CHECK(autocast::cache_size() == 3);
      {
        autocast nested(DType::BFloat16);  // an inner scope keeps the cache
        linear(x, w1, b1);
        CHECK(autocast::cast_count() - before == 6);
      }
      CHECK(autocast::cache_size() == 3);
      sum(to_dtype(y, DType::Float32)).backward();
    }
    CHECK(autocast::cache_size() == 0);  // the outermost scope's exit empties it
    REQUIRE(w1.grad().defined());
    CHECK(w1.grad().dtype() == DType::Float32);
    CHECK(w2.grad().dtype() == DType::Float32);
    CHECK(b1.grad().dtype() == DType::Float32);
    for (const Tensor& p : {w1, w2, b1}) p.set_grad(Tensor());
  }
  {
    autocast no_cache(DType::BFloat16, true, DeviceType::CPU, false);
    const std::uint64_t before = autocast::cast_count();
    linear(x, w1, b1);
    linear(x, w1, b1);
    CHECK(autocast::cast_count() - before == 6);
    CHECK(autocast::cache_size() == 0);
  }
}

TEST_CASE("autocast: gradients reach float32 masters as float32, PyTorch's values") {
  const TensorMap& f = fixture();
  Tensor w = in("w").clone().requires_grad_(), b = in("b").clone().requires_grad_();
  Tensor loss;
  {
    autocast guard(DType::BFloat16);
    loss = cross_entropy(relu(linear(in("x"), w, b)), in("t"));
    CHECK(loss.dtype() == DType::Float32);  // cross_entropy is on the fp32 list
  }
  loss.backward();
  CHECK(w.dtype() == DType::Float32);
  CHECK(w.grad().dtype() == DType::Float32);
  CHECK(b.grad().dtype() == DType::Float32);
  CHECK(scaled_err(loss, f.at("grad.loss")) <= 1e-6);  // float32 loss; its summation order differs
  // docs/mixed_precision.md says bit-equal: the test holds the gradients to that
  CHECK(scaled_err(w.grad(), f.at("grad.w")) == 0);
  CHECK(scaled_err(b.grad(), f.at("grad.b")) == 0);
  MESSAGE("grad w scaled error " << scaled_err(w.grad(), f.at("grad.w")) << ", b "
                                 << scaled_err(b.grad(), f.at("grad.b")));
}

TEST_CASE("autocast: op outputs and dtypes as PyTorch 1.13 (relative 1e-2)") {
  const TensorMap& f = fixture();
  autocast guard(DType::BFloat16);
  // lower-precision list: float32 inputs cast to bf16, bf16 products, float32 accumulation.
  // A tolerance of 0 where docs/mixed_precision.md says bit-equal (every bf16 GEMM path:
  // PHALANX_BF16_GEMM=amx, avx512bf16 and fallback all give PyTorch's bits at these sizes).
  check_op("linear", linear(in("x"), in("w"), in("b")), 0);
  check_op("linear_nobias", linear(in("x"), in("w"), Tensor()), 0);
  check_op("matmul", matmul(in("a"), in("m")), 0);
  check_op("conv2d", conv2d(in("img"), in("cw"), in("cb"), 1, 1), 0);
  // the rest from PyTorch's own bf16 linear output, so that each op is compared alone
  const Tensor h = bf16(f.at("linear"));
  check_op("relu", relu(h), 0);
  check_op("gelu", gelu(h));
  check_op("tanh", tanh(h));
  check_op("sigmoid", sigmoid(h));
  check_op("exp", exp(mul(h, 0.1f)));
  check_op("add_bf16_f32", add(h, in("y")), 0);
  check_op("mul_bf16_bf16", mul(h, h), 0);
  check_op("sub_bias", sub(h, in("b")), 0);
  check_op("add_scalar", add(h, 0.5f), 0);
  check_op("sum", sum(h), 0);
  check_op("mean_dim", mean(h, 1), 0);
  check_op("softmax", softmax(h, -1), 0);
  check_op("log_softmax", log_softmax(h, -1));
  check_op("layer_norm", layer_norm(h, {32}));
  check_op("masked_fill", masked_fill(h, in("mask"), -1.f), 0);
  check_op("transpose", transpose(h, 0, 1), 0);
  check_op("cat_bf16_f32", cat({h, in("y")}), 0);
  check_op("cross_entropy", cross_entropy(h, in("t")), 0);
  check_op("mse_loss", mse_loss(h, in("y")), 0);
  check_op("max_pool2d", max_pool2d(bf16(f.at("conv2d")), 2), 0);
}

TEST_CASE("bf16 tensors outside autocast: PyTorch's promotion, gradients in the input's dtype") {
  Tensor a = bf16(randn({4, 3})).requires_grad_(), b = randn({4, 3}).requires_grad_();
  CHECK(add(a, a).dtype() == DType::BFloat16);
  CHECK(add(a, b).dtype() == DType::Float32);
  CHECK(mul(b, a).dtype() == DType::Float32);
  CHECK(relu(a).dtype() == DType::BFloat16);
  CHECK(dropout(a, 0.5f, true).dtype() == DType::BFloat16);
  // p = 0 or eval: the identity on the bf16 tensor itself (no widening and rounding back: a NaN
  // payload such as 0x7F81 would have come back as 0xFFFF), as PyTorch returns its input.
  CHECK(dropout(a, 0.f, true).is_same(a));
  CHECK(dropout(a, 0.5f, false).is_same(a));
  CHECK_THROWS_AS(dropout(a, 1.5f, true), ValueError);
  CHECK(layer_norm(a, {3}, ones({3}), zeros({3})).dtype() == DType::BFloat16);  // x's dtype
  CHECK(argmax(a, 1).dtype() == DType::Int64);
  sum(mul(relu(a), b)).backward();
  REQUIRE(a.grad().defined());
  CHECK(a.grad().dtype() == DType::BFloat16);
  CHECK(b.grad().dtype() == DType::Float32);
}

TEST_CASE("autocast: a 200-step MLP's loss curve within 1 % of PyTorch 1.13's") {
  const TensorMap& f = fixture();
  Tensor w1 = f.at("mlp.init.w1").clone().requires_grad_(), b1 = f.at("mlp.init.b1").clone().requires_grad_();
  Tensor w2 = f.at("mlp.init.w2").clone().requires_grad_(), b2 = f.at("mlp.init.b2").clone().requires_grad_();
  const Tensor x = f.at("mlp.x"), y = f.at("mlp.y");
  const auto ref = f.at("mlp.losses").to_vector<float>();
  const float lr = f.at("mlp.lr").item();
  double worst = 0;
  std::size_t worst_step = 0;
  for (std::size_t step = 0; step < ref.size(); ++step) {
    Tensor loss;
    {
      autocast guard(DType::BFloat16);
      loss = cross_entropy(linear(relu(linear(x, w1, b1)), w2, b2), y);
    }
    loss.backward();
    const double rel = std::fabs(loss.item() - ref[step]) / ref[step];
    if (rel > worst) worst = rel, worst_step = step;
    NoGradGuard ng;
    for (Tensor* p : {&w1, &b1, &w2, &b2}) {
      REQUIRE(p->grad().dtype() == DType::Float32);
      Tensor upd = sub(*p, mul(p->grad(), lr));
      p->copy_(upd);
      p->set_grad(Tensor());
    }
  }
  MESSAGE("200-step autocast MLP: worst relative loss difference " << worst << " at step " << worst_step
                                                                   << " (final loss PyTorch " << ref.back() << ")");
  CHECK(worst <= 0.01);
}

TEST_CASE("autocast: a GPT (attention, layer norm, GELU, tied embedding) trains in bf16 with float32 masters") {
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(2).n_head(2).n_embd(16));
  Generator g(5);
  Tensor idx = Tensor::empty({4, 8}, DType::Int64), tgt = Tensor::empty({4, 8}, DType::Int64);
  auto* pi = idx.data<std::int64_t>();
  auto* pt = tgt.data<std::int64_t>();
  for (int i = 0; i < 32; ++i) pi[i] = static_cast<std::int64_t>(g.next_u64() % 11), pt[i] = (pi[i] + 1) % 11;
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    Tensor loss;
    {
      autocast guard(DType::BFloat16);
      loss = model.forward(idx, tgt);
    }
    CHECK(loss.dtype() == DType::Float32);
    loss.backward();
    NoGradGuard ng;
    for (auto& p : model.parameters()) {
      REQUIRE(p.dtype() == DType::Float32);
      REQUIRE(p.grad().dtype() == DType::Float32);
      p.copy_(sub(p, mul(p.grad(), 0.1f)));
      p.set_grad(Tensor());
    }
    (step == 0 ? first : last) = loss.item();
  }
  MESSAGE("GPT under autocast: loss " << first << " -> " << last << " in 30 SGD steps");
  CHECK(std::isfinite(last));
  CHECK(last < 0.8f * first);
}

TEST_CASE("autocast: a cached cast serves a second forward and backward in one region") {
  // PyTorch: with torch.autocast(...): twice { loss = f(x, w); loss.backward() } works
  // (ToCopyBackward saves nothing, so a second backward through the cached cast is fine).
  Tensor w = randn({4, 3}).requires_grad_();
  Tensor x = randn({2, 3});
  autocast guard(DType::BFloat16);
  sum(to_dtype(linear(x, w, Tensor()), DType::Float32)).backward();
  const std::vector<float> g1 = w.grad().to_vector<float>();
  CHECK(autocast::cache_size() == 1);
  REQUIRE_NOTHROW(sum(to_dtype(linear(x, w, Tensor()), DType::Float32)).backward());
  const std::vector<float> g2 = w.grad().to_vector<float>();
  for (std::size_t i = 0; i < g1.size(); ++i) CHECK(g2[i] == 2 * g1[i]);
}

TEST_CASE("autocast: a cast made under NoGradGuard does not cut a later forward's gradient") {
  // An evaluation forward under no_grad, then a training forward, in one region: the cast
  // cached without history must not be reused by the forward that needs gradients.
  // (PyTorch 1.13 reuses it and w silently gets no gradient; Phalanx does not copy that.)
  Tensor w = randn({4, 3}).requires_grad_();
  Tensor x = randn({2, 3});
  autocast guard(DType::BFloat16);
  {
    NoGradGuard ng;
    linear(x, w, Tensor());
  }
  Tensor y = linear(x, w, Tensor());
  REQUIRE(y.requires_grad());
  sum(to_dtype(y, DType::Float32)).backward();
  CHECK(w.grad().defined());
}

TEST_CASE("bf16 with a float32 0-dim tensor stays bf16 (PyTorch's dimensioned-first promotion)") {
  // torch 1.13: (x_bf16 * torch.tensor(2.0)).dtype == bfloat16; x_bf16 * torch.ones(1) is float32
  Tensor a = to_dtype(randn({4, 3}), DType::BFloat16).requires_grad_();
  Tensor s = full({}, 2.0f).requires_grad_();
  Tensor y = mul(a, s);
  CHECK(y.dtype() == DType::BFloat16);
  CHECK(add(s, a).dtype() == DType::BFloat16);
  CHECK(mul(a, ones({1})).dtype() == DType::Float32);
  CHECK(mul(to_dtype(s.detach(), DType::BFloat16), s.detach()).dtype() == DType::Float32);  // both 0-dim
  sum(to_dtype(y, DType::Float32)).backward();
  CHECK(a.grad().dtype() == DType::BFloat16);
  CHECK(s.grad().dtype() == DType::Float32);
}

TEST_CASE("in-place ops on a bf16 tensor: mul_, fill_, add_ keep bf16 and the right values") {
  Tensor h = to_dtype(full({5}, 1.5f), DType::BFloat16);
  h.mul_(2.0f);
  CHECK(h.dtype() == DType::BFloat16);
  for (float v : values(h)) CHECK(v == 3.0f);
  h.add_(to_dtype(full({5}, 1.0f), DType::BFloat16), 2.0f);
  for (float v : values(h)) CHECK(v == 5.0f);
  h.fill_(0.25);
  for (float v : values(h)) CHECK(v == 0.25f);
}

TEST_CASE("backward() from a bf16 one-element output: the implicit gradient is a bf16 one") {
  // torch seeds ones_like(y) in y's dtype; Phalanx seeds float32 ones, which the bf16 GEMM's
  // backward must take (the weight's gradient is x rounded to bf16, as float32).
  Tensor w = randn({1, 3}).requires_grad_();
  Tensor x = randn({1, 3});
  Tensor y;
  {
    autocast guard(DType::BFloat16);
    y = linear(x, w, Tensor());
  }
  REQUIRE(y.dtype() == DType::BFloat16);
  REQUIRE_NOTHROW(y.backward());
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == DType::Float32);
  const auto gx = values(to_dtype(x, DType::BFloat16)), gw = w.grad().to_vector<float>();
  for (std::size_t i = 0; i < gw.size(); ++i) CHECK(gw[i] == gx[i]);
}
