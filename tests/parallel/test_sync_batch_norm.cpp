// parallel::SyncBatchNorm: W = 2, 4 ranks (uneven batches, an empty one) equal one process's
// BatchNorm on the global batch (output, input/weight/bias gradients, running stats) within
// 1e-5; the same on sim tensors at W = 2; eval mode; convert_sync_batchnorm; under Join with
// DDP, a joined rank shadows SyncBatchNorm's reductions with zero counts.
// bf16 input (autocast): float32 statistics, bf16 output and input gradient.
#include <doctest/doctest.h>

#include <phalanx/core/half.hpp>

#include "support/gradcheck.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;
using parallel::SyncBatchNorm;

namespace {

ProcessGroupPtr group(int rank, int world, const std::shared_ptr<MemoryStore>& store, const std::string& prefix) {
  return make_thread_group("gloo", rank, world, std::make_shared<PrefixStore>(prefix, store),
                           std::chrono::seconds(20));
}

/// Rows [begin, end) of x along dim 0 (a copy, so it can be a leaf).
Tensor rows(const Tensor& x, std::int64_t begin, std::int64_t end) { return x.narrow_rows(begin, end).clone(); }

double rel(const Tensor& a, const Tensor& b) { return max_rel_err(a.to(Device::cpu()), b.to(Device::cpu())); }

struct Reference {
  std::vector<Tensor> out, grad_x;  // per step
  Tensor grad_w, grad_b, running_mean, running_var;
};

/// One process, BatchNorm on the global batch, `steps` forward/backward with upstream g.
Reference reference(const Tensor& x, const Tensor& g, int steps, std::int64_t C) {
  nn::BatchNorm bn(C, 1e-5, 0.1);
  Reference r;
  for (int s = 0; s < steps; ++s) {
    Tensor xs = x.clone().requires_grad_();
    bn.zero_grad();
    Tensor y = bn.forward(xs);
    sum(y * g).backward();
    r.out.push_back(y.detach());
    r.grad_x.push_back(xs.grad());
  }
  r.grad_w = bn.weight.grad();
  r.grad_b = bn.bias.grad();
  r.running_mean = bn.running_mean.clone();
  r.running_var = bn.running_var.clone();
  return r;
}

void check_world(int W, const std::vector<std::int64_t>& split, const Shape& shape, Device device) {
  Generator gen(7);
  const Tensor x = randn(shape, &gen) * 2.f + 0.5f, g = randn(shape, &gen);
  const std::int64_t C = shape[1];
  const Reference want = reference(x, g, 2, C);
  std::vector<std::int64_t> begin(W + 1, 0);
  for (int r = 0; r < W; ++r) begin[r + 1] = begin[r] + split[r];
  REQUIRE(begin[W] == shape[0]);
  auto store = std::make_shared<MemoryStore>();
  run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "sbn");
    SyncBatchNorm bn(C, 1e-5, 0.1, true, true, pg);
    bn.to(device);
    const Tensor xr = rows(x, begin[rank], begin[rank + 1]).to(device);
    const Tensor gr = rows(g, begin[rank], begin[rank + 1]).to(device);
    for (int s = 0; s < 2; ++s) {
      Tensor xs = xr.clone().requires_grad_();
      bn.zero_grad();
      Tensor y = bn.forward(xs);
      sum(y * gr).backward();
      if (split[rank] == 0) continue;
      const double eo = rel(y, rows(want.out[s], begin[rank], begin[rank + 1]));
      const double eg = rel(xs.grad(), rows(want.grad_x[s], begin[rank], begin[rank + 1]));
      REQUIRE_RANK(rank, eo <= 1e-5, detail::concat("step ", s, " output relative error ", eo));
      REQUIRE_RANK(rank, eg <= 1e-5, detail::concat("step ", s, " input gradient relative error ", eg));
    }
    // weight/bias gradients are this rank's share: their sum over ranks is the global one
    // (DDP sums them); running statistics are global on every rank.
    Tensor gw = bn.weight.grad().clone(), gb = bn.bias.grad().clone();
    pg->allreduce(gw)->wait();
    pg->allreduce(gb)->wait();
    REQUIRE_RANK(rank, rel(gw, want.grad_w) <= 1e-5, detail::concat("weight gradient ", rel(gw, want.grad_w)));
    REQUIRE_RANK(rank, rel(gb, want.grad_b) <= 1e-5, detail::concat("bias gradient ", rel(gb, want.grad_b)));
    REQUIRE_RANK(rank, rel(bn.running_mean, want.running_mean) <= 1e-5, "running_mean");
    REQUIRE_RANK(rank, rel(bn.running_var, want.running_var) <= 1e-5, "running_var");
    REQUIRE_RANK(rank, bn.num_batches_tracked.to(Device::cpu()).item_int() == 2, "num_batches_tracked");
    // Eval mode: the running statistics, no collective (a rank alone may run it).
    bn.eval();
    nn::BatchNorm plain(C);
    plain.load_state_dict(bn.state_dict());
    plain.eval();
    REQUIRE_RANK(rank, rel(bn.forward(xr), plain.forward(xr.to(Device::cpu()))) == 0.0, "eval equals BatchNorm");
  });
}

}  // namespace

