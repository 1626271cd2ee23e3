// The sim device's asynchronous mode (docs/devices.md): kernels, device copies and frees
// queue on a compute stream that runs them later, in issue order (lazy: only when the host
// waits), host reads wait for it, and a collective's thread reads device memory unordered
// with that stream unless it waits for the operation's ready event. Here: the mode itself;
// DDP (buckets, the fp16 hook), SyncBatchNorm under DDP and exact mode on it at W = 2 and 3
// (forked workers over gloo), bit for bit the CPU run on the same rank; and the proof that a
// skipped ready-event wait (PHALANX_TEST_SKIP_READY_WAIT=1) makes the same run go wrong.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "phalanx/backends/world_of_one.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/tensor_impl.hpp"
#include "phalanx/parallel/all_reduce_scalar.hpp"
#include "support/ddp_fixtures.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;
using parallel::DDPOptions;

namespace {

using Params = std::vector<std::vector<float>>;

/// The sim plugin's exported test hooks (loaded by the registry on the first sim tensor).
void* sim_symbol(const char* name) {
  (void)zeros({1}, DType::Float32, Device::sim());
  void* h = ::dlopen(PHALANX_SIM_PLUGIN, RTLD_NOW | RTLD_NOLOAD);
  if (!h) throw std::runtime_error("libphalanx_sim.so is not loaded");
  void* s = ::dlsym(h, name);
  if (!s) throw std::runtime_error(std::string(name) + " not exported");
  return s;
}
constexpr int kEager = 1, kLazy = 2;
// Looked up once (the lookup makes a sim tensor, which would queue work of its own).
int set_async(int mode) {
  static const auto f = reinterpret_cast<int (*)(int)>(sim_symbol("phalanx_sim_set_async"));
  return f(mode);
}
std::size_t pending() {
  static const auto f = reinterpret_cast<std::size_t (*)()>(sim_symbol("phalanx_sim_pending"));
  return f();
}
int freed_poisoned(const void* p) {
  static const auto f = reinterpret_cast<int (*)(const void*)>(sim_symbol("phalanx_sim_freed_block_poisoned"));
  return f(p);
}

// ---- a backend that orders device streams itself, as NCCL does on a GPU ----

/// The sim's side stream (tests/support/sim_device/sim_side_stream.hpp) through its hooks.
struct Side {
  void (*submit)(std::function<void()>*);
  void (*wait_event)(void*);
  void (*record)(void*);
  void (*flush)();
  void (*drain)();
  static const Side& get() {
    static const Side s{reinterpret_cast<void (*)(std::function<void()>*)>(sim_symbol("phalanx_sim_side_submit")),
                        reinterpret_cast<void (*)(void*)>(sim_symbol("phalanx_sim_side_wait_event")),
                        reinterpret_cast<void (*)(void*)>(sim_symbol("phalanx_sim_side_record")),
                        reinterpret_cast<void (*)()>(sim_symbol("phalanx_sim_side_flush")),
                        reinterpret_cast<void (*)()>(sim_symbol("phalanx_sim_side_drain"))};
    return s;
  }
};

/// NCCL's shape on the sim device: each operation on sim tensors waits on the side stream
/// for the ready event the group recorded when it was issued (Backend::ready_event), runs
/// there (the bytes moved by `inner`, from the side stream's thread, through handles that do
/// not keep the memory alive), and records its done
/// event there; the Work completes when a watcher polling that event (never making the side
/// stream run) sees it complete, and its wait() is the compute stream's device-side wait.
/// In lazy mode the side stream runs only when something waits for it, so a consumer that
/// skips that wait reads the collective's output before it is written. Operations on host
/// tensors (none in these runs but a barrier) run on the worker after the side stream drained.
/// A handle on `t`'s memory that does not keep it alive: what NCCL's kernels get (a raw
/// pointer), so the block's life is the process group's business, as on a GPU.
Tensor unowned(const Tensor& t) {
  if (!t.defined()) return t;
  return Tensor(std::make_shared<TensorImpl>(Storage::borrow(t.raw_data(), t.nbytes(), t.device(), nullptr), 0,
                                             t.shape(), t.dtype()));
}
std::vector<Tensor> unowned(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(unowned(t));
  return out;
}

class SideStreamBackend final : public Backend {
 public:
  explicit SideStreamBackend(ProcessGroupPtr inner)
      : Backend(inner->rank(), inner->size(), inner->timeout()), inner_(std::move(inner)) {
    declare_device_streams();
  }
  std::string name() const override { return "side:" + inner_->backend_name(); }
  // As NcclBackend's destructor: the stream is idle before the group releases what the
  // operations still queued there (or failed while queued) hold.
  ~SideStreamBackend() override {
    try {
      Side::get().drain();
    } catch (...) {
    }
  }

