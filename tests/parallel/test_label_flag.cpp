// The step flag (docs/ddp.md, "The step flag"): a cross_entropy label out of range on one
// rank under DDP makes every rank raise the same one-line error at the end of that backward,
// before any optimizer step, on the CPU and on the sim device's asynchronous mode (which
// defers kernels, eager and lazy, as a GPU's stream does), for the bucketed reducer (default and fp16
// hooks) and exact mode, W = 2 and 3 forked ranks over gloo. No replica steps on that pass,
// the replicas stay bit-identical, and the next step runs in step on every rank.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstring>

#include <phalanx/backends/memory_store.hpp>
#include <phalanx/core/half.hpp>
#include <phalanx/core/kernels.hpp>

#include "support/ddp_fixtures.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;
using parallel::DDPOptions;

namespace {

using Params = std::vector<std::vector<float>>;

int set_async(int mode) {
  (void)zeros({1}, DType::Float32, Device::sim());  // loads the sim plugin
  void* h = ::dlopen(PHALANX_SIM_PLUGIN, RTLD_NOW | RTLD_NOLOAD);
  if (!h) throw std::runtime_error("libphalanx_sim.so is not loaded");
  auto f = reinterpret_cast<int (*)(int)>(::dlsym(h, "phalanx_sim_set_async"));
  if (!f) throw std::runtime_error("phalanx_sim_set_async not exported");
  return f(mode);
}
constexpr int kEager = 1, kLazy = 2;  // PHALANX_SIM_ASYNC=1 / lazy

Params host_params(const std::vector<Tensor>& ps) {
  Params out;
  for (const auto& p : ps) out.push_back(p.to_vector<float>());
  return out;
}

bool same_bits(const Params& a, const Params& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  return true;
}

/// Whether every rank holds these bits: the elementwise MAX and MIN over the group equal them.
bool same_on_every_rank(const ProcessGroupPtr& pg, const Params& mine) {
  bool same = true;
  for (const auto& v : mine) {
    Tensor hi = tensor(v, {static_cast<std::int64_t>(v.size())}), lo = hi.clone();
    pg->allreduce(hi, ReduceOp::Max)->wait();
    pg->allreduce(lo, ReduceOp::Min)->wait();
    same = same && hi.to_vector<float>() == v && lo.to_vector<float>() == v;
  }
  return same;
}

/// Labels rows [b, e) of `d`, with row 1 made `bad` when `bad` is not -1.
Tensor labels(const Data& d, std::int64_t b, std::int64_t e, std::int64_t bad, Device dev) {
  std::vector<std::int64_t> y = d.y.narrow_rows(b, e).contiguous().to_vector<std::int64_t>();
  if (bad != -1) y[1] = bad;
  return tensor(y, {e - b}).to(dev);
}

/// Buckets of 512 bytes: the test models make four or more of them.
DDPOptions small_buckets() {
  DDPOptions o;
  o.bucket_cap_mb(512.0 / (1 << 20)).first_bucket_mb(512.0 / (1 << 20));
  return o;
}

/// The test model on `dev`.
std::shared_ptr<nn::Sequential> model_on(Device dev) {
  auto m = many_small_one_large();
  m->to(dev);
  return m;
}

/// Rows 0..16 of the data on a device, their labels, and the same with label 5 in row 1.
struct Batch16 {
  Tensor x, good, bad;
};
Batch16 batch16(const Data& d, Device dev) {
  return {d.x.narrow_rows(0, 16).to(dev), labels(d, 0, 16, -1, dev), labels(d, 0, 16, 5, dev)};
}

/// `body(d, pg, dev)` for CPU and sim tensors (synchronous sim), in a gloo world of one on
/// this thread with PHALANX_TEST_REDUCER_AT_ONE set: DDP models build the bucketed reducer.
template <class Body>
void each_device_at_one(Body body) {
  set_async(0);
  const Data d = make_data(64);
  ::setenv("PHALANX_TEST_REDUCER_AT_ONE", "1", 1);
  auto pg = make_thread_group("gloo", 0, 1, std::make_shared<MemoryStore>(std::chrono::seconds(10)));
  for (Device dev : {Device::cpu(), Device::sim()}) {
    CAPTURE(dev.str());
    body(d, pg, dev);
  }
  ::unsetenv("PHALANX_TEST_REDUCER_AT_ONE");
}

/// Three steps of the bucketed reducer; in step 1 the last rank's batch holds label `bad`.
/// Returns the error every rank saw in step 1 (empty: none).
std::string bucketed(const Data& d, const ProcessGroupPtr& pg, int rank, int W, Device dev, bool fp16,
                     std::int64_t bad) {
  DDPOptions o = small_buckets();
  auto model = model_on(dev);
  DDP ddp(model, pg, o);
  if (ddp.bucket_layout().size() < 4) throw std::runtime_error("fewer than 4 buckets");
  if (fp16) ddp.register_comm_hook(parallel::fp16_compress_hook());
  auto opt = make_opt("sgd", ddp.parameters());
  const std::int64_t per = 12 / W;
  std::string seen;
  for (int step = 0; step < 3; ++step) {
    const std::int64_t b = step * 12 + rank * per;
    const Params before = host_params(ddp.parameters());
    opt->zero_grad();
    try {
      Tensor loss = cross_entropy(ddp.forward(d.x.narrow_rows(b, b + per).to(dev)),
                                  labels(d, b, b + per, step == 1 && rank == W - 1 ? bad : -1, dev));
      loss.backward();
      opt->step();
    } catch (const ValueError& e) {
      REQUIRE_RANK(rank, step == 1, e.what());
      seen = e.what();
      REQUIRE_RANK(rank, same_bits(before, host_params(ddp.parameters())), "a replica stepped on the bad pass");
    }
  }
  REQUIRE_RANK(rank, same_on_every_rank(pg, host_params(ddp.parameters())), "the replicas differ");
  // Evaluation (no backward to follow) still raises at once, on this rank alone.
  NoGradGuard no_grad;
  bool raised = false;
  try {
    cross_entropy(ddp.forward(d.x.narrow_rows(0, 4).to(dev)), labels(d, 0, 4, 9, dev));
  } catch (const ValueError& e) {
    raised = std::string(e.what()).find("target[1] = 9 is not a class index in [0, 5)") != std::string::npos;
  }
  REQUIRE_RANK(rank, raised, "no immediate label error in evaluation");
  return seen;
}

/// Two steps of exact mode (12 micro-batches of 2); in step 0 the last rank's second
/// micro-batch holds label `bad`.
std::string exact(const Data& d, const ProcessGroupPtr& pg, int rank, int W, Device dev, std::int64_t bad) {
  DDPOptions o = small_buckets();
  o.exact().enabled = true;
  o.exact().global_batch = 24;
  o.exact().micro_batch = 2;
  Generator g(3);
  auto model = nn::mlp({16, 32, 32, 5}, "relu", &g);
  model->to(dev);
  DDP ddp(model, pg, o);
  auto opt = make_opt("sgd", ddp.parameters());
  const std::int64_t per = 12 / W;
  std::string seen;
  for (int step = 0; step < 2; ++step) {
    const Params before = host_params(ddp.parameters());
    opt->zero_grad();
    try {
      for (std::int64_t m = 0; m < per; ++m) {
        const std::int64_t b = step * 24 + (rank * per + m) * 2;
        const bool poison = step == 0 && rank == W - 1 && m == std::min<std::int64_t>(1, per - 1);
        cross_entropy(ddp.forward(d.x.narrow_rows(b, b + 2).to(dev)), labels(d, b, b + 2, poison ? bad : -1, dev))
            .backward();
      }
      opt->step();
    } catch (const ValueError& e) {
      REQUIRE_RANK(rank, step == 0, e.what());
      seen = e.what();
      REQUIRE_RANK(rank, same_bits(before, host_params(ddp.parameters())), "a replica stepped on the bad step");
    }
  }
  REQUIRE_RANK(rank, same_on_every_rank(pg, host_params(ddp.parameters())), "the replicas differ");
  return seen;
}

template <class Body>
bool run_world(int W, int mode, Body body) {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(W, [&](int rank) {
    set_num_threads(1);
    set_async(mode);
    set_rank_env(rank, W, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions io;
    io.timeout = std::chrono::seconds(20);
    auto pg = parallel::init_process_group(io);
    const int code = body(pg, rank);
    parallel::destroy_process_group();
    return code;
  }, std::chrono::seconds(120));
  bool ok = true;
  for (int r = 0; r < W; ++r) ok = ok && results[r].exit_code == 0 && results[r].signal == 0;
  return ok;
}

}  // namespace

TEST_CASE("step flag, W = 2 and 3, CPU and async sim (eager and lazy): a bad label on one rank stops every rank with one error") {
  const Data d = make_data(96);
  for (int W : {2, 3})
  for (int mode : {kEager, kLazy}) {
    CAPTURE(W);
    CAPTURE(mode);
    const std::string bucket_error = detail::concat(
        "DDP: cross_entropy got a target outside [0, classes) on 1 of ", W,
        " rank(s) in this step, so this step's reduced gradients are contaminated on every rank and no rank "
        "may step; skip this optimizer step, zero the gradients and fix the labels (each must be a class "
        "index below the model's output width)");
    const std::string exact_error = detail::concat(
        "DDP exact mode: cross_entropy got a target outside [0, classes) on at least one of ", W,
        " rank(s) in this step, so this step is void on every rank and its gradients are cleared; skip this "
        "optimizer step and fix the labels (each must be a class index below the model's output width)");
    const bool ok = run_world(W, mode, [&](const ProcessGroupPtr& pg, int rank) {
      for (Device dev : {Device::cpu(), Device::sim()}) {
        for (bool fp16 : {false, true}) {
          const std::string seen = bucketed(d, pg, rank, W, dev, fp16, fp16 ? -3 : 5);
          REQUIRE_RANK(rank, seen == bucket_error, dev.str() + (fp16 ? " fp16 hook: " : ": ") + seen);
        }
        const std::string seen = exact(d, pg, rank, W, dev, 7);
        REQUIRE_RANK(rank, seen == exact_error, dev.str() + " exact: " + seen);
      }
      return 0;
    });
    CHECK(ok);
  }
}

TEST_CASE("step flag, W = 1 with PHALANX_TEST_REDUCER_AT_ONE (the GPU check's switch): bit-equal, then the flag stops a bad step") {
  // What tests/cuda/test_cuda_ddp.cpp does on NCCL, here on gloo with CPU and sim tensors.
  each_device_at_one([](const Data& d, const ProcessGroupPtr& pg, Device dev) {
    for (bool fp16 : {false, true}) {
      CAPTURE(fp16);
      DDPOptions o = small_buckets();
      auto net = model_on(dev), plain = model_on(dev);
      DDP ddp(net, pg, o);
      REQUIRE(ddp.bucket_layout().size() >= 4);  // the switch built the reducer
      if (fp16) ddp.register_comm_hook(parallel::fp16_compress_hook());
      auto opt = make_opt("sgd", ddp.parameters()), plain_opt = make_opt("sgd", plain->parameters());
      const Tensor x = d.x.narrow_rows(0, 16).to(dev), y = labels(d, 0, 16, -1, dev);
      for (int s = 0; s < 3; ++s) {
        opt->zero_grad();
        cross_entropy(ddp.forward(x), y).backward();
        opt->step();
        plain_opt->zero_grad();
        cross_entropy(plain->forward(x), y).backward();
        if (fp16)  // the hook at W = 1: a round trip through float16
          for (const Tensor& p : plain->parameters()) p.grad().copy_(to_dtype(to_dtype(p.grad(), DType::Float16), DType::Float32));
        plain_opt->step();
        REQUIRE(same_bits(host_params(ddp.parameters()), host_params(plain->parameters())));
      }
      const Params before = host_params(ddp.parameters());
      opt->zero_grad();
      CHECK_THROWS_WITH_AS(cross_entropy(ddp.forward(x), labels(d, 0, 16, 5, dev)).backward(),
                           "DDP: cross_entropy got a target outside [0, classes) on 1 of 1 rank(s) in this step, so "
                           "this step's reduced gradients are contaminated on every rank and no rank may step; skip "
                           "this optimizer step, zero the gradients and fix the labels (each must be a class index "
                           "below the model's output width)",
                           ValueError);
      CHECK(same_bits(before, host_params(ddp.parameters())));
    }
  });
}

TEST_CASE("exact mode, W = 2, async sim: a device error reported in finish_step voids the step and leaves the reducer reset") {
  // A queued device copy from an address no block holds fails on the sim worker and is
  // reported at the next host read: in exact mode on a device, the maxima's read in
  // finish_step (launch_max), as CUDA's deferred errors are. It used to escape finish_step's
  // CommError-only catch, skipping the void maxima, drain and reset_step: the ranks then went
  // out of step.
  const Data d = make_data(96);
  const bool ok = run_world(2, kLazy, [&](const ProcessGroupPtr& pg, int rank) {
    const Device dev = Device::sim();
    DDPOptions o = small_buckets();
    o.exact().enabled = true;
    o.exact().global_batch = 24;
    o.exact().micro_batch = 2;
    Generator g(3);
    auto model = nn::mlp({16, 32, 32, 5}, "relu", &g);
    model->to(dev);
    DDP ddp(model, pg, o);
    auto opt = make_opt("sgd", ddp.parameters());
    const std::int64_t per = 6;
    std::string seen;
    bool value_error = false;
    for (int step = 0; step < 3; ++step) {
      const Params before = host_params(ddp.parameters());
      opt->zero_grad();
      try {
        for (std::int64_t m = 0; m < per; ++m) {
          const std::int64_t b = step * 24 + (rank * per + m) * 2;
          Tensor loss = cross_entropy(ddp.forward(d.x.narrow_rows(b, b + 2).to(dev)), labels(d, b, b + 2, -1, dev));
          if (step == 0 && rank == 1 && m == per - 1) {
            Tensor a = zeros({4}, DType::Float32, dev);
            const auto bogus = reinterpret_cast<const void*>((std::uintptr_t(1) << 55) | 64);
            kernels_for(dev).copy(a.raw_data(), bogus, 16);
          }
          loss.backward();
        }
        opt->step();
      } catch (const std::exception& e) {
        REQUIRE_RANK(rank, step == 0, e.what());
        seen = e.what();
        value_error = dynamic_cast<const ValueError*>(&e) != nullptr;
        REQUIRE_RANK(rank, same_bits(before, host_params(ddp.parameters())), "a replica stepped on the void step");
      }
    }
    REQUIRE_RANK(rank, !seen.empty(), "step 0 raised nothing");
    if (rank == 1) REQUIRE_RANK(rank, value_error, seen);
    if (rank == 0)
      REQUIRE_RANK(rank, seen.find("stopped part-way on at least one of 2") != std::string::npos, seen);
    REQUIRE_RANK(rank, same_on_every_rank(pg, host_params(ddp.parameters())), "the replicas differ");
    return 0;
  });
  CHECK(ok);
}

TEST_CASE("step flag: a loss outside a DDP step (a plain model's, or after the step) still raises at once") {
  // The sink used to be installed at the reducer's construction and left on the thread: every
  // later cross_entropy in grad mode on that thread (a plain model's, or one after the step)
  // wrote the flag instead of raising, with class 0 for its bad rows, and nothing raised
  // unless that DDP model ran another backward.
  each_device_at_one([](const Data& d, const ProcessGroupPtr& pg, Device dev) {
    DDPOptions o = small_buckets();
    auto net_a = model_on(dev), plain = model_on(dev);
    DDP a(net_a, pg, o);
    const auto [x, good, bad] = batch16(d, dev);
    // A plain model on the thread of a DDP model not in a step.
    CHECK_THROWS_WITH_AS(cross_entropy(plain->forward(x), bad), "cross_entropy: target[1] = 5 is not a class index in [0, 5)",
                         ValueError);
    cross_entropy(a.forward(x), good).backward();
    CHECK_THROWS_WITH_AS(cross_entropy(plain->forward(x), bad), "cross_entropy: target[1] = 5 is not a class index in [0, 5)",
                         ValueError);
  });
}

TEST_CASE("step flag: two DDP models stepping on one thread, a bad label in one: it never steps silently") {
  each_device_at_one([](const Data& d, const ProcessGroupPtr& pg, Device dev) {
    DDPOptions o = small_buckets();
    auto net_a = model_on(dev), net_b = model_on(dev);
    DDP a(net_a, pg, o), b(net_b, pg, o);
    const auto [x, good, bad] = batch16(d, dev);
    // A's bad label fails A's step (and B's: a loss of this thread in B's step window may
    // feed B); it used to go to B's flag alone (the later forward's), and A stepped.
    Tensor out_a = a.forward(x), out_b = b.forward(x);
    Tensor loss_a = cross_entropy(out_a, bad), loss_b = cross_entropy(out_b, good);
    CHECK_THROWS_AS(loss_a.backward(), ValueError);
    CHECK_THROWS_AS(loss_b.backward(), ValueError);
    // Both reducers are reset: the next step of each is clean.
    cross_entropy(a.forward(x), good).backward();
    cross_entropy(b.forward(x), good).backward();
  });
}

/// The default hook, which queues a failing device copy after the last bucket's wait, once:
/// the next host read, finalize's read of the step flag, reports it.
struct FailAfterLastBucket final : parallel::CommHook {
  explicit FailAfterLastBucket(std::size_t buckets) : last(buckets - 1) {}
  std::string name() const override { return "fail_after_last_bucket"; }
  void launch(ProcessGroup& pg, parallel::GradBucket& b) override { inner->launch(pg, b); }
  void finish(ProcessGroup& pg, parallel::GradBucket& b) override {
    inner->finish(pg, b);
    if (b.index != last || fired) return;
    fired = true;
    const auto bogus = reinterpret_cast<const void*>((std::uintptr_t(1) << 55) | 64);
    kernels_for(b.buffer.device()).copy(b.buffer.raw_data(), bogus, 4);
  }
  parallel::CommHookPtr inner = parallel::allreduce_hook();
  std::size_t last;
  bool fired = false;
};

TEST_CASE("bucketed reducer: an error reported by the step flag's read leaves the reducer reset") {
  // The flag's read in finalize is a host read: it reports an earlier deferred device error
  // (here a failed sim copy; on CUDA the deferred label check of a loss computed outside a
  // step). That read used to come before reset_pass: the next forward then finished the
  // already finished buckets again (a null Work) and the rank crashed.
  const Data d = make_data(64);
  const bool ok = run_world(2, kLazy, [&](const ProcessGroupPtr& pg, int rank) {
    const Device dev = Device::sim();
    DDPOptions o = small_buckets();
    auto net = model_on(dev);
    DDP ddp(net, pg, o);
    REQUIRE_RANK(rank, ddp.bucket_layout().size() >= 4, "fewer than 4 buckets");
    if (rank == 1) ddp.register_comm_hook(std::make_shared<FailAfterLastBucket>(ddp.bucket_layout().size()));
    const Tensor x = d.x.narrow_rows(rank * 16, rank * 16 + 16).to(dev), y = labels(d, rank * 16, rank * 16 + 16, -1, dev);
    bool raised = false;
    try {
      cross_entropy(ddp.forward(x), y).backward();
    } catch (const std::exception& e) {
      REQUIRE_RANK(rank, rank == 1, e.what());
      raised = std::string(e.what()).find("outside every live sim block") != std::string::npos;
    }
    REQUIRE_RANK(rank, raised == (rank == 1), "the failed copy was not reported by the flag's read");
    for (int s = 0; s < 3; ++s) {
      for (const Tensor& p : ddp.parameters()) p.set_grad(Tensor());
      cross_entropy(ddp.forward(x), y).backward();
    }
    std::vector<Tensor> grads;
    for (const Tensor& p : ddp.parameters()) grads.push_back(p.grad());
    REQUIRE_RANK(rank, same_on_every_rank(pg, host_params(grads)), "the reduced gradients differ");
    return 0;
  });
  CHECK(ok);
}
