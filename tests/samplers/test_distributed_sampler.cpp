#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

namespace {
DistributedSampler make(std::int64_t n, int w, int r, bool shuffle, bool drop, std::uint64_t seed = 0) {
  return DistributedSampler(
      n, DistributedSamplerOptions().num_replicas(w).rank(r).shuffle(shuffle).drop_last(drop).seed(seed));
}
}  // namespace

TEST_CASE("index sets equal PyTorch's DistributedSampler (no shuffle) for many N, W, drop_last") {
  const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/sampler_parity.npz");
  int checked = 0;
  for (const auto& [key, expected] : f) {
    int n, w, d, r;
    REQUIRE(std::sscanf(key.c_str(), "n%d_w%d_d%d_r%d", &n, &w, &d, &r) == 4);
    CAPTURE(key);
    auto s = make(n, w, r, false, d != 0);
    CHECK(s.indices() == expected.to_vector<std::int64_t>());
    CHECK(s.size() == expected.numel());
    ++checked;
  }
  CHECK(checked > 400);
}

TEST_CASE("shuffled shards: disjoint before padding, cover the data, agree across ranks, change per epoch") {
  for (std::int64_t n : {10, 17, 64, 101})
    for (int w : {1, 2, 3, 4}) {
      CAPTURE(n);
      CAPTURE(w);
      std::vector<std::int64_t> prev_rank0;
      for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
        std::vector<std::int64_t> all;
        std::vector<std::int64_t> order0;
        for (int r = 0; r < w; ++r) {
          auto s = make(n, w, r, true, false, 42);
          s.set_epoch(epoch);
          if (r == 0) order0 = s.epoch_order();
          CHECK(s.epoch_order() == order0);  // every rank computes the same permutation
          auto idx = s.indices();
          CHECK(static_cast<std::int64_t>(idx.size()) == (n + w - 1) / w);
          all.insert(all.end(), idx.begin(), idx.end());
          if (r == 0) {
            if (epoch > 0) CHECK(idx != prev_rank0);
            prev_rank0 = idx;
          }
        }
        // the first n positions of the padded order are a permutation: disjoint and covering
        std::vector<std::int64_t> head(order0.begin(), order0.begin() + n);
        std::sort(head.begin(), head.end());
        for (std::int64_t i = 0; i < n; ++i) CHECK(head[i] == i);
        CHECK(std::set<std::int64_t>(all.begin(), all.end()).size() == static_cast<std::size_t>(n));
      }
    }
}

TEST_CASE("golden shuffled orders: the same on every platform and compiler") {
  CHECK(shuffled_order(10, 7, 0) == std::vector<std::int64_t>{2, 4, 7, 3, 6, 1, 9, 8, 5, 0});
  CHECK(shuffled_order(10, 7, 1) == std::vector<std::int64_t>{6, 8, 7, 9, 0, 4, 3, 2, 5, 1});
  auto big = shuffled_order(1000, 123, 5);
  CHECK(big[0] == 525);
  CHECK(big[500] == 455);
  CHECK(big[999] == 93);
}

TEST_CASE("for any W dividing B, the ranks' k-th local batches make positions [kB, (k+1)B)") {
  const std::int64_t n = 96;
  for (bool shuffle : {false, true})
    for (std::int64_t B : {12, 24, 48})
      for (int w : {1, 2, 3, 4, 6, 12}) {
        if (B % w) continue;
        CAPTURE(B);
        CAPTURE(w);
        const std::int64_t local = B / w;
        const auto order = make(n, w, 0, shuffle, false, 9).epoch_order();
        std::vector<std::vector<std::int64_t>> per_rank;
        for (int r = 0; r < w; ++r) per_rank.push_back(make(n, w, r, shuffle, false, 9).indices());
        for (std::int64_t k = 0; k < n / B; ++k) {
          std::multiset<std::int64_t> got, want(order.begin() + k * B, order.begin() + (k + 1) * B);
          for (int r = 0; r < w; ++r)
            got.insert(per_rank[r].begin() + k * local, per_rank[r].begin() + (k + 1) * local);
          CHECK(got == want);
        }
      }
}

TEST_CASE("BatchSampler groups indices") {
  auto s = std::make_shared<SequentialSampler>(10);
  BatchSampler keep(s, 4, false), drop(s, 4, true);
  CHECK(keep.num_batches() == 3);
  CHECK(keep.batches().back() == std::vector<std::int64_t>{8, 9});
  CHECK(drop.num_batches() == 2);
  CHECK(drop.batches().size() == 2);
  CHECK_THROWS_AS(BatchSampler(s, 0), ValueError);
}

TEST_CASE("bad configurations are clear errors") {
  CHECK_THROWS_WITH_AS(make(10, 4, 4, false, false), doctest::Contains("rank 4 is outside [0, 4)"), ValueError);
  CHECK_THROWS_AS(make(10, 4, -2, false, false), ValueError);
  CHECK_THROWS_AS(make(10, 0, 0, false, false), ValueError);
  CHECK_THROWS_AS(make(0, 2, 0, false, false), ValueError);
  CHECK_THROWS_WITH_AS(make(3, 4, 0, false, true), doctest::Contains("leaves every rank with 0 samples"),
                       ValueError);
  auto few = make(3, 4, 3, false, false);  // without drop_last, samples repeat to pad
  CHECK(few.indices() == std::vector<std::int64_t>{0});
}

TEST_CASE("defaults come from the default world (a world of one before init)") {
  DistributedSampler s(10);
  CHECK(s.num_replicas() == 1);
  CHECK(s.rank() == 0);
  set_default_world({1, 2});
  DistributedSampler t(10, DistributedSamplerOptions{});
  CHECK(t.num_replicas() == 2);
  CHECK(t.rank() == 1);
  // num_replicas given without rank, unlike the world: half the data would never be read
  CHECK_THROWS_WITH_AS(DistributedSampler(10, DistributedSamplerOptions().num_replicas(4)),
                       doctest::Contains("set both num_replicas and rank, or neither"), ConfigError);
  CHECK(DistributedSampler(10, DistributedSamplerOptions().num_replicas(2)).rank() == 1);  // agrees: fine
  CHECK(DistributedSampler(10, DistributedSamplerOptions().num_replicas(4).rank(3)).rank() == 3);
  set_default_world({0, 1});
}