 protected:
  void on_close() noexcept override { Side::get().flush(); }
  void run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) override {
    run("allreduce", seq, [p = inner_, t = unowned(t), op] { p->allreduce(t, op)->wait(); });
  }
  void run_broadcast(Tensor& t, int root, std::uint64_t seq) override {
    run("broadcast", seq, [p = inner_, t = unowned(t), root] { p->broadcast(t, root)->wait(); });
  }
  void run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) override {
    run("allgather", seq, [p = inner_, out = unowned(out), in = unowned(in)] { p->allgather(out, in)->wait(); });
  }
  void run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) override {
    run("reduce_scatter", seq, [p = inner_, out = unowned(out), in = unowned(in), op] {
      p->reduce_scatter(out, in, op)->wait();
    });
  }
  void run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) override {
    run("reduce", seq, [p = inner_, t = unowned(t), root, op] { p->reduce(t, root, op)->wait(); });
  }
  void run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) override {
    run("gather", seq, [p = inner_, out = unowned(out), in = unowned(in), root] {
      p->gather(out, in, root)->wait();
    });
  }
  void run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) override {
    run("scatter", seq, [p = inner_, out = unowned(out), in = unowned(in), root] {
      p->scatter(out, in, root)->wait();
    });
  }
  void run_barrier(std::uint64_t seq) override {
    run("barrier", seq, [p = inner_] { p->barrier()->wait(); });
  }
  void run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) override {
    run("send", seq, [p = inner_, t = unowned(t), dst, tag] { p->send(t, dst, tag)->wait(); });
  }
  void run_recv(Tensor& t, int src, int tag, std::uint64_t seq) override {
    run("recv", seq, [p = inner_, t = unowned(t), src, tag] { p->recv(t, src, tag)->wait(); });
  }

 private:
  void run(const char* op, std::uint64_t seq, std::function<void()> fn) {
    void* ready = ready_event();
    void* done = done_event();
    const Side& side = Side::get();
    if (!ready || !done) {  // host tensors: after what the side stream has queued
      side.drain();
      fn();
      return;
    }
    side.wait_event(ready);
    side.submit(&fn);
    side.record(done);
    complete_on_device([this, op, seq, done] {
      DeviceKernels& k = kernels_for(Device::sim());
      const auto deadline = std::chrono::steady_clock::now() + timeout();
      // The watchdog's timeout while the device has not run it yet (it runs later, as the
      // copies NCCL queued after an aborted kernel do).
      if (seq >= timeout_from_.load()) throw TimeoutError(describe(op, seq) + ": timed out (test)");
      while (!k.event_query(done)) {
        if (std::chrono::steady_clock::now() > deadline)
          throw TimeoutError(describe(op, seq) + ": the side stream did not run it");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      k.event_synchronize(done);  // done: rethrows what failed on the side stream
      // What NCCL's watchdog finds after the caller's wait() returned: an asynchronous error.
      if (seq >= fail_from_.load())
        throw CommError(describe(op, seq) + ": failed on the device after its wait() returned (test)");
    });
  }
  ProcessGroupPtr inner_;

 public:
  /// Operations numbered `seq` and later fail in the watcher, once the side stream ran them.
  std::atomic<std::uint64_t> fail_from_{~std::uint64_t(0)};
  /// Operations numbered `seq` and later time out in the watcher before the side stream ran them.
  std::atomic<std::uint64_t> timeout_from_{~std::uint64_t(0)};
};

ProcessGroupPtr side_group(ProcessGroupPtr inner) {
  return std::make_shared<ProcessGroup>(BackendPtr(new SideStreamBackend(std::move(inner))));
}
SideStreamBackend& side_backend(const ProcessGroupPtr& pg) { return dynamic_cast<SideStreamBackend&>(pg->backend()); }

/// Restores the mode at the end of a test case.
struct Mode {
  int old;
  explicit Mode(int m) : old(set_async(m)) {}
  ~Mode() { set_async(old); }
};

