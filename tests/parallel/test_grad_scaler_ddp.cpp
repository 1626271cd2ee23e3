// GradScaler on 2 forked workers (gloo over loopback): DDP with a hook that does not reduce
// (each rank keeps its own gradients, as when a compression hook, exact mode's sums or a
// sharded optimizer leave an inf on one rank only), the same batches on both ranks, and an
// inf written into rank 1's gradients alone at some steps. With parallel::found_inf_agreement
// both ranks skip the same steps, keep the same scale and end with bit-identical weights;
// without it (the control) rank 0 steps where rank 1 skips and the replicas diverge.
#include <doctest/doctest.h>

#include <cstring>
#include <limits>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

// Leaves each rank's gradients as they are: nothing is reduced.
class NoReduceHook : public parallel::CommHook {
 public:
  std::string name() const override { return "no_reduce"; }
  void launch(ProcessGroup&, parallel::GradBucket&) override {}
  void finish(ProcessGroup&, parallel::GradBucket&) override {}
};

constexpr int kSteps = 12;
bool inf_step(int s) { return s == 3 || s == 7 || s == 8; }

// Trains kSteps; returns 0 when the replicas agree (same skipped steps, same scale, weights
// equal bit for bit), 2 when they differ, 1 on an error.
int train(int rank, int port, bool agree) {
  set_rank_env(rank, 2, port);
  ::setenv("PHALANX_STORE_HOSTED", "1", 1);
  auto pg = parallel::init_process_group();
  int code = 0;
  {
    Generator gen(7);
    parallel::DDP ddp(nn::mlp({6, 8, 3}, "relu", &gen), pg);
    ddp.register_comm_hook(std::make_shared<NoReduceHook>());
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.05).momentum(0.9));
    optim::GradScaler scaler(optim::GradScalerOptions().init_scale(1024).growth_interval(2),
                             agree ? parallel::found_inf_agreement(pg) : nullptr);
    Generator data(11);  // the same batches on both ranks
    std::vector<float> skipped(kSteps, 0.f), scales(kSteps);  // fixed shapes: both ranks compare the same
    for (int s = 0; s < kSteps; ++s) {
      const Tensor x = randn({4, 6}, &data), y = randint(3, {4}, &data);
      opt.zero_grad();
      scaler.scale(cross_entropy(ddp.forward(x), y)).backward();
      if (rank == 1 && inf_step(s)) ddp.parameters()[0].grad().data<float>()[1] = std::numeric_limits<float>::infinity();
      if (!scaler.step(opt)) skipped[s] = 1.f;
      scaler.update();
      scales[s] = static_cast<float>(scaler.get_scale());
    }
    if (agree)
      for (int s = 0; s < kSteps; ++s)
        if ((skipped[s] != 0.f) != inf_step(s))
          throw std::runtime_error(detail::concat("rank ", rank, ": step ", s, (skipped[s] != 0.f ? " skipped" : " taken")));
    // Rank 0's record and weights against this rank's, bit for bit.
    std::vector<Tensor> mine{tensor(skipped, {kSteps}), tensor(scales, {kSteps})};
    for (const Tensor& p : ddp.parameters()) mine.push_back(p.detach().clone());
    for (const Tensor& t : mine) {
      Tensor theirs = t.clone();
      pg->broadcast(theirs, 0)->wait();
      if (std::memcmp(theirs.raw_data(), t.raw_data(), t.nbytes()) != 0) code = 2;
    }
    // Rank 1 compared; rank 0 compared with itself: both report rank 1's finding.
    Tensor verdict = tensor(std::vector<float>{static_cast<float>(code)}, {1});
    pg->allreduce(verdict, ReduceOp::Max)->wait();
    code = static_cast<int>(verdict.item());
  }
  parallel::destroy_process_group();
  return code;
}

std::vector<ProcResult> run(bool agree) {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  return run_processes(2, [&](int rank) { return train(rank, port, agree); }, std::chrono::seconds(60));
}

}  // namespace

