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