Params host_params(const std::vector<Tensor>& ps) {
  Params out;
  for (const auto& p : ps) out.push_back(p.to_vector<float>());
  return out;
}

// ---- the scenarios, each run by every rank on the CPU and on sim ----

/// DDP, >= 4 buckets of 512 B, optionally the fp16 compression hook; SGD with momentum.
Params ddp_run(const Data& d, const ProcessGroupPtr& pg, int rank, int W, Device dev, bool fp16) {
  DDPOptions o;
  o.bucket_cap_mb(512.0 / (1 << 20)).first_bucket_mb(512.0 / (1 << 20));
  auto model = many_small_one_large();
  model->to(dev);
  DDP ddp(model, pg, o);
  if (ddp.bucket_layout().size() < 4) throw std::runtime_error("fewer than 4 buckets");
  if (fp16) ddp.register_comm_hook(parallel::fp16_compress_hook());
  auto opt = make_opt("sgd", ddp.parameters());
  samplers::DistributedSamplerOptions so;
  so.num_replicas(W);
  so.rank(rank);
  so.shuffle(false);
  samplers::DistributedSampler sampler(d.x.shape()[0], so);
  train_steps(ddp, *opt, d, &sampler, 24 / W, 6, dev);
  return host_params(ddp.parameters());
}

/// SyncBatchNorm between two linear layers, under DDP (its statistics' collectives in the
/// forward, the gradients' in the backward); the running statistics are returned too.
Params sync_bn_run(const Data& d, const ProcessGroupPtr& pg, int rank, int W, Device dev) {
  Generator g(5);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(16, 12, true, &g));
  auto bn = std::make_shared<parallel::SyncBatchNorm>(12, 1e-5, 0.1, true, true, pg);
  model->push_back(bn);
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(12, 5, true, &g));
  model->to(dev);
  DDP ddp(model, pg);
  auto opt = make_opt("adamw", ddp.parameters());
  const std::int64_t per = 24 / W;
  for (int step = 0; step < 4; ++step) {
    const std::int64_t begin = (step * 24 + rank * per) % (d.x.shape()[0] - per);
    opt->zero_grad();
    cross_entropy(ddp.forward(d.x.narrow_rows(begin, begin + per).to(dev)),
                  d.y.narrow_rows(begin, begin + per).to(dev))
        .backward();
    opt->step();
  }
  Params out = host_params(ddp.parameters());
  out.push_back(bn->running_mean.to_vector<float>());
  out.push_back(bn->running_var.to_vector<float>());
  return out;
}

/// Exact mode: 12 micro-batches of 2 samples a step, shared among the ranks; the losses
/// (read with item() after each forward) and the weights.
Params exact_run(const Data& d, const ProcessGroupPtr& pg, int rank, int W, Device dev) {
  DDPOptions o;
  o.exact().enabled = true;
  o.exact().global_batch = 24;
  o.exact().micro_batch = 2;
  o.bucket_cap_mb(512.0 / (1 << 20)).first_bucket_mb(512.0 / (1 << 20));
  Generator g(3);
  auto model = nn::mlp({16, 32, 32, 5}, "relu", &g);
  model->to(dev);
  DDP ddp(model, pg, o);
  auto opt = make_opt("sgd", ddp.parameters());
  const std::int64_t per = 12 / W;
  Params out(1);
  for (int step = 0; step < 3; ++step) {
    opt->zero_grad();
    for (std::int64_t m = rank * per; m < (rank + 1) * per; ++m) {
      const std::int64_t b = (step * 24 + m * 2) % (d.x.shape()[0] - 2);
      Tensor loss = cross_entropy(ddp.forward(d.x.narrow_rows(b, b + 2).to(dev)), d.y.narrow_rows(b, b + 2).to(dev));
      out[0].push_back(static_cast<float>(loss.item()));
      loss.backward();
    }
    opt->step();
  }
  for (auto& p : host_params(ddp.parameters())) out.push_back(std::move(p));
  return out;
}

