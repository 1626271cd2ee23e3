// optim::GradScaler against PyTorch 1.13's GradScaler (scripts/fixtures/grad_scaler.py): the
// same 24 gradients with injected infs/NaNs give the same scale after every update, the same
// skipped steps and the same weights (SGD with momentum, Adam, unscale_ + clip_grad_norm_);
// the fused unscale-and-check kernel; the call-order errors; state_dict round trips.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "phalanx/core/finite.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

TensorMap fixture() { return load_npz(std::string(PHALANX_FIXTURES) + "/grad_scaler_parity.npz"); }

double bits_double(std::int64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

std::unique_ptr<optim::Optimizer> make(const std::string& run, std::vector<Tensor> ps) {
  if (run == "adam") return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions(0.01));
  return std::make_unique<optim::SGD>(std::move(ps), optim::SGDOptions(0.1).momentum(0.9));
}

optim::GradScalerOptions options_of(const TensorMap& f, const std::string& run) {
  const auto c = f.at(run + ".config").to_vector<std::int64_t>();
  return optim::GradScalerOptions()
      .init_scale(bits_double(c[0]))
      .growth_factor(bits_double(c[1]))
      .backoff_factor(bits_double(c[2]))
      .growth_interval(static_cast<std::int64_t>(bits_double(c[3])));
}

}  // namespace

TEST_CASE("GradScaler equals PyTorch's: scale after each update, skipped steps, weights within 1e-6") {
  const TensorMap f = fixture();
  for (const std::string run : {"sgd_momentum", "adam", "sgd_clip"}) {
    CAPTURE(run);
    std::vector<Tensor> ps{f.at("init.0").clone().requires_grad_(), f.at("init.1").clone().requires_grad_()};
    auto opt = make(run, ps);
    optim::GradScaler scaler(options_of(f, run));
    const float clip = f.at(run + ".clip").item();
    const auto want_scale = f.at(run + ".scale").to_vector<float>();
    const auto want_tracker = f.at(run + ".growth_tracker").to_vector<std::int64_t>();
    const auto want_stepped = f.at(run + ".stepped").to_vector<std::int64_t>();
    const int steps = static_cast<int>(want_scale.size());
    REQUIRE(steps == 24);
    int skipped = 0;
    for (int k = 0; k < steps; ++k) {
      CAPTURE(k);
      opt->zero_grad();
      const Tensor g0 = f.at("grad." + std::to_string(k) + ".0"), g1 = f.at("grad." + std::to_string(k) + ".1");
      const Tensor loss = sum(ps[0] * g0) + sum(ps[1] * g1);
      scaler.scale(loss).backward();
      if (clip > 0) {
        scaler.unscale_(*opt);
        nn::clip_grad_norm_(ps, clip);
      }
      const bool stepped = scaler.step(*opt);
      CHECK(stepped == (want_stepped[k] == 1));
      CHECK(scaler.found_inf(*opt) == !stepped);
      skipped += !stepped;
      scaler.update();
      CHECK(static_cast<float>(scaler.get_scale()) == want_scale[k]);
      CHECK(scaler.growth_tracker() == want_tracker[k]);
    }
    CHECK(skipped == 7);
    for (int i = 0; i < 2; ++i) CHECK(max_rel_err(ps[i], f.at(run + "." + std::to_string(i))) < 1e-6);
    // state_dict: PyTorch's keys and values.
    const TensorMap sd = scaler.state_dict();
    const auto want_sd = f.at(run + ".state_dict").to_vector<std::int64_t>();
    const auto want_ints = f.at(run + ".state_dict_ints").to_vector<std::int64_t>();
    CHECK(sd.at("scale").item_int() == want_sd[0]);
    CHECK(sd.at("growth_factor").item_int() == want_sd[1]);
    CHECK(sd.at("backoff_factor").item_int() == want_sd[2]);
    CHECK(sd.at("growth_interval").item_int() == want_ints[0]);
    CHECK(sd.at("_growth_tracker").item_int() == want_ints[1]);
  }
}

