// Learning-rate sequences against PyTorch 1.13's schedulers (within 1e-9).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

namespace {
std::vector<double> golden(const std::string& key) {
  const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/schedule_parity.npz");
  std::vector<double> out;
  for (std::int64_t bits : f.at(key).to_vector<std::int64_t>()) {
    double v;
    std::memcpy(&v, &bits, sizeof v);
    out.push_back(v);
  }
  return out;
}

template <typename Make>
void check_sequence(const std::string& key, Make make) {
  CAPTURE(key);
  Tensor p = zeros({1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions{0.4});
  auto sched = make(opt);
  std::vector<double> lrs{opt.param_groups()[0].lr()};
  for (int i = 0; i < 30; ++i) {
    sched->step();
    lrs.push_back(opt.param_groups()[0].lr());
  }
  const auto ref = golden(key);
  REQUIRE(ref.size() == lrs.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(lrs[i] - ref[i]) <= 1e-9 * std::max(1.0, std::abs(ref[i])));
  }
}
}  // namespace

TEST_CASE("LinearLR, StepLR, MultiStepLR, CosineAnnealingLR and SequentialLR match PyTorch") {
  using namespace optim;
  check_sequence("linear", [](Optimizer& o) { return std::make_unique<LinearLR>(o, 0.25, 1.0, 8); });
  check_sequence("step", [](Optimizer& o) { return std::make_unique<StepLR>(o, 5, 0.5); });
  check_sequence("multistep", [](Optimizer& o) {
    return std::make_unique<MultiStepLR>(o, std::vector<std::int64_t>{3, 7, 7, 12}, 0.3);
  });
  check_sequence("cosine", [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 10, 0.001); });
  check_sequence("warmup_cosine", [](Optimizer& o) {
    auto warm = std::make_shared<LinearLR>(o, 0.1, 1.0, 5);
    auto cos = std::make_shared<CosineAnnealingLR>(o, 20);
    return std::make_unique<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{warm, cos},
                                          std::vector<std::int64_t>{5});
  });
}

TEST_CASE("bad schedule arguments are rejected") {
  Tensor p = zeros({1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions{0.4});
  CHECK_THROWS_AS(optim::LinearLR(opt, 0.0), ValueError);
  CHECK_THROWS_AS(optim::StepLR(opt, 0), ValueError);
  CHECK_THROWS_AS(optim::CosineAnnealingLR(opt, 0), ValueError);
  auto a = std::make_shared<optim::StepLR>(opt, 2);
  CHECK_THROWS_AS(optim::SequentialLR(opt, {a}, {3}), ValueError);
}

namespace {
// Steps a schedule 25 times; at step `cut` saves the optimizer's and the schedule's state,
// rebuilds both from scratch, restores them and goes on. Returns every rate.
template <typename Make>
std::vector<double> run_with_restore(Make make, int cut) {
  Tensor p = zeros({1}).requires_grad_();
  auto opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions{0.4});
  auto sched = make(*opt);
  std::vector<double> lrs;
  for (int i = 0; i < 25; ++i) {
    if (i == cut) {
      const TensorMap os = opt->state_dict(), ss = sched->state_dict();
      opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions{0.4});
      sched = make(*opt);
      opt->load_state_dict(os);
      sched->load_state_dict(ss);
    }
    sched->step();
    lrs.push_back(opt->param_groups()[0].lr());
  }
  return lrs;
}
}  // namespace

TEST_CASE("a schedule restored from its state_dict continues bit for bit") {
  auto cosine = [](optim::Optimizer& o) { return std::make_unique<optim::CosineAnnealingLR>(o, 10, 0.01); };
  auto step = [](optim::Optimizer& o) { return std::make_unique<optim::StepLR>(o, 4, 0.5); };
  auto multi = [](optim::Optimizer& o) { return std::make_unique<optim::MultiStepLR>(o, std::vector<std::int64_t>{3, 9}, 0.3); };
  auto seq = [](optim::Optimizer& o) {
    auto w = std::make_shared<optim::LinearLR>(o, 0.25, 1.0, 5);
    auto c = std::make_shared<optim::CosineAnnealingLR>(o, 12);
    return std::make_unique<optim::SequentialLR>(o, std::vector<std::shared_ptr<optim::LRScheduler>>{w, c},
                                                 std::vector<std::int64_t>{5});
  };
  for (int cut : {1, 4, 7, 13}) {
    CAPTURE(cut);
    CHECK(run_with_restore(cosine, cut) == run_with_restore(cosine, -1));
    CHECK(run_with_restore(step, cut) == run_with_restore(step, -1));
    CHECK(run_with_restore(multi, cut) == run_with_restore(multi, -1));
    CHECK(run_with_restore(seq, cut) == run_with_restore(seq, -1));
  }
  // Without the restore the cosine schedule restarts: the test can tell the difference.
  Tensor p = zeros({1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions{0.4});
  optim::CosineAnnealingLR a(opt, 10);
  for (int i = 0; i < 6; ++i) a.step();
  CHECK(a.state_dict().at("last_epoch").item_int() == 6);
}

TEST_CASE("a scheduler state that does not fit is refused without changing anything") {
  Tensor p = zeros({1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions{0.4});
  optim::StepLR s(opt, 3);
  s.step();
  TensorMap bad = s.state_dict();
  bad.set("base_lrs", tensor(std::vector<std::int64_t>{1, 2}, {2}));
  CHECK_THROWS_WITH_AS(s.load_state_dict(bad), doctest::Contains("'base_lrs' must be 1"), ValueError);
  CHECK(s.last_epoch() == 1);
  TensorMap missing;
  CHECK_THROWS_WITH_AS(s.load_state_dict(missing), doctest::Contains("no 'last_epoch'"), ValueError);
}