bool identical(const Params& a, const Params& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

/// W forked ranks over gloo; each runs `body(pg, rank)` after switching the sim device to `mode`
/// (and setting `env` before the group is made). Returns whether every rank exited 0.
template <class Body>
bool run_world(int W, int mode, const char* env, Body body) {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(W, [&](int rank) {
    set_num_threads(1);
    // A run that goes wrong on purpose may leave its ranks out of step: a write to a peer that
    // has exited is then an error this rank reports, not a SIGPIPE that kills it unheard.
    ::signal(SIGPIPE, SIG_IGN);
    set_async(mode);
    if (env) ::putenv(const_cast<char*>(env));
    set_rank_env(rank, W, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions io;
    io.timeout = std::chrono::seconds(30);
    auto pg = parallel::init_process_group(io);
    const int code = body(pg, rank);
    parallel::destroy_process_group();
    return code;
  }, std::chrono::seconds(120));
  bool ok = true;
  for (int r = 0; r < W; ++r)
    if (results[r].exit_code != 0 || results[r].signal != 0) {
      ok = false;
      MESSAGE("rank ", r, " exited with code ", results[r].exit_code, ", signal ", results[r].signal);
    }
  return ok;
}

}  // namespace

TEST_CASE("async sim: kernels queue until the host waits, host reads wait, frees are stream-ordered") {
  (void)pending();
  (void)freed_poisoned(nullptr);
  Mode lazy(kLazy);
  DeviceKernels& k = kernels_for(Device::sim());
  Tensor a = full({1000}, 1.5, DType::Float32, Device::sim());
  Tensor b = a * 2.f;
  CHECK(pending() >= 2);  // the fill and the multiply have not run
  // A communication-stream thread reads the bytes as they are now: the poison (NaN).
  std::vector<float> now(1000);
  k.set_comm_stream(true);
  k.copy_to_host(now.data(), b.raw_data(), b.nbytes());
  k.set_comm_stream(false);
  CHECK(std::isnan(now[0]));
  // An event recorded now completes once the queue ran up to it.
  void* ev = k.event_create(0);
  k.event_record(ev);
  CHECK_FALSE(k.event_query(ev));
  k.event_synchronize(ev);
  CHECK(k.event_query(ev));
  k.event_destroy(ev);
  // The compute stream's reader waits: the values.
  CHECK(b.to_vector<float>() == std::vector<float>(1000, 3.f));
  CHECK(pending() == 0);
  // A freed block is released (poisoned, quarantined) only after the work queued before the free.
  const void* p = nullptr;
  {
    Tensor c = b + 1.f;
    p = c.raw_data();
  }
  CHECK(freed_poisoned(p) == -1);  // the free is queued behind the add: still live
  CHECK(a.to_vector<float>()[0] == 1.5f);  // drains the queue
  CHECK(freed_poisoned(p) == 1);
}

TEST_CASE("async sim, W = 2 and 3: DDP (buckets, fp16 hook), SyncBatchNorm and exact mode are the CPU's bits") {
  const Data d = make_data(96);
  for (int W : {2, 3}) {
    CAPTURE(W);
    const bool ok = run_world(W, kLazy, nullptr, [&](const ProcessGroupPtr& pg, int rank) {
      for (bool fp16 : {false, true}) {
        const Params cpu = ddp_run(d, pg, rank, W, Device::cpu(), fp16);
        const Params sim = ddp_run(d, pg, rank, W, Device::sim(), fp16);
        REQUIRE_RANK(rank, identical(cpu, sim), fp16 ? "DDP with the fp16 hook" : "DDP");
      }
      REQUIRE_RANK(rank, identical(sync_bn_run(d, pg, rank, W, Device::cpu()), sync_bn_run(d, pg, rank, W, Device::sim())),
                   "SyncBatchNorm under DDP");
      REQUIRE_RANK(rank, identical(exact_run(d, pg, rank, W, Device::cpu()), exact_run(d, pg, rank, W, Device::sim())),
                   "exact mode");
      return 0;
    });
    CHECK(ok);
  }
}

TEST_CASE("async sim, W = 2, eager worker (races as a GPU's): DDP with >= 4 buckets is the CPU's bits") {
  const Data d = make_data(96);
  CHECK(run_world(2, kEager, nullptr, [&](const ProcessGroupPtr& pg, int rank) {
    REQUIRE_RANK(rank, identical(ddp_run(d, pg, rank, 2, Device::cpu(), false), ddp_run(d, pg, rank, 2, Device::sim(), false)),
                 "DDP");
    return 0;
  }));
}

TEST_CASE("async sim: a collective that skips its ready-event wait reads what the stream has not written yet") {
  const Data d = make_data(96);
  // Every rank: the CPU run, then the sim run, whose bucket allreduces gloo runs on bytes the
  // lazy stream has not written yet (the backward that produces them has not run): the
  // weights must differ from the CPU's (NaN from the poison, or stale gradients).
  static char allreduce_only[] = "PHALANX_TEST_SKIP_READY_WAIT=allreduce";
  CHECK(run_world(2, kLazy, allreduce_only, [&](const ProcessGroupPtr& pg, int rank) {
    const Params cpu = ddp_run(d, pg, rank, 2, Device::cpu(), false);
    const Params sim = ddp_run(d, pg, rank, 2, Device::sim(), false);
    REQUIRE_RANK(rank, !identical(cpu, sim), "the run without the wait equals the CPU's: the mode proves nothing");
    bool nan = false;
    for (const auto& p : sim)
      for (float v : p) nan = nan || std::isnan(v);
    std::printf("rank %d: without the allreduce's ready-event wait the weights differ from the CPU's%s\n", rank,
                nan ? " (NaN: poison was reduced)" : "");
    return 0;
  }));
  // Every operation: the model's broadcasts and shape check at construction already read
  // unwritten memory (a length of -1 from the poison), and the run fails.
  static char every[] = "PHALANX_TEST_SKIP_READY_WAIT=1";
  CHECK(run_world(2, kLazy, every, [&](const ProcessGroupPtr& pg, int rank) {
    (void)ddp_run(d, pg, rank, 2, Device::cpu(), false);
    try {
      (void)ddp_run(d, pg, rank, 2, Device::sim(), false);
    } catch (const Error& e) {
      std::printf("rank %d: without any ready-event wait the run failed: %s\n", rank, e.what());
      return 0;
    }
    REQUIRE_RANK(rank, false, "DDP on sim ran without any ready-event wait");
    return 1;
  }));
}

TEST_CASE("async sim: a kernel's error on the worker is still reported after a fork") {
  Mode lazy(kLazy);
  DeviceKernels& k = kernels_for(Device::sim());
  Tensor a = zeros({4}, DType::Float32, Device::sim());
  // A copy from a sim address no block holds: queued now, fails on the worker.
  const auto bogus = reinterpret_cast<const void*>((std::uintptr_t(1) << 55) | 64);
  k.copy(a.raw_data(), bogus, 16);
  // The fork drains the stream first (the child starts on a fresh one): the parent must
  // still see the failure, at its next host read, as it would without the fork.
  const auto child = run_processes(1, [](int) { return 0; });
  CHECK(child[0].exit_code == 0);
  CHECK_THROWS_AS((void)a.to_vector<float>(), ValueError);
}

TEST_CASE("async sim: a process that exits with kernels still queued exits cleanly") {
  // The worker must not run kernels while exit() destroys what they use.
  for (int mode : {kEager, kLazy}) {
    CAPTURE(mode);
    const auto r = run_processes(1, [mode](int) {
      set_async(mode);
      Tensor a = full({1 << 16}, 1.f, DType::Float32, Device::sim());
      for (int i = 0; i < 2000; ++i) a = a * 1.0001f + 0.5f;
      std::exit(0);  // static destructors and atexit handlers run (run_processes would _exit)
      return 0;
    });
    CHECK(r[0].exit_code == 0);
    CHECK(r[0].signal == 0);
  }
}

TEST_CASE("async sim: without the allreduce's ready-event wait each scenario goes wrong, not only DDP") {
  // The proof above covers plain DDP; the hook, SyncBatchNorm and exact mode are checked
  // bit-equal too, so each must also be shown to fail when the wait is skipped (each in a
  // world of its own: a rank that fails may leave its peer's collectives unmatched). A run
  // that throws (poison read as a length, say) counts as failing.
  const Data d = make_data(96);
  static char allreduce_only[] = "PHALANX_TEST_SKIP_READY_WAIT=allreduce";
  const char* names[] = {"DDP with the fp16 hook", "SyncBatchNorm under DDP", "exact mode"};
  for (int scenario = 0; scenario < 3; ++scenario) {
    CAPTURE(names[scenario]);
    CHECK(run_world(2, kLazy, allreduce_only, [&](const ProcessGroupPtr& pg, int rank) {
      const auto run = [&](Device dev) {
        if (scenario == 0) return ddp_run(d, pg, rank, 2, dev, true);
        if (scenario == 1) return sync_bn_run(d, pg, rank, 2, dev);
        return exact_run(d, pg, rank, 2, dev);
      };
      const Params cpu = run(Device::cpu());
      bool same = false;
      try {
        same = identical(cpu, run(Device::sim()));
      } catch (const Error& e) {
        std::printf("rank %d: %s without the wait failed: %s\n", rank, names[scenario], e.what());
      }
      REQUIRE_RANK(rank, !same, std::string(names[scenario]) + " without the allreduce's wait equals the CPU's");
      return 0;
    }));
  }
}

TEST_CASE("async sim: an event wait reports a queued kernel's error, as cudaEventSynchronize does") {
  Mode lazy(kLazy);
  DeviceKernels& k = kernels_for(Device::sim());
  Tensor a = zeros({4}, DType::Float32, Device::sim());
  const auto bogus = reinterpret_cast<const void*>((std::uintptr_t(1) << 55) | 64);
  k.copy(a.raw_data(), bogus, 16);  // fails on the worker
  void* ev = k.event_create(0);
  k.event_record(ev);
  // A collective's thread waits here before reading its inputs: it must not go on to move
  // bytes a failed kernel never wrote.
  CHECK_THROWS_AS(k.event_synchronize(ev), ValueError);
  k.event_destroy(ev);
  // Still reported to the compute thread's next host read.
  CHECK_THROWS_AS((void)a.to_vector<float>(), ValueError);
}

TEST_CASE("async sim, lazy: the memory queued work holds stays bounded") {
  // Every queued kernel holds its tensors: 4096 of them (the queue's item bound) on 256 KiB
  // tensors held 1 GiB. The lazy stream also runs once the blocks allocated since it last
  // ran exceed Stream::kLazyBytes (256 MiB).
  static const auto live_bytes = reinterpret_cast<std::size_t (*)()>(sim_symbol("phalanx_sim_live_bytes"));
  Mode lazy(kLazy);
  Tensor a = full({1 << 16}, 1.f, DType::Float32, Device::sim());
  std::size_t peak = 0;
  for (int i = 0; i < 2000; ++i) {
    a = a * 1.0001f + 0.5f;
    peak = std::max(peak, live_bytes());
  }
  MESSAGE("peak live sim bytes: ", peak >> 20, " MiB");
  CHECK(peak < (std::size_t(400) << 20));
  CHECK(std::isfinite(a.to_vector<float>()[0]));
}

// ---- stream-ordered Works: a backend that orders device streams itself (NCCL's shape) ----

TEST_CASE("async sim, side stream: the ready event is the issue's, and wait() does not block the host") {
  Mode lazy(kLazy);
  auto pg = side_group(make_world_of_one());
  Tensor t = full({64}, 1.f, DType::Float32, Device::sim());
  auto w = pg->allreduce(t);  // its ready event covers the fill, not what is issued next
  Tensor v = full({64}, 3.f, DType::Float32, Device::sim());
  for (int i = 0; i < 50; ++i) v = v + 1.f;
  w->wait();  // once the worker queued it: a device-side wait, no host wait for the device
  CHECK(w->on_device());
  CHECK_FALSE(w->is_completed());  // lazy: nothing made the side stream run yet
  Tensor u = t * 2.f;              // queued behind the compute stream's wait for the allreduce
  w->synchronize();                // the side stream runs; it waited for the fill only
  CHECK(w->is_completed());
  CHECK(pending() >= 50);  // the kernels issued after the allreduce were not run for it
  CHECK(u.to_vector<float>() == std::vector<float>(64, 2.f));
  CHECK(v.to_vector<float>() == std::vector<float>(64, 53.f));
}

TEST_CASE("async sim, side stream, W = 2 and 3: DDP, the fp16 hook, SyncBatchNorm and exact mode are the CPU's bits") {
  const Data d = make_data(96);
  for (int W : {2, 3}) {
    CAPTURE(W);
    CHECK(run_world(W, kLazy, nullptr, [&](const ProcessGroupPtr& pg, int rank) {
      auto side = side_group(pg);
      for (bool fp16 : {false, true})
        REQUIRE_RANK(rank, identical(ddp_run(d, pg, rank, W, Device::cpu(), fp16), ddp_run(d, side, rank, W, Device::sim(), fp16)),
                     fp16 ? "DDP with the fp16 hook" : "DDP");
      REQUIRE_RANK(rank, identical(sync_bn_run(d, pg, rank, W, Device::cpu()), sync_bn_run(d, side, rank, W, Device::sim())),
                   "SyncBatchNorm under DDP");
      REQUIRE_RANK(rank, identical(exact_run(d, pg, rank, W, Device::cpu()), exact_run(d, side, rank, W, Device::sim())),
                   "exact mode");
      return 0;
    }));
  }
  // Eager: the side stream and the compute stream race, as a GPU's.
  CHECK(run_world(2, kEager, nullptr, [&](const ProcessGroupPtr& pg, int rank) {
    auto side = side_group(pg);
    REQUIRE_RANK(rank, identical(ddp_run(d, pg, rank, 2, Device::cpu(), false), ddp_run(d, side, rank, 2, Device::sim(), false)),
                 "DDP (eager)");
    return 0;
  }));
}

TEST_CASE("async sim, side stream: without Work::wait's device-side wait each scenario goes wrong") {
  // PHALANX_TEST_SKIP_DEVICE_ORDER=wait_allreduce: an allreduce's wait() returns without making
  // the compute stream wait for it, so what reads its output (the bucket's copy back to the
  // gradients, SyncBatchNorm's statistics, exact mode's sums) reads it before it is written:
  // the step uses this rank's own values. =wait (every operation): the same for every
  // collective whose result stays on the device (host readers synchronize()). W = 3: DDP's
  // division by the world size runs before the skipped sum, and the reducer's host check
  // after the pass flag then lets the sum run on the divided values: at W = 2 that is the
  // CPU's result bit for bit (a division by 2 is exact), at W = 3 it is not.
  const Data d = make_data(96);
  static char skip_allreduce[] = "PHALANX_TEST_SKIP_DEVICE_ORDER=wait_allreduce";
  static char skip_every[] = "PHALANX_TEST_SKIP_DEVICE_ORDER=wait";
  const char* names[] = {"DDP", "DDP with the fp16 hook", "SyncBatchNorm under DDP", "exact mode", "DDP (every wait)"};
  for (int scenario = 0; scenario < 5; ++scenario) {
    CAPTURE(names[scenario]);
    CHECK(run_world(3, kLazy, scenario < 4 ? skip_allreduce : skip_every, [&](const ProcessGroupPtr& pg, int rank) {
      auto side = side_group(pg);
      const auto run = [&](const ProcessGroupPtr& g, Device dev) {
        if (scenario == 0 || scenario == 4) return ddp_run(d, g, rank, 3, dev, false);
        if (scenario == 1) return ddp_run(d, g, rank, 3, dev, true);
        if (scenario == 2) return sync_bn_run(d, g, rank, 3, dev);
        return exact_run(d, g, rank, 3, dev);
      };
      const Params cpu = run(pg, Device::cpu());
      bool same = false, threw = false;
      try {
        same = identical(cpu, run(side, Device::sim()));
      } catch (const Error& e) {
        threw = true;
        std::printf("rank %d: %s without the device-side wait failed: %s\n", rank, names[scenario], e.what());
      }
      if (!threw && !same) std::printf("rank %d: %s without the device-side wait differs from the CPU\n", rank, names[scenario]);
      REQUIRE_RANK(rank, !same, std::string(names[scenario]) + " without the device-side wait equals the CPU's");
      return 0;
    }));
  }
}

TEST_CASE("async sim, side stream: a collective's tensors are held until its done event completed") {
  // The caller drops its handle at once; the block must not go back to the allocator (freed,
  // poisoned, quarantined) before the side stream has written it. With
  // PHALANX_TEST_SKIP_DEVICE_ORDER=hold the group releases the handles when the worker is
  // done with the operation: the free runs first, and the collective writes a freed block.
  static char hold[] = "PHALANX_TEST_SKIP_DEVICE_ORDER=hold";
  for (const char* env : {static_cast<const char*>(nullptr), static_cast<const char*>(hold)}) {
    CAPTURE((env ? env : "held"));
    CHECK(run_world(2, kLazy, env, [&](const ProcessGroupPtr& pg, int rank) {
      auto side = side_group(pg);
      Tensor t = full({256}, 1.f + rank, DType::Float32, Device::sim());
      const void* p = t.raw_data();
      auto w = side->allreduce(t);
      t = Tensor();
      // Host reads drain the compute stream, where a released block's free is queued.
      Tensor probe = zeros({1}, DType::Float32, Device::sim());
      for (int i = 0; i < 100 && freed_poisoned(p) == -1; ++i) {
        (void)probe.to_vector<float>();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      bool failed = false;
      try {
        w->synchronize();
      } catch (const Error& e) {
        failed = true;
        std::printf("rank %d: the collective on a released block failed: %s\n", rank, e.what());
      }
      if (!env) {
        REQUIRE_RANK(rank, !failed, "the held collective failed");
        // The handles go once the completion thread finished the Work; the free follows.
        for (int i = 0; i < 500 && freed_poisoned(p) == -1; ++i) {
          (void)probe.to_vector<float>();
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        REQUIRE_RANK(rank, freed_poisoned(p) == 1, "the block was not freed intact after the collective");
      } else {
        REQUIRE_RANK(rank, failed || freed_poisoned(p) == 0, "a released block was not caught");
      }
      return 0;
    }));
  }
}

TEST_CASE("async sim, side stream: a failure found after wait() returned reaches host readers") {
  // The collective ran (its bytes are right) but the watcher fails it afterwards, as NCCL's
  // watchdog does on a timeout or a peer's asynchronous error: wait() had already returned
  // (a device-side wait), so a caller that reads the result on the host must learn of it
  // (Work::synchronize), not act on what an aborted collective left behind.
  Mode lazy(kLazy);
  {
    auto pg = side_group(make_world_of_one());
    side_backend(pg).fail_from_ = pg->sequence_number();
    CHECK_THROWS_AS(parallel::all_reduce_scalar(2.0, ReduceOp::Sum, pg, Device::sim()), CommError);
  }
  // DDP: a bucket's reduction fails after the backward's waits returned; the backward (where
  // the pass flag's read synchronises the host) must throw, before the optimizer steps.
  const Data d = make_data(96);
  CHECK(run_world(2, kLazy, nullptr, [&](const ProcessGroupPtr& pg, int rank) {
    auto side = side_group(pg);
    DDPOptions o;
    o.bucket_cap_mb(512.0 / (1 << 20)).first_bucket_mb(512.0 / (1 << 20));
    auto model = many_small_one_large();
    model->to(Device::sim());
    DDP ddp(model, side, o);
    const Tensor x = d.x.narrow_rows(0, 8).to(Device::sim()), y = d.y.narrow_rows(0, 8).to(Device::sim());
    cross_entropy(ddp.forward(x), y).backward();  // a good step first
    side_backend(side).fail_from_ = side->sequence_number();
    bool threw = false;
    try {
      cross_entropy(ddp.forward(x), y).backward();
    } catch (const CommError& e) {
      threw = true;
      std::printf("rank %d: %s\n", rank, e.what());
    }
    REQUIRE_RANK(rank, threw, "the backward whose bucket failed after its wait() returned did not throw");
    return 0;
  }));
}

TEST_CASE("async sim, side stream: a collective that failed before the device ran it keeps its tensors") {
  // The watchdog times an operation out while the device has not run it (lazy: nothing made
  // the side stream run). The caller dropped its tensor; the block must stay allocated until
  // the group is gone (its backend drains its stream first), not go back to the allocator
  // when the failure is found, while work queued on the stream still writes it.
  CHECK(run_world(2, kLazy, nullptr, [&](const ProcessGroupPtr& pg, int rank) {
    const void* p = nullptr;
    Tensor probe = zeros({1}, DType::Float32, Device::sim());
    {
      auto side = side_group(pg);
      side_backend(side).timeout_from_ = side->sequence_number();
      Tensor t = full({256}, 1.f + rank, DType::Float32, Device::sim());
      p = t.raw_data();
      auto w = side->allreduce(t);
      t = Tensor();
      for (int i = 0; i < 5000 && !w->is_completed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      REQUIRE_RANK(rank, w->is_completed() && w->exception(), "the watcher did not fail the operation");
      for (int i = 0; i < 50 && freed_poisoned(p) == -1; ++i) {  // frees queued on the compute stream run
        (void)probe.to_vector<float>();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      REQUIRE_RANK(rank, freed_poisoned(p) == -1, "a failed operation's tensor was released before its stream ran it");
    }
    for (int i = 0; i < 500 && freed_poisoned(p) == -1; ++i) {
      (void)probe.to_vector<float>();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    REQUIRE_RANK(rank, freed_poisoned(p) == 1, "the block was not freed intact once the group was gone");
    return 0;
  }));
}
