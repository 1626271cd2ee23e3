// A tied embedding / output weight (tests/support/tied_lm.hpp) under DDP: reduced once (one
// bucket slot), 2 forked ranks equal one process on the same global batch (AdamW,
// clip_grad_norm_), ZeRO owns it once and equals the replicated optimizer, exact mode is bit
// for bit on W = 1 and 2, and a checkpoint stores it under both of PyTorch's names and
// resumes bit-exactly.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "support/gradcheck.hpp"
#include "support/multirank.hpp"
#include "support/tied_lm.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;
using parallel::DDPOptions;

namespace {

constexpr std::int64_t kSamples = 128, kGlobal = 16;

std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> ps) {
  return std::make_unique<optim::AdamW>(std::move(ps), optim::AdamWOptions(2e-2).weight_decay(0.1));
}

/// Samples [begin, end) of step t's global batch (the data in order, epoch after epoch).
Tensor rows(const Tensor& t, std::int64_t step, std::int64_t begin, std::int64_t end) {
  const std::int64_t base = (step * kGlobal) % kSamples;
  return t.narrow_rows(base + begin, base + end);
}

/// `steps` steps; this rank takes part `rank` of `world` equal parts of each global batch.
void train(nn::Module& model, optim::Optimizer& opt, int rank, int world, int steps, int first_step = 0) {
  const TokenData d = make_tokens(kSamples);
  const std::int64_t per = kGlobal / world;
  for (int s = first_step; s < first_step + steps; ++s) {
    opt.zero_grad();
    cross_entropy(model.forward(rows(d.x, s, rank * per, (rank + 1) * per)), rows(d.y, s, rank * per, (rank + 1) * per))
        .backward();
    nn::clip_grad_norm_(model.parameters(), 0.5);
    opt.step();
  }
}

std::vector<Tensor> reference(int steps) {
  auto model = std::make_shared<TiedLM>();
  auto opt = adamw(model->parameters());
  train(*model, *opt, 0, 1, steps);
  return model->parameters();
}

std::string compare(const std::vector<Tensor>& got, const std::vector<Tensor>& want, double tol) {
  if (got.size() != want.size()) return detail::concat(got.size(), " parameters, want ", want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto a = got[i].to_vector<float>(), b = want[i].to_vector<float>();
    double worst = 0, scale = 1e-30;
    for (std::size_t j = 0; j < a.size(); ++j) {
      worst = std::max(worst, std::abs(static_cast<double>(a[j]) - b[j]));
      scale = std::max(scale, std::abs(static_cast<double>(b[j])));
    }
    if (worst / scale > tol) return detail::concat("parameter ", i, " relative error ", worst / scale, " > ", tol);
  }
  return "";
}

std::vector<char> bytes_of(const std::vector<Tensor>& ps) {
  std::vector<char> out;
  for (const auto& p : ps) {
    const auto v = p.to_vector<float>();
    const char* b = reinterpret_cast<const char*>(v.data());
    out.insert(out.end(), b, b + v.size() * sizeof(float));
  }
  return out;
}

}  // namespace

TEST_CASE("a tied weight under DDP on 2 forked ranks equals one process; ZeRO owns it once and agrees") {
  set_num_threads(1);
  const int steps = 12;
  const auto want = reference(steps);
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    auto pg = parallel::init_process_group();
    {
      // A tiny bucket cap: every parameter in a bucket of its own, the tied one in exactly one.
      DDPOptions o;
      o.bucket_cap_mb(64.0 / (1 << 20)).first_bucket_mb(64.0 / (1 << 20));
      DDP ddp(std::make_shared<TiedLM>(), pg, o);
      if (ddp.parameters().size() != 3) throw std::runtime_error("DDP sees the tied weight twice");
      std::vector<std::size_t> slots;
      for (const auto& b : ddp.bucket_layout()) slots.insert(slots.end(), b.begin(), b.end());
      std::sort(slots.begin(), slots.end());
      if (slots != std::vector<std::size_t>{0, 1, 2}) throw std::runtime_error("bucket slots are not 0, 1, 2 once each");
      auto opt = adamw(ddp.parameters());
      train(ddp, *opt, rank, 2, steps);
      const std::string err = compare(ddp.parameters(), want, 1e-5);
      if (!err.empty()) throw std::runtime_error("DDP: " + err);
    }
    {
      DDP ddp(std::make_shared<TiedLM>(), pg);
      parallel::ZeroRedundancyOptimizer zero(ddp.parameters(), adamw, pg);
      if (zero.shard(0).size() + zero.shard(1).size() != 3) throw std::runtime_error("ZeRO shards hold other than 3");
      train(ddp, zero, rank, 2, steps);
      const std::string err = compare(ddp.parameters(), want, 1e-5);
      if (!err.empty()) throw std::runtime_error("ZeRO: " + err);
    }
    return 0;
  }, std::chrono::seconds(120));
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
}

