// parallel::Join: uneven inputs (rank r gets r extra batches) complete and equal PyTorch
// 1.13's Join on the same split (tests/fixtures/join.npz, scripts/fixtures/join.py); with a
// ZeroRedundancyOptimizer as second joinable; throw_on_early_termination.
#include <doctest/doctest.h>

#include "support/gradcheck.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;

namespace {

const TensorMap& fixture() {
  static const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/join.npz");
  return f;
}

std::shared_ptr<nn::Sequential> join_model() {
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Linear>(8, 16));
  seq->push_back(std::make_shared<nn::Tanh>());
  seq->push_back(std::make_shared<nn::Linear>(16, 4));
  TensorMap init;
  for (const auto& [k, v] : fixture())
    if (k.rfind("init.", 0) == 0) init.set(k.substr(5), v);
  seq->load_state_dict(init);
  return seq;
}

/// Rank r's BASE + r batches: rows after those of the ranks before it.
std::vector<std::pair<Tensor, Tensor>> batches_of(int rank) {
  const std::int64_t base = fixture().at("base").item_int(), batch = fixture().at("batch").item_int();
  std::int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += (base + r) * batch;
  std::vector<std::pair<Tensor, Tensor>> out;
  for (std::int64_t i = 0; i < base + rank; ++i) {
    const std::int64_t lo = offset + i * batch;
    out.emplace_back(fixture().at("x").narrow_rows(lo, lo + batch), fixture().at("y").narrow_rows(lo, lo + batch));
  }
  return out;
}

ProcessGroupPtr group(int rank, int world, const std::shared_ptr<MemoryStore>& store, const char* prefix) {
  return make_thread_group("gloo", rank, world, std::make_shared<PrefixStore>(prefix, store),
                           std::chrono::seconds(20));
}

}  // namespace

TEST_CASE("Join with DDP on uneven inputs equals PyTorch 1.13's Join (W = 2, 3; RAII and callable)") {
  for (int W : {2, 3})
    for (bool callable : {false, true}) {
      CAPTURE(W);
      CAPTURE(callable);
      auto store = std::make_shared<MemoryStore>();
      std::vector<std::int64_t> shadowed(W, -1);
      CHECK_NOTHROW(run_threads(W, [&](int rank) {
        auto pg = group(rank, W, store, "join");
        DDP ddp(join_model(), pg);
        optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
        std::vector<float> losses;
        auto loop = [&] {
          for (auto& [x, y] : batches_of(rank)) {
            opt.zero_grad();
            Tensor loss = mse_loss(ddp.forward(x), y);
            loss.backward();
            opt.step();
            losses.push_back(loss.item());
          }
        };
        if (callable) {
          parallel::Join::run({&ddp}, loop);
        } else {
          parallel::Join join({&ddp});
          loop();
          join.finish();
          shadowed[rank] = join.shadowed_iterations();
        }
        const std::string pre = "w" + std::to_string(W) + ".rank" + std::to_string(rank) + ".";
        const auto want_loss = fixture().at(pre + "loss").to_vector<float>();
        REQUIRE_RANK(rank, want_loss.size() == losses.size(), "batches");
        for (std::size_t i = 0; i < losses.size(); ++i)
          REQUIRE_RANK(rank, std::abs(losses[i] - want_loss[i]) <= 1e-5 * (1 + std::abs(want_loss[i])),
                       detail::concat("loss ", i, ": ", losses[i], " vs PyTorch ", want_loss[i]));
        for (const auto& [name, p] : ddp.named_parameters()) {
          const double err = max_rel_err(p, fixture().at(pre + "final." + name));
          REQUIRE_RANK(rank, err <= 1e-5, detail::concat(name, " relative error ", err, " vs PyTorch"));
        }
      }));
      if (!callable)
        for (int r = 0; r < W; ++r) CHECK(shadowed[r] == W - 1 - r);  // rank r ran out W-1-r batches early
    }
}

