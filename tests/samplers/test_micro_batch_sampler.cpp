// MicroBatchSampler: the sample -> micro-batch assignment is the same on every world size.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

MicroBatchSampler make(std::int64_t n, std::int64_t b, std::int64_t m, int w, int r, bool shuffle, bool drop,
                       std::uint64_t seed = 7) {
  MicroBatchSamplerOptions o;
  o.global_batch = b;
  o.micro_batch = m;
  o.num_replicas = w;
  o.rank = r;
  o.shuffle = shuffle;
  o.drop_last = drop;
  o.seed = seed;
  return MicroBatchSampler(n, o);
}

// Micro-batch j of step t as the W-rank samplers hand it out: [step][j] -> samples.
std::vector<std::vector<std::vector<std::int64_t>>> assignment(std::int64_t n, std::int64_t b, std::int64_t m, int w,
                                                               bool shuffle, bool drop, std::int64_t epoch) {
  std::vector<std::vector<std::vector<std::int64_t>>> out;
  for (int r = 0; r < w; ++r) {
    auto s = make(n, b, m, w, r, shuffle, drop);
    s.set_epoch(epoch);
    const auto idx = s.indices();
    REQUIRE(static_cast<std::int64_t>(idx.size()) == s.size());
    REQUIRE(s.size() == s.steps_per_epoch() * s.micro_batches_per_rank() * m);
    out.resize(static_cast<std::size_t>(s.steps_per_epoch()),
               std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(b / m)));
    std::size_t pos = 0;
    for (std::int64_t t = 0; t < s.steps_per_epoch(); ++t)
      for (std::int64_t k = 0; k < s.micro_batches_per_rank(); ++k) {
        auto& slot = out[t][static_cast<std::size_t>(s.micro_batch_index(k))];
        CHECK(slot.empty());  // no two ranks compute the same micro-batch
        slot.assign(idx.begin() + pos, idx.begin() + pos + m);
        pos += static_cast<std::size_t>(m);
      }
  }
  return out;
}

}  // namespace

TEST_CASE("the union over ranks of their micro-batches is the one-worker assignment, for every W dividing B/M") {
  int compared = 0;
  for (std::int64_t n : {13, 48, 50, 97})
    for (auto [b, m] : {std::pair<std::int64_t, std::int64_t>{12, 2}, {24, 6}, {16, 4}, {8, 1}})
      for (bool shuffle : {false, true})
        for (bool drop : {false, true}) {
          if (drop && n < b) continue;
          for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
            CAPTURE(n);
            CAPTURE(b);
            CAPTURE(m);
            CAPTURE(shuffle);
            CAPTURE(drop);
            CAPTURE(epoch);
            const auto one = assignment(n, b, m, 1, shuffle, drop, epoch);
            for (int w : {2, 3, 4}) {
              if ((b / m) % w != 0) continue;
              CAPTURE(w);
              CHECK(assignment(n, b, m, w, shuffle, drop, epoch) == one);
              ++compared;
            }
          }
        }
  CHECK(compared > 150);
}

TEST_CASE("the padded order: DistributedSampler's order, repeated from its start or cut to a multiple of B") {
  for (bool shuffle : {false, true})
    for (std::int64_t epoch : {0, 1, 5}) {
      DistributedSampler base(10, DistributedSamplerOptions().num_replicas(1).rank(0).shuffle(shuffle).seed(7));
      base.set_epoch(epoch);
      const auto order = base.epoch_order();
      REQUIRE(order.size() == 10);

      auto pad = make(10, 8, 2, 2, 1, shuffle, false);  // 10 -> 16: the first 6 again
      pad.set_epoch(epoch);
      auto expect = order;
      expect.insert(expect.end(), order.begin(), order.begin() + 6);
      CHECK(pad.epoch_order() == expect);
      CHECK(pad.steps_per_epoch() == 2);

      auto cyc = make(10, 24, 4, 1, 0, shuffle, false);  // 10 -> 24: cyclic, past one repeat
      cyc.set_epoch(epoch);
      const auto c = cyc.epoch_order();
      REQUIRE(c.size() == 24);
      for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i] == order[i % 10]);

      auto cut = make(10, 4, 2, 2, 0, shuffle, true);  // 10 -> 8
      cut.set_epoch(epoch);
      CHECK(cut.epoch_order() == std::vector<std::int64_t>(order.begin(), order.begin() + 8));
      CHECK(cut.steps_per_epoch() == 2);
    }
}

TEST_CASE("each rank's share: contiguous blocks of micro-batches, step by step; epochs reshuffle") {
  auto s = make(16, 8, 2, 2, 1, false, false);  // K = 2: rank 1 owns micro-batches 2 and 3
  CHECK(s.micro_batches_per_step() == 4);
  CHECK(s.micro_batches_per_rank() == 2);
  CHECK(s.micro_batch_index(0) == 2);
  CHECK(s.micro_batch_index(1) == 3);
  CHECK(s.indices() == std::vector<std::int64_t>{4, 5, 6, 7, 12, 13, 14, 15});
  auto r = make(100, 10, 5, 1, 0, true, false);
  const auto e0 = r.indices();
  r.set_epoch(1);
  CHECK(r.indices() != e0);
  r.set_epoch(0);
  CHECK(r.indices() == e0);
}

TEST_CASE("bad shapes are one-line errors that say what to change") {
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(msg([] { make(10, 8, 3, 1, 0, true, false); }).find("micro-batch 3 does not divide the global batch 8") !=
        std::string::npos);
  CHECK(msg([] { make(10, 8, 2, 3, 0, true, false); }).find("3 workers do not divide the 4 micro-batches") !=
        std::string::npos);
  CHECK(msg([] { make(10, 16, 2, 1, 0, true, true); }).find("leaves no step") != std::string::npos);
  CHECK(msg([] { make(0, 8, 2, 1, 0, true, false); }).find("empty") != std::string::npos);
  CHECK(msg([] { make(10, 8, 0, 1, 0, true, false); }).find("micro-batch must be >= 1") != std::string::npos);
  CHECK(msg([] { make(10, 8, 2, 2, 2, true, false); }).find("rank 2 is outside [0, 2)") != std::string::npos);
  // B larger than N without drop_last: padded up to one whole step
  CHECK(make(5, 8, 2, 4, 3, false, false).indices() == std::vector<std::int64_t>{1, 2});
}