TEST_CASE("SyncBatchNorm W = 2, 4 equals BatchNorm on the global batch (even, uneven and an empty batch)") {
  CHECK_NOTHROW(check_world(2, {4, 4}, {8, 3, 2, 3}, Device::cpu()));
  CHECK_NOTHROW(check_world(2, {3, 6}, {9, 5}, Device::cpu()));
  CHECK_NOTHROW(check_world(4, {2, 2, 2, 2}, {8, 4, 3, 2}, Device::cpu()));
  CHECK_NOTHROW(check_world(4, {1, 3, 0, 5}, {9, 3, 4}, Device::cpu()));
}

TEST_CASE("SyncBatchNorm on sim tensors, W = 2, equals BatchNorm on the global batch") {
  CHECK_NOTHROW(check_world(2, {5, 3}, {8, 4, 3, 3}, Device::sim(0)));
}

TEST_CASE("convert_sync_batchnorm swaps every BatchNorm, keeping weights, buffers and mode") {
  Generator g(1);
  auto inner = std::make_shared<nn::Sequential>();
  inner->push_back(std::make_shared<nn::BatchNorm1d>(4));
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(3, 4, true, &g));
  model->push_back(inner);
  model->push_back(std::make_shared<nn::BatchNorm1d>(4, 1e-3, std::nullopt));
  auto* bn = dynamic_cast<nn::BatchNorm*>((*model)[2].get());
  bn->running_mean.fill_(0.25);
  bn->num_batches_tracked.fill_(3);
  model->eval();
  const TensorMap before = model->state_dict();
  auto converted = parallel::convert_sync_batchnorm(model);
  const auto& seq = dynamic_cast<nn::Sequential&>(*converted);
  CHECK(dynamic_cast<SyncBatchNorm*>(dynamic_cast<nn::Sequential&>(*seq[1])[0].get()) != nullptr);
  auto* sync = dynamic_cast<SyncBatchNorm*>(seq[2].get());
  REQUIRE(sync != nullptr);
  CHECK(sync->eps == 1e-3);
  CHECK(!sync->momentum.has_value());
  CHECK(!converted->is_training());
  CHECK(seq[0].get() == (*model)[0].get());  // other layers are shared
  const TensorMap after = converted->state_dict();
  REQUIRE(after.size() == before.size());
  for (const auto& [k, v] : before) {
    CAPTURE(k);
    if (v.dtype() == DType::Int64)
      CHECK(after.at(k).item_int() == v.item_int());
    else
      CHECK(max_rel_err(after.at(k), v) == 0.0);
  }
  CHECK(after.at("2.num_batches_tracked").item_int() == 3);

  struct Custom : nn::Module {
    Custom() { register_module("bn", std::make_shared<nn::BatchNorm1d>(2)); }
    Tensor forward(const Tensor& x) override { return x; }
    std::string describe() const override { return "Custom"; }
  };
  CHECK_THROWS_WITH_AS(parallel::convert_sync_batchnorm(std::make_shared<Custom>()),
                       doctest::Contains("not an nn::Sequential"), ConfigError);
}

