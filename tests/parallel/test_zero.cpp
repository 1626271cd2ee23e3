// parallel::ZeroRedundancyOptimizer (ZeRO stage 1): W = 2, 3 weights equal plain DDP with the
// replicated optimizer (SGD momentum, Adam, AdamW; AdamW with two groups); the consolidated
// state dict equals the replicated optimizer's and loads back; state bytes per rank on 4 ranks; the partition.
#include <doctest/doctest.h>

#include <cstdio>
#include <type_traits>

#include "support/gradcheck.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;
using parallel::ZeroRedundancyOptimizer;

namespace {

std::shared_ptr<nn::Module> model(std::vector<std::int64_t> sizes = {16, 32, 32, 5}) {
  Generator g(3);
  return nn::mlp(sizes, "relu", &g);
}

parallel::OptimizerFactory factory(const std::string& kind) {
  return [kind](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
    if (kind == "sgd") return std::make_unique<optim::SGD>(std::move(ps), optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
    if (kind == "adam") return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions(1e-2).weight_decay(0.05));
    return std::make_unique<optim::AdamW>(std::move(ps), optim::AdamWOptions(1e-2).weight_decay(0.05));
  };
}

void train(DDP& ddp, optim::Optimizer& opt, int rank, int world, int steps) {
  Generator g(100 + rank);
  for (int s = 0; s < steps; ++s) {
    const Tensor x = randn({6, 16}, &g), y = randint(5, {6}, &g);
    opt.zero_grad();
    cross_entropy(ddp.forward(x), y).backward();
    opt.step();
  }
  (void)world;
}

ProcessGroupPtr group(int rank, int world, const std::shared_ptr<MemoryStore>& store, const std::string& prefix) {
  return make_thread_group("gloo", rank, world, std::make_shared<PrefixStore>(prefix, store),
                           std::chrono::seconds(20));
}

}  // namespace

TEST_CASE("ZeRO W = 2, 3: weights equal plain DDP; consolidated state equals the replicated optimizer's") {
  for (const std::string kind : {"sgd", "adam", "adamw"})
    for (int W : {2, 3}) {
      CAPTURE(kind);
      CAPTURE(W);
      auto store = std::make_shared<MemoryStore>();
      CHECK_NOTHROW(run_threads(W, [&](int rank) {
        auto pg = group(rank, W, store, "zero");
        DDP plain(model(), pg);
        auto replicated = factory(kind)(plain.parameters());
        train(plain, *replicated, rank, W, 5);

        DDP ddp(model(), pg);
        ZeroRedundancyOptimizer zero(ddp.parameters(), factory(kind), pg);
        train(ddp, zero, rank, W, 5);
        const auto a = plain.parameters(), b = ddp.parameters();
        for (std::size_t i = 0; i < a.size(); ++i) {
          const double err = max_rel_err(b[i], a[i]);
          REQUIRE_RANK(rank, err <= 1e-6, detail::concat("parameter ", i, " relative error ", err));
          REQUIRE_RANK(rank, zero.owner_of(i) >= 0 && zero.owner_of(i) < W, "owner");
        }
        // Only the owner holds state for a parameter.
        REQUIRE_RANK(rank, zero.state_bytes() < parallel::optimizer_state_bytes(*replicated), "sharded state");

        zero.consolidate_state_dict(1);
        if (rank != 1) {
          bool threw = false;
          try {
            zero.state_dict();
          } catch (const ValueError& e) {
            threw = std::string(e.what()).find("consolidate_state_dict") != std::string::npos;
          }
          REQUIRE_RANK(rank, threw, "state_dict() off the consolidating rank says what to do");
          return;
        }
        const TensorMap got = zero.state_dict(), want = replicated->state_dict();
        REQUIRE_RANK(rank, got.size() == want.size(), detail::concat(got.size(), " keys vs ", want.size()));
        for (const auto& [k, v] : want) {
          const Tensor* g = got.find(k);
          REQUIRE_RANK(rank, g != nullptr, "missing key " + k);
          if (v.dtype() == DType::Int64)
            REQUIRE_RANK(rank, g->item_int() == v.item_int(), "key " + k);
          else
            REQUIRE_RANK(rank, max_rel_err(*g, v) <= 1e-6, "key " + k);
        }
        // The full state loads into a fresh replicated optimizer and into a fresh ZeRO-free copy.
        auto fresh = factory(kind)(model()->parameters());
        fresh->load_state_dict(got);
      }));
    }
}