TEST_CASE("exact mode with a tied weight: W = 2 equals W = 1 bit for bit") {
  set_num_threads(1);
  constexpr std::int64_t kMicro = 2, kK = kGlobal / kMicro;
  auto run = [&](int W) {
    std::vector<std::vector<char>> out(W);
    auto store = std::make_shared<MemoryStore>();
    run_threads(W, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, W, store);
      DDPOptions o;
      o.exact().enabled = true;
      o.exact().global_batch = kGlobal;
      o.exact().micro_batch = kMicro;
      DDP ddp(std::make_shared<TiedLM>(), pg, o);
      auto opt = adamw(ddp.parameters());
      const TokenData d = make_tokens(kSamples);
      for (int s = 0; s < 6; ++s) {
        opt->zero_grad();
        for (std::int64_t m = rank * (kK / W); m < (rank + 1) * (kK / W); ++m)
          cross_entropy(ddp.forward(rows(d.x, s, m * kMicro, (m + 1) * kMicro)),
                        rows(d.y, s, m * kMicro, (m + 1) * kMicro))
              .backward();
        opt->step();
      }
      out[rank] = bytes_of(ddp.parameters());
    });
    for (int r = 1; r < W; ++r) REQUIRE(out[r] == out[0]);
    return out[0];
  };
  const auto one = run(1);
  CHECK(run(2) == one);
  // And close to normal mode on one process (exactness costs no accuracy).
  auto model = std::make_shared<TiedLM>();
  auto opt = adamw(model->parameters());
  const TokenData d = make_tokens(kSamples);
  for (int s = 0; s < 6; ++s) {
    opt->zero_grad();
    cross_entropy(model->forward(rows(d.x, s, 0, kGlobal)), rows(d.y, s, 0, kGlobal)).backward();
    opt->step();
  }
  const auto plain = bytes_of(model->parameters());
  REQUIRE(plain.size() == one.size());
  std::vector<float> a(one.size() / 4), b(one.size() / 4);
  std::memcpy(a.data(), one.data(), one.size());
  std::memcpy(b.data(), plain.data(), plain.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) <= 1e-5f * (1 + std::abs(b[i])));
}

TEST_CASE("a checkpoint of a tied model under DDP: both names stored, the resume is bit-exact") {
  set_num_threads(1);
  char path[] = "/tmp/phalanx_tied_ckpt_XXXXXX.npz";
  const int fd = ::mkstemps(path, 4);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::vector<std::vector<char>> straight(2), resumed(2);
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, std::make_shared<PrefixStore>("a", store));
    auto model = std::make_shared<TiedLM>();
    DDP ddp(model, pg);
    auto opt = adamw(ddp.parameters());
    train(ddp, *opt, rank, 2, 3);
    if (rank == 0) {
      parallel::CheckpointState s;
      s.model = ddp.state_dict();
      s.optimizer = opt->state_dict();
      s.step = 3;
      s.world_size = 2;
      parallel::save_checkpoint(path, s);
    }
    pg->barrier()->wait();
    train(ddp, *opt, rank, 2, 3, 3);
    straight[rank] = bytes_of(ddp.parameters());
  });
  const TensorMap file = load_npz(path);
  CHECK(file.contains("model.emb.weight"));
  CHECK(file.contains("model.head.weight"));
  CHECK(max_rel_err(file.at("model.emb.weight"), file.at("model.head.weight")) == 0);
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, std::make_shared<PrefixStore>("b", store));
    DDP ddp(std::make_shared<TiedLM>(99), pg);  // other initial weights: the checkpoint must replace them
    auto opt = adamw(ddp.parameters());
    parallel::CheckpointExpect expect;
    expect.world_size = 2;
    const TensorMap model_now = ddp.state_dict();
    expect.model = &model_now;
    const auto loaded = parallel::load_checkpoint(path, expect);
    ddp.load_state_dict(loaded.state.model);
    opt->load_state_dict(loaded.state.optimizer);
    train(ddp, *opt, rank, 2, 3, 3);
    resumed[rank] = bytes_of(ddp.parameters());
  });
  std::remove(path);
  CHECK(resumed[0] == straight[0]);
  CHECK(resumed[1] == straight[1]);
}
