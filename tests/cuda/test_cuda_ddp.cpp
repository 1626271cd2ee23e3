// What one GPU can prove about DDP on NCCL (docs/gpu.md, "The GPU check"):
// - "nccl reducer": the bucketed reducer at world size 1 (PHALANX_TEST_REDUCER_AT_ONE builds
//   it), small buckets, the plain, fp16 and bf16 hooks, bit-equal to the plain model (whose
//   gradients go through the same 16-bit rounding); a bad label makes the step raise the step
//   flag's error before any optimizer step.
// - "nccl order": an out-of-place collective issued right after a long kernel that writes its
//   input reads the kernel's result (the collective waits for the compute stream).
// - "nccl hang": a collective queued behind a long kernel past the group's timeout: the
//   watchdog raises TimeoutError, aborts the communicator, and the process goes on and exits
//   cleanly. Hang-prone: the check runs these cases last, alone, with a short limit.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include <phalanx/phalanx.hpp>
#include <phalanx/backends/comm_error.hpp>
#include <phalanx/core/half.hpp>

#include "cuda/nccl_support.hpp"

using namespace phalanx;
using phalanx::test::nccl_group_of_one;
using phalanx::test::nccl_usable;

namespace {
const Device kGpu = Device::cuda(0);

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = host(a[i]), y = host(b[i]);
    if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * 4) != 0) return false;
  }
  return true;
}

/// A long chain of large GEMMs on the compute stream (tens to hundreds of milliseconds on an
/// H100); returns its result, written by the last kernel.
Tensor long_kernel(int rounds) {
  Generator g(11);
  Tensor a = randn({4096, 4096}, &g).to(kGpu), x = randn({4096, 4096}, &g).to(kGpu);
  for (int r = 0; r < rounds; ++r) x = matmul(a, x) * (1.f / 64.f);
  return x;
}

/// Sets PHALANX_TEST_REDUCER_AT_ONE for the scope.
struct ReducerAtOne {
  ReducerAtOne() { ::setenv("PHALANX_TEST_REDUCER_AT_ONE", "1", 1); }
  ~ReducerAtOne() { ::unsetenv("PHALANX_TEST_REDUCER_AT_ONE"); }
};
}  // namespace

TEST_CASE("nccl reducer: buckets at world size 1 (plain, fp16, bf16 hooks) equal the plain model bit for bit") {
  if (!nccl_usable()) return;
  auto pg = nccl_group_of_one(std::chrono::seconds(60));
  const ReducerAtOne at_one;
  for (int hook = 0; hook < 3; ++hook) {
    CAPTURE(hook);
    Generator g(5);
    auto net = nn::mlp({784, 256, 128, 10}, "relu", &g);
    auto plain = nn::mlp({784, 256, 128, 10}, "relu", &g);
    plain->load_state_dict(net->state_dict());
    net->to(kGpu);
    plain->to(kGpu);
    parallel::DDPOptions o;
    o.bucket_cap_mb(64.0 / 1024).first_bucket_mb(16.0 / 1024);  // several buckets
    parallel::DDP model(net, pg, o);
    REQUIRE(model.bucket_layout().size() >= 3);
    const DType rounding = hook == 1 ? DType::Float16 : DType::BFloat16;
    if (hook == 1) model.register_comm_hook(parallel::fp16_compress_hook());
    if (hook == 2) model.register_comm_hook(parallel::bf16_compress_hook());
    optim::SGD opt(model.parameters(), optim::SGDOptions(0.05).momentum(0.9));
    optim::SGD plain_opt(plain->parameters(), optim::SGDOptions(0.05).momentum(0.9));
    Tensor x = randn({64, 784}, &g).to(kGpu), y = randint(10, {64}, &g).to(kGpu);
    for (int s = 0; s < 4; ++s) {
      opt.zero_grad();
      cross_entropy(model.forward(x), y).backward();
      opt.step();
      plain_opt.zero_grad();
      cross_entropy(plain->forward(x), y).backward();
      if (hook > 0)  // what the hook does at W = 1: a round trip through the 16-bit format
        for (const Tensor& p : plain->parameters()) p.grad().copy_(to_dtype(to_dtype(p.grad(), rounding), DType::Float32));
      plain_opt.step();
      REQUIRE(same_bits(model.parameters(), plain->parameters()));
    }
    // A bad label: the step flag stops the step before the optimizer (the kernel writes the
    // flag on the device; the reducer reads it with the last bucket).
    std::vector<std::int64_t> bad = y.to(Device::cpu()).to_vector<std::int64_t>();
    bad[3] = 10;
    const std::vector<float> before = host(model.parameters()[0]);
    opt.zero_grad();
    CHECK_THROWS_WITH_AS(cross_entropy(model.forward(x), tensor(bad, {64}).to(kGpu)).backward(),
                         doctest::Contains("cross_entropy got a target outside [0, classes) on 1 of 1 rank(s)"),
                         ValueError);
    CHECK(host(model.parameters()[0]) == before);
    opt.zero_grad();  // and the next step runs
    cross_entropy(model.forward(x), y).backward();
    opt.step();
  }
}

TEST_CASE("nccl order: out-of-place collectives right after a long kernel that writes their input") {
  if (!nccl_usable()) return;
  auto pg = nccl_group_of_one(std::chrono::seconds(60));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    Tensor in = long_kernel(8);  // still running when the collectives are issued
    std::vector<Tensor> gathered{zeros(in.shape(), DType::Float32, kGpu)};
    WorkPtr w1 = pg->allgather(gathered, in);
    Tensor scattered = zeros(in.shape(), DType::Float32, kGpu);
    WorkPtr w2 = pg->reduce_scatter(scattered, {in});
    w1->wait();
    w2->wait();
    const std::vector<float> want = host(in);
    CHECK(host(gathered[0]) == want);
    CHECK(host(scattered) == want);
  }
}

TEST_CASE("nccl hang: a collective queued behind a long kernel past the timeout: TimeoutError, abort, clean exit") {
  if (!nccl_usable()) return;
  auto pg = nccl_group_of_one(std::chrono::milliseconds(300));
  // 600 fp32 GEMMs of 4096^3: ~1.6 s on an H100 (~50 TFLOP/s without TF32), well past the
  // 300 ms timeout (200 left a margin of ~250 ms, less with a faster GEMM).
  Tensor t = long_kernel(600);
  const auto t0 = std::chrono::steady_clock::now();
  WorkPtr w = pg->allreduce(t, ReduceOp::Sum);
  // wait() is a device-side wait (the compute stream waits for the collective's done event)
  // and returns at once; synchronize() blocks the host and reports the watchdog's verdict.
  w->wait();
  CHECK_THROWS_AS(w->synchronize(), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  // The communicator is aborted: the next collective fails at once rather than hanging.
  CHECK_THROWS_AS(pg->allreduce(zeros({4}, DType::Float32, kGpu))->synchronize(), CommError);
  pg.reset();
  // The device itself still works after the abort (the GEMMs finish; a read returns).
  CHECK(host(t).size() == 4096u * 4096u);
}