TEST_CASE("ZeRO: load_state_dict of the full state, then steps equal the replicated optimizer's") {
  const int W = 2;
  auto store = std::make_shared<MemoryStore>();
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "zeroload");
    DDP plain(model(), pg);
    auto replicated = factory("adam")(plain.parameters());
    train(plain, *replicated, rank, W, 3);
    const TensorMap state = replicated->state_dict();
    DDP ddp(model(), pg);
    {  // same weights as the trained plain model
      NoGradGuard ng;
      for (std::size_t i = 0; i < plain.parameters().size(); ++i) ddp.parameters()[i].copy_(plain.parameters()[i]);
    }
    ZeroRedundancyOptimizer zero(ddp.parameters(), factory("adam"), pg);
    zero.load_state_dict(state);
    train(plain, *replicated, rank + 10, W, 2);
    train(ddp, zero, rank + 10, W, 2);
    for (std::size_t i = 0; i < plain.parameters().size(); ++i)
      REQUIRE_RANK(rank, max_rel_err(ddp.parameters()[i], plain.parameters()[i]) <= 1e-6, detail::concat("param ", i));
  }));
}

TEST_CASE("ZeRO with two parameter groups (nanoGPT's AdamW): weights, state and reload equal the replicated") {
  // Group 0 (the weights) decays, group 1 (the biases) has weight decay 0 and its own lr, as
  // PyTorch's ZeroRedundancyOptimizer([{"params": ...}, {"params": ..., ...}]).
  const auto split = [](const std::vector<Tensor>& ps) {
    std::vector<parallel::ZeroGroup> g(2);
    for (const Tensor& p : ps) g[p.dim() == 2 ? 0 : 1].params.push_back(p);
    g[1].overrides = {{"weight_decay", 0.0}, {"lr", 3e-2}};
    return g;
  };
  const auto replicated_of = [&](const std::vector<Tensor>& ps) {
    auto g = split(ps);
    auto opt = factory("adamw")(g[0].params);
    opt->add_param_group(g[1].params, g[1].overrides);
    return opt;
  };
  for (int W : {2, 3}) {
    CAPTURE(W);
    auto store = std::make_shared<MemoryStore>();
    CHECK_NOTHROW(run_threads(W, [&](int rank) {
      auto pg = group(rank, W, store, "zerogroups");
      DDP plain(model(), pg);
      auto replicated = replicated_of(plain.parameters());
      train(plain, *replicated, rank, W, 5);
      DDP ddp(model(), pg);
      ZeroRedundancyOptimizer zero(split(ddp.parameters()), factory("adamw"), pg);
      REQUIRE_RANK(rank, zero.param_groups().size() == 2, "two groups");
      REQUIRE_RANK(rank, zero.param_groups()[1].options.at("weight_decay") == 0.0, "group 1's override");
      train(ddp, zero, rank, W, 5);
      // The replicated optimizer numbers parameters group by group: compare in that order.
      const auto a = split(plain.parameters()), b = split(ddp.parameters());
      for (int g = 0; g < 2; ++g)
        for (std::size_t i = 0; i < a[g].params.size(); ++i)
          REQUIRE_RANK(rank, max_rel_err(b[g].params[i], a[g].params[i]) <= 1e-6,
                       detail::concat("group ", g, " parameter ", i));
      zero.consolidate_state_dict(0);
      if (rank != 0) return;
      const TensorMap got = zero.state_dict(), want = replicated->state_dict();
      REQUIRE_RANK(rank, got.size() == want.size(), detail::concat(got.size(), " keys vs ", want.size()));
      for (const auto& [k, v] : want) {
        const Tensor* t = got.find(k);
        REQUIRE_RANK(rank, t != nullptr, "missing key " + k);
        if (v.dtype() == DType::Int64)
          REQUIRE_RANK(rank, t->item_int() == v.item_int(), "key " + k);
        else
          REQUIRE_RANK(rank, max_rel_err(*t, v) <= 1e-6, "key " + k);
      }
    }));
  }
  // Reload: a fresh grouped ZeRO takes the replicated state and steps on equal to it.
  const int W = 2;
  auto store = std::make_shared<MemoryStore>();
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "zerogroupsload");
    DDP plain(model(), pg);
    auto replicated = replicated_of(plain.parameters());
    train(plain, *replicated, rank, W, 3);
    DDP ddp(model(), pg);
    {
      NoGradGuard ng;
      for (std::size_t i = 0; i < plain.parameters().size(); ++i) ddp.parameters()[i].copy_(plain.parameters()[i]);
    }
    ZeroRedundancyOptimizer zero(split(ddp.parameters()), factory("adamw"), pg);
    zero.load_state_dict(replicated->state_dict());
    train(plain, *replicated, rank + 10, W, 2);
    train(ddp, zero, rank + 10, W, 2);
    for (std::size_t i = 0; i < plain.parameters().size(); ++i)
      REQUIRE_RANK(rank, max_rel_err(ddp.parameters()[i], plain.parameters()[i]) <= 1e-6, detail::concat("param ", i));
  }));
}