TEST_CASE("Join with DDP and ZeroRedundancyOptimizer on uneven inputs completes; every rank ends equal") {
  const int W = 3;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<Tensor>> finals(W);
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "joinzero");
    DDP ddp(join_model(), pg);
    parallel::ZeroRedundancyOptimizer opt(
        ddp.parameters(),
        [](std::vector<Tensor> ps) { return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{1e-2}); },
        pg);
    {
      parallel::Join join({&ddp, &opt});
      for (auto& [x, y] : batches_of(rank)) {
        opt.zero_grad();
        mse_loss(ddp.forward(x), y).backward();
        opt.step();
      }
    }  // the destructor joins
    for (auto& p : ddp.parameters()) finals[rank].push_back(p.clone());
  }));
  for (int r = 1; r < W; ++r)
    for (std::size_t i = 0; i < finals[0].size(); ++i) CHECK(max_rel_err(finals[r][i], finals[0][i]) == 0.0);
}

TEST_CASE("Join with throw_on_early_termination: every rank throws once the first runs out") {
  const int W = 2;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::string> errors(W);
  run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "jointhrow");
    DDP ddp(join_model(), pg);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions{0.1});
    try {
      parallel::JoinOptions o;
      o.throw_on_early_termination = true;
      parallel::Join join({&ddp}, o);
      for (auto& [x, y] : batches_of(rank)) {
        opt.zero_grad();
        mse_loss(ddp.forward(x), y).backward();
        opt.step();
      }
      join.finish();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  });
  CHECK(errors[0].find("rank 0 exhausted all inputs") != std::string::npos);
  CHECK(errors[1].find("at least one rank exhausted") != std::string::npos);
}

TEST_CASE("Join: bad input is a one-line error") {
  CHECK_THROWS_WITH_AS(parallel::Join({}), doctest::Contains("list of joinables is empty"), ValueError);
}

TEST_CASE("Join: a rank with no batch at all shadows every iteration; ranks end equal") {
  const int W = 2;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<Tensor>> finals(W);
  std::vector<std::int64_t> shadowed(W);
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "joinnone");
    DDP ddp(join_model(), pg);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
    parallel::Join join({&ddp});
    if (rank == 1)
      for (auto& [x, y] : batches_of(rank)) {
        opt.zero_grad();
        mse_loss(ddp.forward(x), y).backward();
        opt.step();
      }
    join.finish();
    shadowed[rank] = join.shadowed_iterations();
    for (auto& p : ddp.parameters()) finals[rank].push_back(p.clone());
  }));
  CHECK(shadowed[0] == 3);
  CHECK(shadowed[1] == 0);
  for (std::size_t i = 0; i < finals[0].size(); ++i) CHECK(max_rel_err(finals[1][i], finals[0][i]) == 0.0);
}

TEST_CASE("DDP on uneven inputs without Join: the rank left running gets a PeerFinishedError naming Join, fast") {
  // Rank 1 runs out after 3 batches and destroys its group; rank 0 goes on to a 4th.
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port, "gloo");
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions o;
    o.timeout = std::chrono::seconds(20);  // the end must be seen long before this
    parallel::init_process_group(o);
    DDP ddp(join_model());
    const auto batches = batches_of(2);  // 4 batches (BASE + 2), the same on both ranks
    const int steps = rank == 0 ? 4 : 3;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < steps; ++i) {
        ddp.zero_grad();
        mse_loss(ddp.forward(batches[i].first), batches[i].second).backward();
      }
    } catch (const PeerFinishedError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "rank %d (%.3f s in): %s\n", rank, s, e.what());
      const std::string what = e.what();
      if (rank != 0 || what.find("rank 1 finished") == std::string::npos ||
          what.find("parallel::Join") == std::string::npos)
        return 4;
      return s < 10.0 ? 0 : 5;
    }
    if (rank == 0) return 6;  // the 4th step cannot complete
    parallel::destroy_process_group();
    return 0;
  }, std::chrono::seconds(60));
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
}