TEST_CASE("Join with DDP and SyncBatchNorm on uneven inputs: the joined rank shadows with zero counts") {
  // W = 2: rank 0 has 2 batches, rank 1 has 3. Steps 1-2 equal one process on both batches;
  // step 3 is rank 1's batch alone, its gradient divided by the initial world size (2).
  const int W = 2;
  const std::int64_t B = 4;
  Generator gen(11);
  const Tensor x = randn({5 * B, 6}, &gen), y = randn({5 * B, 2}, &gen);
  auto make = [] {
    Generator g(5);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(6, 8, true, &g));
    m->push_back(std::make_shared<nn::BatchNorm1d>(8));
    m->push_back(std::make_shared<nn::Tanh>());
    m->push_back(std::make_shared<nn::Linear>(8, 2, true, &g));
    return m;
  };
  // rank 0: rows [0, 2B), rank 1: rows [2B, 5B); step s uses rank 0's batch s and rank 1's.
  auto batch = [&](int rank, int s) {
    const std::int64_t lo = rank == 0 ? s * B : 2 * B + s * B;
    return std::pair{rows(x, lo, lo + B), rows(y, lo, lo + B)};
  };
  auto ref = make();
  optim::SGD ref_opt(ref->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < 3; ++s) {
    ref_opt.zero_grad();
    if (s < 2) {
      auto [x0, y0] = batch(0, s);
      auto [x1, y1] = batch(1, s);
      const Tensor both = Tensor::empty({2 * B, 6});
      both.narrow_rows(0, B).copy_(x0);
      both.narrow_rows(B, 2 * B).copy_(x1);
      const Tensor yb = Tensor::empty({2 * B, 2});
      yb.narrow_rows(0, B).copy_(y0);
      yb.narrow_rows(B, 2 * B).copy_(y1);
      mse_loss(ref->forward(both), yb).backward();
    } else {
      auto [x1, y1] = batch(1, s);
      (mse_loss(ref->forward(x1), y1) * 0.5f).backward();
    }
    ref_opt.step();
  }
  const TensorMap want = ref->state_dict();
  auto store = std::make_shared<MemoryStore>();
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "sbnjoin");
    DDP ddp(parallel::convert_sync_batchnorm(make(), pg), pg);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
    parallel::Join join({&ddp});
    for (int s = 0; s < 2 + rank; ++s) {
      auto [xb, yb] = batch(rank, s);
      opt.zero_grad();
      mse_loss(ddp.forward(xb), yb).backward();
      opt.step();
    }
    join.finish();
    REQUIRE_RANK(rank, join.shadowed_iterations() == (rank == 0 ? 1 : 0), "shadowed iterations");
    for (const auto& [k, v] : ddp.module().state_dict()) {
      const double err = v.dtype() == DType::Int64 ? std::abs(v.item_int() - want.at(k).item_int())
                                                   : max_rel_err(v, want.at(k));
      REQUIRE_RANK(rank, err <= 1e-5, detail::concat(k, " error ", err, " vs one process"));
    }
  }));
}