TEST_CASE("GradScaler: PyTorch's defaults; disabled is a pass-through") {
  optim::GradScaler s;
  CHECK(s.is_enabled());
  CHECK(s.get_scale() == 65536.0);
  CHECK(s.get_growth_factor() == 2.0);
  CHECK(s.get_backoff_factor() == 0.5);
  CHECK(s.get_growth_interval() == 2000);
  const Tensor loss = tensor(std::vector<float>{1.5f}, {});
  CHECK(s.scale(loss).item() == 1.5f * 65536.0f);

  optim::GradScaler off(optim::GradScalerOptions().enabled(false));
  CHECK_FALSE(off.is_enabled());
  CHECK(off.get_scale() == 1.0);
  CHECK(off.scale(loss).is_same(loss));
  CHECK(off.state_dict().size() == 0);
  Tensor p = tensor(std::vector<float>{1.f}, {1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions(1.0));
  p.set_grad(tensor(std::vector<float>{std::numeric_limits<float>::infinity()}, {1}));
  off.unscale_(opt);  // no-op
  CHECK(off.step(opt));  // steps whatever the gradient
  off.update();
  CHECK(std::isinf(p.to_vector<float>()[0]));

  CHECK_THROWS_AS(optim::GradScaler(optim::GradScalerOptions().growth_factor(1.0)), ValueError);
  CHECK_THROWS_AS(optim::GradScaler(optim::GradScalerOptions().backoff_factor(1.0)), ValueError);
  CHECK_THROWS_AS(optim::GradScaler(optim::GradScalerOptions().init_scale(0)), ValueError);
  // Positive in double, 0 in float32 (the scale's type): 1/scale would be inf.
  CHECK_THROWS_AS(optim::GradScaler(optim::GradScalerOptions().init_scale(1e-50)), ValueError);
  CHECK_THROWS_AS(optim::GradScaler(optim::GradScalerOptions().init_scale(1e39)), ValueError);
}

TEST_CASE("GradScaler: unscale_ twice, unscale_ after step, step twice, update first: errors as PyTorch's") {
  Tensor p = tensor(std::vector<float>{1.f, 2.f}, {2}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions(0.5));
  optim::GradScaler s(optim::GradScalerOptions().init_scale(4.0));
  CHECK_THROWS_WITH_AS(s.update(), doctest::Contains("no unscale_() or step()"), ValueError);
  p.set_grad(tensor(std::vector<float>{8.f, -4.f}, {2}));
  s.unscale_(opt);
  CHECK(p.grad().to_vector<float>() == std::vector<float>{2.f, -1.f});
  CHECK_THROWS_WITH_AS(s.unscale_(opt), doctest::Contains("already called"), ValueError);
  CHECK(s.step(opt));  // no second unscale: the gradients stay unscaled once
  CHECK(p.to_vector<float>() == std::vector<float>{0.f, 2.5f});
  CHECK_THROWS_WITH_AS(s.unscale_(opt), doctest::Contains("after step()"), ValueError);
  CHECK_THROWS_WITH_AS(s.step(opt), doctest::Contains("already called"), ValueError);
  s.update();
  // A second optimizer: one found inf among them backs off once for the step.
  Tensor q = tensor(std::vector<float>{1.f}, {1}).requires_grad_();
  optim::SGD opt2({q}, optim::SGDOptions(0.5));
  p.set_grad(tensor(std::vector<float>{4.f, 4.f}, {2}));
  q.set_grad(tensor(std::vector<float>{std::nanf("")}, {1}));
  CHECK(s.step(opt));
  CHECK_FALSE(s.step(opt2));
  CHECK(q.to_vector<float>()[0] == 1.f);
  s.update();
  CHECK(s.get_scale() == 2.0);
  CHECK(s.growth_tracker() == 0);
  // update(new_scale) sets the scale and keeps the tracker.
  p.set_grad(tensor(std::vector<float>{2.f, 2.f}, {2}));
  s.step(opt);
  s.update();
  CHECK(s.growth_tracker() == 1);
  p.set_grad(tensor(std::vector<float>{2.f, 2.f}, {2}));
  s.step(opt);
  s.update(1024.0);
  CHECK(s.get_scale() == 1024.0);
  CHECK(s.growth_tracker() == 1);
}

TEST_CASE("GradScaler: the scale never grows to an infinity; state_dict round trip; bad states refused") {
  optim::GradScaler s(optim::GradScalerOptions().init_scale(3e38).growth_interval(1));
  Tensor p = tensor(std::vector<float>{1.f}, {1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions(0.0));
  p.set_grad(tensor(std::vector<float>{1.f}, {1}));
  s.step(opt);
  s.update();
  CHECK(s.get_scale() == static_cast<double>(3e38f));
  CHECK(s.growth_tracker() == 0);

  optim::GradScaler a(optim::GradScalerOptions().init_scale(1000).growth_factor(3).backoff_factor(0.3).growth_interval(7));
  p.set_grad(tensor(std::vector<float>{std::numeric_limits<float>::infinity()}, {1}));
  a.step(opt);
  a.update();
  p.set_grad(tensor(std::vector<float>{1.f}, {1}));
  a.step(opt);
  a.update();
  optim::GradScaler b;
  b.load_state_dict(a.state_dict());
  CHECK(b.get_scale() == a.get_scale());
  CHECK(b.get_scale() == static_cast<double>(static_cast<float>(1000.0 * 0.3)));
  CHECK(b.get_growth_factor() == 3.0);
  CHECK(b.get_backoff_factor() == 0.3);
  CHECK(b.get_growth_interval() == 7);
  CHECK(b.growth_tracker() == 1);

  optim::GradScaler c;
  CHECK_THROWS_WITH_AS(c.load_state_dict(TensorMap{}), doctest::Contains("disabled GradScaler"), ValueError);
  TensorMap missing = a.state_dict();
  TensorMap partial;
  for (const auto& [k, t] : missing)
    if (k != "_growth_tracker") partial.set(k, t);
  CHECK_THROWS_WITH_AS(c.load_state_dict(partial), doctest::Contains("'_growth_tracker' is missing"), ValueError);
  CHECK(c.get_scale() == 65536.0);  // unchanged
  TensorMap tiny = a.state_dict();
  const double underflow = 1e-50;
  std::int64_t underflow_bits;
  std::memcpy(&underflow_bits, &underflow, sizeof underflow_bits);
  tiny.set("scale", tensor(std::vector<std::int64_t>{underflow_bits}, {}));
  CHECK_THROWS_WITH_AS(c.load_state_dict(tiny), doctest::Contains("positive finite float32"), ValueError);
  CHECK(c.get_scale() == 65536.0);
  optim::GradScaler off(optim::GradScalerOptions().enabled(false));
  off.load_state_dict(TensorMap{});  // a no-op when disabled, as PyTorch's
}

TEST_CASE("unscale_and_check_finite: one pass multiplies and finds an inf or NaN in the input, body or tail") {
  for (std::int64_t n : {1, 7, 16, 33, 100, 1025}) {
    CAPTURE(n);
    std::vector<float> v(n);
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 13) - 6.25f;
    std::vector<float> w = v;
    CHECK(unscale_and_check_finite(w.data(), n, 0.125f));
    for (std::int64_t i = 0; i < n; ++i) CHECK(w[i] == v[i] * 0.125f);
    for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
      for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), std::nanf("")}) {
        w = v;
        w[at] = bad;
        CHECK_FALSE(unscale_and_check_finite(w.data(), n, 0.5f));
      }
    }
    // Finite input, an infinite product (a factor > 1): the input was finite.
    w = v;
    w[0] = 3e38f;
    CHECK(unscale_and_check_finite(w.data(), n, 4.f));
    CHECK(std::isinf(w[0]));
    // A factor of 1 leaves the values alone.
    w = v;
    CHECK(unscale_and_check_finite(w.data(), n, 1.f));
    CHECK(w == v);
  }
}