TEST_CASE("ZeRO on 4 ranks: optimizer state per rank <= 0.3x the replicated optimizer's (Adam)") {
  const int W = 4;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::size_t> bytes(W);
  std::size_t full = 0;
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "zerobytes");
    DDP ddp(model({16, 64, 64, 64, 64, 64, 64, 64, 64, 64, 5}), pg);  // eight 64x64 weights: two per rank
    ZeroRedundancyOptimizer zero(ddp.parameters(), factory("adam"), pg);
    train(ddp, zero, rank, W, 1);
    bytes[rank] = zero.state_bytes();
    if (rank == 0) {
      auto replicated = factory("adam")(ddp.parameters());
      for (auto& p : ddp.parameters()) p.set_grad(zeros(p.shape()));
      replicated->step();
      full = parallel::optimizer_state_bytes(*replicated);
    }
  }));
  std::size_t worst = 0;
  for (int r = 0; r < W; ++r) worst = std::max(worst, bytes[r]);
  const double ratio = static_cast<double>(worst) / static_cast<double>(full);
  std::printf("ZeRO on 4 ranks (Adam): state bytes per rank %zu %zu %zu %zu, replicated %zu, worst ratio %.3f\n",
              bytes[0], bytes[1], bytes[2], bytes[3], full, ratio);
  CHECK(ratio <= 0.3);
  CHECK(ratio >= 0.2);  // the state really is split, not dropped
}

TEST_CASE("ZeRO's partition is PyTorch's greedy one: largest first, to the rank with the fewest elements") {
  const int W = 2;
  auto store = std::make_shared<MemoryStore>();
  run_threads(W, [&](int rank) {
    auto pg2 = group(rank, W, store, "zeropart");
    // sizes 10, 40, 30, 20 -> 40: r0, 30: r1, 20: r1 (30 < 40), 10: r0 (40 < 50)
    std::vector<Tensor> ps;
    for (std::int64_t n : {10, 40, 30, 20}) ps.push_back(zeros({n}).requires_grad_());
    ZeroRedundancyOptimizer zero(ps, factory("sgd"), pg2);
    REQUIRE_RANK(rank, (zero.shard(0) == std::vector<std::size_t>{0, 1}), "rank 0's shard");
    REQUIRE_RANK(rank, (zero.shard(1) == std::vector<std::size_t>{2, 3}), "rank 1's shard");
  });
}

TEST_CASE("all_reduce_scalar: sum, avg, max of a double; exact int64; Avg of an integer refused") {
  const int W = 3;
  auto store = std::make_shared<MemoryStore>();
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "scalar");
    const Device cpu = Device::cpu();
    REQUIRE_RANK(rank, parallel::all_reduce_scalar(rank + 0.5, ReduceOp::Sum, pg, cpu) == 4.5, "sum");
    REQUIRE_RANK(rank, parallel::all_reduce_scalar(rank + 0.5, ReduceOp::Avg, pg, cpu) == 1.5, "avg");
    REQUIRE_RANK(rank, parallel::all_reduce_scalar(-rank * 2.0, ReduceOp::Max, pg, cpu) == 0.0, "max");
    const std::int64_t big = (std::int64_t{1} << 53) + 1;  // not a double
    REQUIRE_RANK(rank, parallel::all_reduce_scalar(big + rank, ReduceOp::Sum, pg, cpu) == 3 * big + 3, "int64 sum");
    // an int counter and a size_t count take the exact integer path (no ambiguity)
    const int correct = rank + 1;
    const std::size_t seen = 10;
    REQUIRE_RANK(rank, parallel::all_reduce_scalar(correct, ReduceOp::Sum, pg, cpu) == 6, "int sum");
    REQUIRE_RANK(rank, parallel::all_reduce_scalar(seen, ReduceOp::Max, pg, cpu) == 10, "size_t max");
    static_assert(std::is_same_v<decltype(parallel::all_reduce_scalar(correct)), std::int64_t>);
    bool refused = false;
    try {
      parallel::all_reduce_scalar(std::int64_t{1}, ReduceOp::Avg, pg, cpu);
    } catch (const ValueError& e) {
      refused = std::string(e.what()).find("pass a double") != std::string::npos;
    }
    REQUIRE_RANK(rank, refused, "Avg of an integer");
  }));
}