TEST_CASE("Join with DDP on a CNN with SyncBatchNorm2d, W = 3, rank r has 1 + r batches: completes, ranks agree") {
  // The joined ranks' shadow forward runs Conv2d, MaxPool2d, Flatten and Linear on a batch of 0.
  const int W = 3;
  auto store = std::make_shared<MemoryStore>();
  std::vector<TensorMap> finals(W);
  CHECK_NOTHROW(run_threads(W, [&](int rank) {
    auto pg = group(rank, W, store, "sbncnn");
    Generator g(3);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1, 1, 1, true, &g));
    m->push_back(std::make_shared<nn::BatchNorm2d>(4));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::MaxPool2d>(2));
    m->push_back(std::make_shared<nn::Flatten>());
    m->push_back(std::make_shared<nn::Linear>(4 * 3 * 3, 5, true, &g));
    DDP ddp(parallel::convert_sync_batchnorm(m, pg), pg);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.05).momentum(0.9));
    Generator data(20 + rank);
    parallel::Join::run({&ddp}, [&] {
      for (int s = 0; s < 1 + rank; ++s) {
        opt.zero_grad();
        cross_entropy(ddp.forward(randn({3, 1, 6, 6}, &data)), randint(5, {3}, &data)).backward();
        opt.step();
      }
    });
    for (const auto& [k, v] : ddp.module().state_dict()) finals[rank].set(k, v.clone());
  }));
  for (int r = 1; r < W; ++r)
    for (const auto& [k, v] : finals[0]) {
      CAPTURE(k);
      if (v.dtype() == DType::Int64)
        CHECK(finals[r].at(k).item_int() == v.item_int());
      else
        CHECK(max_rel_err(finals[r].at(k), v) == 0.0);
    }
  CHECK(finals[0].at("1.num_batches_tracked").item_int() == W);  // every rank counted every iteration
}

TEST_CASE("SyncBatchNorm takes bf16 input (autocast): float32 statistics, bf16 out and bf16 input gradient") {
  // W = 2 on bf16 activations equals one process's float32 BatchNorm on the same (bf16) values
  // over the global batch, within one bf16 rounding of the output; the running statistics,
  // the weight and bias and their gradients stay float32.
  Generator gen(5);
  const Shape shape{8, 3, 2, 2};
  const Tensor x = to_dtype(to_dtype(randn(shape, &gen) * 2.f + 0.5f, DType::BFloat16), DType::Float32);
  const Tensor g = randn(shape, &gen);
  const Reference want = reference(x, g, 1, 3);
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = group(rank, 2, store, "sbn_bf16");
    SyncBatchNorm bn(3, 1e-5, 0.1, true, true, pg);
    const Tensor xs = to_dtype(rows(x, 4 * rank, 4 * rank + 4), DType::BFloat16).requires_grad_();
    const Tensor gr = rows(g, 4 * rank, 4 * rank + 4);
    Tensor y = bn.forward(xs);
    REQUIRE_RANK(rank, y.dtype() == DType::BFloat16, "output dtype " + y.str());
    sum(to_dtype(y, DType::Float32) * gr).backward();
    REQUIRE_RANK(rank, xs.grad().dtype() == DType::BFloat16, "input gradient dtype " + xs.grad().str());
    REQUIRE_RANK(rank, bn.running_mean.dtype() == DType::Float32 && bn.running_var.dtype() == DType::Float32,
                 "running statistics stay float32");
    REQUIRE_RANK(rank, bn.weight.grad().dtype() == DType::Float32, "weight gradient float32");
    const double eo = rel(to_dtype(y.detach(), DType::Float32), rows(want.out[0], 4 * rank, 4 * rank + 4));
    REQUIRE_RANK(rank, eo <= 1.0 / 128, detail::concat("output relative error ", eo));
    // float32 statistics on the bf16 values: the running stats equal the float32 reference's.
    REQUIRE_RANK(rank, rel(bn.running_mean, want.running_mean) <= 1e-5, "running_mean");
    REQUIRE_RANK(rank, rel(bn.running_var, want.running_var) <= 1e-5, "running_var");
    const double eg = rel(to_dtype(xs.grad(), DType::Float32), rows(want.grad_x[0], 4 * rank, 4 * rank + 4));
    REQUIRE_RANK(rank, eg <= 1.0 / 128, detail::concat("input gradient relative error ", eg));
  });
}