TEST_CASE("GradScaler with an agreement: the agreed flag decides, one call per unscale_") {
  Tensor p = tensor(std::vector<float>{1.f}, {1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions(1.0));
  int calls = 0;
  bool other_rank_found = true;
  optim::GradScaler s(optim::GradScalerOptions().init_scale(2.0), [&](bool found) {
    ++calls;
    return found || other_rank_found;
  });
  p.set_grad(tensor(std::vector<float>{2.f}, {1}));
  CHECK_FALSE(s.step(opt));  // finite here, inf elsewhere: skipped
  CHECK(p.to_vector<float>()[0] == 1.f);
  s.update();
  CHECK(s.get_scale() == 1.0);
  other_rank_found = false;
  p.set_grad(tensor(std::vector<float>{2.f}, {1}));
  CHECK(s.step(opt));
  CHECK(p.to_vector<float>()[0] == -1.f);
  CHECK(calls == 2);
}

TEST_CASE("GradScaler: an agreement that throws leaves the gradients unscaled once and the step skipped") {
  Tensor p = tensor(std::vector<float>{1.f}, {1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions(1.0));
  int calls = 0;
  optim::GradScaler s(optim::GradScalerOptions().init_scale(4.0), [&](bool found) {
    if (++calls == 1) throw std::runtime_error("peer lost");  // a failed collective
    return found;
  });
  p.set_grad(tensor(std::vector<float>{8.f}, {1}));
  CHECK_THROWS_AS(s.unscale_(opt), std::runtime_error);
  CHECK(p.grad().to_vector<float>()[0] == 2.f);  // divided once
  CHECK_FALSE(s.step(opt));                        // no second division, no agreed flag: skipped
  CHECK(p.grad().to_vector<float>()[0] == 2.f);
  CHECK(p.to_vector<float>()[0] == 1.f);
  CHECK(calls == 1);
  s.update();
  CHECK(s.get_scale() == 2.0);
}