TEST_CASE("GradScaler, 2 workers, an inf on rank 1 only: with the agreement both skip the same steps, weights bit-identical") {
  const auto r = run(true);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(r[rank].signal == 0);
    CHECK(r[rank].exit_code == 0);
  }
}

TEST_CASE("GradScaler, 2 workers, an inf on rank 1 only: without the agreement the replicas diverge (the control)") {
  const auto r = run(false);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(r[rank].signal == 0);
    CHECK(r[rank].exit_code == 2);
  }
}

namespace {

// Uneven inputs under parallel::Join: rank 0 has 3 batches, rank 1 has 6, an inf on rank 1
// at step 4. Rank 0 joins after its 3rd step and shadows the others' collectives; rank 1's
// found-inf allreduces must be shadowed too, or they meet Join's "still training" count.
// Returns 0 when rank 1 skipped exactly step 4 and each rank's scale is as expected. Without
// the agreement among the joinables, rank 1's found-inf allreduce after its 3rd step meets
// rank 0's "still training" count and both hang.
int train_uneven(int rank, int port) {
  set_rank_env(rank, 2, port);
  ::setenv("PHALANX_STORE_HOSTED", "1", 1);
  auto pg = parallel::init_process_group();
  int code = 0;
  {
    Generator gen(7);
    parallel::DDP ddp(nn::mlp({6, 8, 3}, "relu", &gen), pg);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.05));
    auto agree = std::make_shared<parallel::ScalerAgreement>(pg);
    optim::GradScaler scaler(optim::GradScalerOptions().init_scale(1024).growth_interval(2),
                             parallel::found_inf_agreement(agree));
    Generator data(11 + rank);
    const int steps = rank == 0 ? 3 : 6;
    {
      parallel::Join join({&ddp, agree.get()});
      for (int s = 0; s < steps; ++s) {
        const Tensor x = randn({4, 6}, &data), y = randint(3, {4}, &data);
        opt.zero_grad();
        scaler.scale(cross_entropy(ddp.forward(x), y)).backward();
        if (rank == 1 && s == 4) ddp.parameters()[0].grad().data<float>()[1] = std::numeric_limits<float>::infinity();
        const bool stepped = scaler.step(opt);
        scaler.update();
        if (stepped != !(rank == 1 && s == 4)) code = 2;
      }
      join.finish();
    }
    // Rank 1: x2 after steps 1 and 3, x0.5 at 4: 2048; rank 0: x2 after step 1: 2048.
    if (scaler.get_scale() != 2048.0) code = 3;
  }
  parallel::destroy_process_group();
  return code;
}

}  // namespace

TEST_CASE("GradScaler under Join (uneven inputs): the joined rank shadows the found-inf allreduce, no hang") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto r = run_processes(2, [&](int rank) { return train_uneven(rank, port); }, std::chrono::seconds(20));
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(r[rank].signal == 0);
    CHECK(r[rank].exit_code == 0);
  }
}

TEST_CASE("ScalerAgreement listed before the DDP in a Join: one clear ValueError on every rank, no hang") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto r = run_processes(
      2,
      [&](int rank) {
        set_rank_env(rank, 2, port);
        ::setenv("PHALANX_STORE_HOSTED", "1", 1);
        auto pg = parallel::init_process_group();
        int code = 1;
        {
          Generator gen(7);
          parallel::DDP ddp(nn::mlp({6, 8, 3}, "relu", &gen), pg);
          optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.05));
          auto agree = std::make_shared<parallel::ScalerAgreement>(pg);
          optim::GradScaler scaler({}, parallel::found_inf_agreement(agree));
          Generator data(11);
          try {
            parallel::Join join({agree.get(), &ddp});
            scaler.scale(cross_entropy(ddp.forward(randn({4, 6}, &data)), randint(3, {4}, &data))).backward();
            scaler.step(opt);
          } catch (const ValueError& e) {
            if (std::string(e.what()).find("list the DDP first") != std::string::npos) code = 0;
          }
        }
        parallel::destroy_process_group();
        return code;
      },
      std::chrono::seconds(20));
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(r[rank].signal == 0);
    CHECK(r[rank].exit_code == 0);
  }
}
