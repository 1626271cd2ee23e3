#include <doctest/doctest.h>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using optim::linear_scaling;
using optim::ScalingOptions;

TEST_CASE("the textbook's case: lr 0.1 at batch 64 becomes 0.4 at global batch 256 on 4 workers") {
  ScalingOptions o;
  o.base_lr = 0.1;
  o.base_batch = 64;
  o.global_batch = 256;
  o.world_size = 4;
  const auto p = linear_scaling(o);
  CHECK(p.lr == doctest::Approx(0.4));
  CHECK(p.scale == 4.0);
  CHECK(p.per_rank_batch == 64);
  CHECK(p.rank_batches == std::vector<std::int64_t>{64, 64, 64, 64});
  CHECK(p.warmup_steps == 0);
  CHECK(p.describe() == "global batch 256 = 4 x 64, lr x 4 = 0.4");
}

TEST_CASE("the world size alone never changes the rate") {
  ScalingOptions o;
  o.base_lr = 0.1;
  o.base_batch = 64;
  o.global_batch = 256;
  for (int w : {1, 2, 4, 8, 16}) {
    o.world_size = w;
    CHECK(linear_scaling(o).lr == doctest::Approx(0.4));
    CHECK(linear_scaling(o).per_rank_batch * w == 256);
  }
}

TEST_CASE("warmup in epochs becomes steps, only when the rate is scaled up") {
  ScalingOptions o;
  o.base_lr = 0.1;
  o.base_batch = 64;
  o.global_batch = 256;
  o.world_size = 4;
  o.warmup_epochs = 2;
  o.dataset_size = 1000;  // 4 steps per epoch (last one partial)
  auto p = linear_scaling(o);
  CHECK(p.steps_per_epoch == 4);
  CHECK(p.warmup_steps == 8);
  o.global_batch = 64;
  o.world_size = 2;
  CHECK(linear_scaling(o).warmup_steps == 0);
}

TEST_CASE("a world size that does not divide the global batch: error, or uneven shares") {
  ScalingOptions o;
  o.global_batch = 100;
  o.world_size = 3;
  CHECK_THROWS_WITH_AS(linear_scaling(o), doctest::Contains("does not divide the global batch 100"),
                       ValueError);
  o.remainder = optim::RemainderPolicy::Uneven;
  const auto p = linear_scaling(o);
  CHECK(p.rank_batches == std::vector<std::int64_t>{34, 33, 33});
  o.global_batch = 2;
  CHECK_THROWS_WITH_AS(linear_scaling(o), doctest::Contains("smaller than the world size"), ValueError);
  o.global_batch = 64;
  o.base_lr = 0;
  CHECK_THROWS_AS(linear_scaling(o), ValueError);
}
