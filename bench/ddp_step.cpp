// DDP benchmarks, 2 workers on this 2-core machine, Phalanx over shared memory ("shm") and
// over TCP ("gloo") beside PyTorch DDP (gloo) in the same run, each the median of N runs
// (default 5, `--runs N`) with its spread (issues 7 and 14):
//   1. the textbook's demo (Linear 64->10, 512 samples, batch 32 per worker, SGD lr 0.05):
//      time per step (the bar: <= 10 us on shared memory; PyTorch DDP ~1600 us);
//   2. MLP 784-1024-1024-10, 128 samples per worker, SGD momentum: 2 workers' samples/s against
//      one worker's (the bar: >= 1.8x on shared memory) and against the ceiling, two
//      independent one-worker processes at once (the bar: >= 0.95 of it; one process
//      alone has the whole machine, two share caches and memory bandwidth as DDP's workers
//      do), and against the same two processes in lock step (a barrier after every step,
//      no data: what waiting for the slower of two costs before any reduction); shm with its
//      zero-copy buckets (the default) beside the staged path (PHALANX_SHM_ZERO_COPY=0); how
//      much allreduce is hidden;
//   3. a bucket-size sweep (1, 5, 25, 100 MiB) on the MLP, 2 workers, the default backend;
//   4. only with --hook fp16|bf16|all (issue 30): the MLP, 2 workers, the float32 reduction
//      beside the fp16/bf16 compression hooks on shm and gloo and PyTorch's hooks (gloo):
//      time per step, bytes per worker per step, the weights' difference after 23 steps.
// The runs of every configuration alternate, so a drift of the machine's load hits them all.
// Every figure: median [fastest, slowest] of the runs; ratios of the medians. The PyTorch
// peer is launched once per run (bench/peers/torch_ddp.py).
// A backend whose plugin cannot run here reads -1.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <ctime>
#include <thread>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

void worker_env(int rank, int world, int port, const std::string& backend) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("PHALANX_STORE_HOSTED", "1", 1);
  if (backend.empty())
    ::unsetenv("PHALANX_BACKEND");  // auto: shm on one host when its plugin can run
  else
    ::setenv("PHALANX_BACKEND", backend.c_str(), 1);
  set_num_threads(1);
}

/// The textbook's demo: microseconds per step.
double demo_us(int world, int epochs, const std::string& backend) {
  if (!backend.empty() && !backend_available(backend)) return -1;
  TcpStoreServer server(TcpStoreOptions{});
  const std::string out = bench::run_ranks(world, [&](int rank, std::FILE* f) {
    worker_env(rank, world, server.port(), backend);
    auto pg = parallel::init_process_group();
    Generator g(0);
    auto model = std::make_shared<parallel::DDP>(std::make_shared<nn::Linear>(64, 10, true, &g), pg);
    auto data = std::make_shared<TensorDataset>(randn({512, 64}, &g), randint(10, {512}, &g));
    auto sampler = std::make_shared<DistributedSampler>(512);
    DataLoader loader(data, {32}, sampler);
    optim::SGD opt(model->parameters(), optim::SGDOptions{0.05});
    auto epoch = [&](std::int64_t e) {
      loader.set_epoch(e);
      int n = 0;
      for (Batch& b : loader) {
        opt.zero_grad();
        cross_entropy(model->forward(b.x), b.y).backward();
        opt.step();
        ++n;
      }
      return n;
    };
    epoch(0);
    pg->barrier()->wait();
    const double t = bench::now_s();
    int steps = 0;
    for (int e = 1; e <= epochs; ++e) steps += epoch(e);
    if (f) std::fprintf(f, "step_us=%f\n", (bench::now_s() - t) / steps * 1e6);
  });
  return bench::find_value(out, "step_us");
}

/// A backend whose operations do nothing, on the group's usual worker thread: what issuing a
/// collective and waiting for it costs before any byte moves (the worker-thread hop).
class HopOnly final : public Backend {
 public:
  HopOnly() : Backend(0, 1, std::chrono::seconds(30)) {}
  std::string name() const override { return "hop-only"; }

 protected:
  void run_allreduce(Tensor&, ReduceOp, std::uint64_t) override {}
  void run_broadcast(Tensor&, int, std::uint64_t) override {}
  void run_allgather(std::vector<Tensor>&, const Tensor&, std::uint64_t) override {}
  void run_reduce_scatter(Tensor&, std::vector<Tensor>&, ReduceOp, std::uint64_t) override {}
  void run_reduce(Tensor&, int, ReduceOp, std::uint64_t) override {}
  void run_gather(std::vector<Tensor>&, const Tensor&, int, std::uint64_t) override {}
  void run_scatter(Tensor&, std::vector<Tensor>&, int, std::uint64_t) override {}
  void run_barrier(std::uint64_t) override {}
  void run_send(const Tensor&, int, int, std::uint64_t) override {}
  void run_recv(Tensor&, int, int, std::uint64_t) override {}
};

/// Microseconds per allreduce issued and waited for on a HopOnly group (one process).
double hop_us(int iters) {
  ProcessGroup pg(std::make_unique<HopOnly>());
  Tensor t = ones({651});
  for (int i = 0; i < iters / 10; ++i) pg.allreduce(t)->wait();
  const double t0 = bench::now_s();
  for (int i = 0; i < iters; ++i) pg.allreduce(t)->wait();
  return (bench::now_s() - t0) / iters * 1e6;
}

/// Where the demo's step goes, 2 workers on `backend`, the same batch every step (no data
/// loader): the step without DDP (forward, backward, SGD), one allreduce of the demo's bucket
/// (650 gradients + the pass flag) issued and waited for, and the DDP step.
struct DemoParts {
  double compute_us = -1, allreduce_us = -1, ddp_us = -1;
};
DemoParts demo_parts(const std::string& backend, int iters) {
  if (!backend_available(backend)) return {};
  TcpStoreServer server(TcpStoreOptions{});
  const std::string out = bench::run_ranks(2, [&](int rank, std::FILE* f) {
    worker_env(rank, 2, server.port(), backend);
    auto pg = parallel::init_process_group();
    Generator g(0);
    auto lin = std::make_shared<nn::Linear>(64, 10, true, &g);
    const Tensor x = randn({32, 64}, &g), y = randint(10, {32}, &g);
    auto time_steps = [&](nn::Module& m) {
      optim::SGD opt(m.parameters(), optim::SGDOptions{0.05});
      auto step = [&] {
        opt.zero_grad();
        cross_entropy(m.forward(x), y).backward();
        opt.step();
      };
      for (int i = 0; i < iters / 10; ++i) step();
      pg->barrier()->wait();
      const double t = bench::now_s();
      for (int i = 0; i < iters; ++i) step();
      return (bench::now_s() - t) / iters * 1e6;
    };
    const double compute = time_steps(*lin);
    Tensor bucket = ones({651});
    for (int i = 0; i < iters / 10; ++i) pg->allreduce(bucket)->wait();
    pg->barrier()->wait();
    const double t = bench::now_s();
    for (int i = 0; i < iters; ++i) pg->allreduce(bucket)->wait();
    const double allreduce = (bench::now_s() - t) / iters * 1e6;
    parallel::DDP ddp(lin, pg);
    const double step = time_steps(ddp);
    if (f) std::fprintf(f, "compute_us=%f allreduce_us=%f ddp_us=%f\n", compute, allreduce, step);
  });
  return {bench::find_value(out, "compute_us"), bench::find_value(out, "allreduce_us"), bench::find_value(out, "ddp_us")};
}

struct MlpResult {
  double step_us = -1, hidden = 0, cpu_us = -1;  ///< cpu: rank 0's process (all its threads) per step
  double elements = -1;  ///< hook section: elements all-reduced per step (the buckets' sizes)
};

double process_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

/// Rank 0's parameters, flattened, appended to `path` as raw float32 (the hook section's
/// accuracy check reads them back with read_floats).
void write_params(const std::vector<Tensor>& params, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  for (const Tensor& p : params) {
    const std::vector<float> v = p.detach().to_vector<float>();
    std::fwrite(v.data(), sizeof(float), v.size(), f);
  }
  std::fclose(f);
}

std::vector<float> read_floats(const std::string& path) {
  std::vector<float> v;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    float buf[4096];
    for (std::size_t n; (n = std::fread(buf, sizeof(float), 4096, f)) > 0;) v.insert(v.end(), buf, buf + n);
    std::fclose(f);
  }
  return v;
}

/// The hook section's options for mlp(): which comm hook reduces the buckets ("none": the
/// default float32 allreduce), and where rank 0 writes its parameters before the first step
/// (`init_file`) and after the last (`final_file`). With a final_file each rank draws its own
/// batch (Generator(100 + rank)), so the two workers' gradients differ and the reduction matters.
struct HookRun {
  std::string hook = "none", init_file, final_file;
};

/// How a shm group runs: the defaults (inline, gradient buckets in zero-copy buffers), on its
/// worker thread (PHALANX_SHM_INLINE=0), or with buckets staged through the slots
/// (PHALANX_SHM_ZERO_COPY=0). Set in each rank's process.
enum class ShmPath { zero_copy, worker_thread, staged };

/// MLP 784-1024-1024-10 at 128 samples per worker (world 1 = no DDP).
/// With `hr`, the hook section's run: its result also carries `bytes`, what each worker sends per
/// step by the formula of wire_bytes().
MlpResult mlp(int world, int steps, const std::string& backend, double bucket_mb = 25.0,
              ShmPath shm_path = ShmPath::zero_copy,
              const HookRun* hr = nullptr) {
  if (!backend.empty() && !backend_available(backend)) return {};
  TcpStoreServer server(TcpStoreOptions{});
  const std::string out = bench::run_ranks(world, [&](int rank, std::FILE* f) {
    worker_env(rank, world, server.port(), backend);
    if (shm_path == ShmPath::worker_thread) ::setenv("PHALANX_SHM_INLINE", "0", 1);
    if (shm_path == ShmPath::staged) ::setenv("PHALANX_SHM_ZERO_COPY", "0", 1);
    auto pg = parallel::init_process_group();
    Generator g(0);
    nn::ModulePtr model = nn::mlp({784, 1024, 1024, 10}, "relu", &g);
    std::shared_ptr<parallel::DDP> ddp;
    if (world > 1) {
      parallel::DDPOptions o;
      o.bucket_cap_mb(bucket_mb);
      ddp = std::make_shared<parallel::DDP>(model, pg, o);
      if (hr && hr->hook == "fp16") ddp->register_comm_hook(parallel::fp16_compress_hook());
      if (hr && hr->hook == "bf16") ddp->register_comm_hook(parallel::bf16_compress_hook());
      model = ddp;
    }
    optim::SGD opt(model->parameters(), optim::SGDOptions(0.01).momentum(0.9));
    Generator data_gen(hr ? 100 + rank : 0);
    Tensor x = randn({128, 784}, hr ? &data_gen : &g), y = randint(10, {128}, hr ? &data_gen : &g);
    if (hr && rank == 0 && f) {
      write_params(model->parameters(), hr->init_file);
      // Elements each bucket all-reduces: its parameters' gradients, plus the pass flag in the
      // last bucket (parallel/ddp/src/reducer.cpp).
      const std::vector<Tensor> params = model->parameters();
      const auto layout = ddp->bucket_layout();
      std::int64_t elements = 0;
      for (std::size_t b = 0; b < layout.size(); ++b) {
        for (std::size_t p : layout[b]) elements += params[p].numel();
        if (b + 1 == layout.size()) elements += 1;
      }
      std::fprintf(f, "elements=%lld buckets=%zu\n", static_cast<long long>(elements), layout.size());
    }
    double hidden = 0;
    auto step = [&] {
      opt.zero_grad();
      cross_entropy(model->forward(x), y).backward();
      opt.step();
      if (ddp && ddp->last_comm_seconds() > 0) hidden += 1.0 - ddp->last_wait_seconds() / ddp->last_comm_seconds();
    };
    for (int i = 0; i < 3; ++i) step();
    hidden = 0;
    pg->barrier()->wait();
    const double t = bench::now_s(), c = process_cpu_s();
    for (int i = 0; i < steps; ++i) step();
    if (f)
      std::fprintf(f, "step_us=%f hidden=%f cpu_us=%f\n", (bench::now_s() - t) / steps * 1e6, hidden / steps,
                   (process_cpu_s() - c) / steps * 1e6);
    if (hr && rank == 0 && f) write_params(model->parameters(), hr->final_file);
  });
  if (hr) return {bench::find_value(out, "step_us"), 0, -1, bench::find_value(out, "elements")};
  return {bench::find_value(out, "step_us"), bench::find_value(out, "hidden"), bench::find_value(out, "cpu_us")};
}

/// The ceiling for 2 workers on this machine: two independent one-worker processes (no
/// process group, no DDP) running the MLP step at the same time, started together (a pipe
/// handshake); samples/s of both together, from each one's own time per step. On 2 cores the
/// two share the memory bandwidth and caches as DDP's workers do, so this, not one process
/// alone with the machine to itself, is what 2 workers can reach.
struct Ceiling {
  double rate = -1, cpu_us = -1;  ///< samples/s of both; CPU time per step of rank 0's process
};

/// Two processes' barrier in a shared anonymous mapping (made before the fork): the lock-step
/// reference waits here after every step. Spins briefly, then yields while it waits.
struct StepBarrier {
  std::atomic<int> arrived{0};
  std::atomic<unsigned> generation{0};
  void wait() {
    const unsigned g = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    for (int spin = 0; generation.load(std::memory_order_acquire) == g; ++spin)
      if (spin > 200) std::this_thread::yield();
  }
};

/// `lockstep`: the two processes wait for each other after every step (no data exchanged),
/// so the result is the ceiling of any synchronous data-parallel step on this machine.
Ceiling ceiling_run(int steps, bool lockstep = false) {
  int ready[2][2], result[2];
  if (::pipe(ready[0]) != 0 || ::pipe(ready[1]) != 0 || ::pipe(result) != 0) return {};
  void* mem = ::mmap(nullptr, sizeof(StepBarrier), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return {};
  StepBarrier* barrier = new (mem) StepBarrier;
  const std::string out = bench::run_ranks(2, [&](int rank, std::FILE* f) {
    set_num_threads(1);
    Generator g(0);
    nn::ModulePtr model = nn::mlp({784, 1024, 1024, 10}, "relu", &g);
    optim::SGD opt(model->parameters(), optim::SGDOptions(0.01).momentum(0.9));
    Tensor x = randn({128, 784}, &g), y = randint(10, {128}, &g);
    auto step = [&] {
      opt.zero_grad();
      cross_entropy(model->forward(x), y).backward();
      opt.step();
    };
    for (int i = 0; i < 3; ++i) step();
    char c = 1;
    if (::write(ready[rank][1], &c, 1) != 1 || ::read(ready[1 - rank][0], &c, 1) != 1) throw std::runtime_error("handshake");
    const double t = bench::now_s(), cpu = process_cpu_s();
    for (int i = 0; i < steps; ++i) {
      step();
      if (lockstep) barrier->wait();
    }
    const double us = (bench::now_s() - t) / steps * 1e6, cpu_us = (process_cpu_s() - cpu) / steps * 1e6;
    if (rank == 1) {
      if (::write(result[1], &us, sizeof us) != sizeof us) throw std::runtime_error("result pipe");
    } else {
      double other = -1;
      if (::read(result[0], &other, sizeof other) != sizeof other) throw std::runtime_error("result pipe");
      std::fprintf(f, "rate=%f cpu_us=%f\n", 128 / (us * 1e-6) + 128 / (other * 1e-6), cpu_us);
    }
  });
  for (int* p : {ready[0], ready[1], result}) ::close(p[0]), ::close(p[1]);
  ::munmap(mem, sizeof(StepBarrier));
  return {bench::find_value(out, "rate"), bench::find_value(out, "cpu_us")};
}

double torch_us(int world, const std::string& args) {
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  return bench::find_value(bench::run_python_ranks(world, port, bench::peer_script("torch_ddp.py") + " " + args),
                           "step_us");
}

/// The PyTorch peer's hook run: step_us and the elements its buckets all-reduce per step; when
/// the peer could not run the hook, `error` holds its one-line reason (peer_error=...).
MlpResult torch_hook(const std::string& hook, const std::string& init_file, const std::string& final_file,
                     std::string& error) {
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  const std::string out = bench::run_python_ranks(
      2, port, bench::peer_script("torch_ddp.py") + " mlp 20 " + hook + " " + init_file + " " + final_file);
  const auto pos = out.find("peer_error=");
  if (pos != std::string::npos) error = out.substr(pos + 11, out.find('\n', pos) - pos - 11);
  return {bench::find_value(out, "step_us"), 0, -1, bench::find_value(out, "elements")};
}

/// Median and spread of one configuration's runs (-1 entries: did not run).
struct Stats {
  std::vector<double> v;
  void add(double x) {
    if (x > 0) v.push_back(x);
  }
  double median() const {
    if (v.empty()) return -1;
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
  }
  double lo() const { return v.empty() ? -1 : *std::min_element(v.begin(), v.end()); }
  double hi() const { return v.empty() ? -1 : *std::max_element(v.begin(), v.end()); }
};

void row(const char* name, const Stats& s, double scale, const char* unit) {
  if (s.v.empty()) {
    std::printf("   %-26s not run (plugin or peer missing)\n", name);
    return;
  }
  std::printf("   %-26s median %9.1f %s   spread %9.1f .. %9.1f   (%zu runs)\n", name, s.median() * scale, unit,
              s.lo() * scale, s.hi() * scale, s.v.size());
}

}  // namespace

int main(int argc, char** argv) {
  bool skip_peer = false;
  std::string only;  // "", "demo", "mlp", "sweep" or "hook" (only the --hook section)
  std::string hook_arg;  // --hook: "none" (default: no hook section), "fp16", "bf16" or "all"
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") {
      skip_peer = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--hook" && i + 1 < argc) {
      hook_arg = argv[++i];
      if (hook_arg != "none" && hook_arg != "fp16" && hook_arg != "bf16" && hook_arg != "all") {
        std::fprintf(stderr, "--hook takes none, fp16, bf16 or all (got '%s')\n", hook_arg.c_str());
        return 2;
      }
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_ddp_step [--no-peer] [--runs N] [--only demo|mlp|sweep|hook] [--hook none|fp16|bf16|all]\n");
      return 2;
    }
  }
  set_num_threads(1);  // as every worker does (worker_env)
  bench::print_environment("bench_ddp_step");
  std::printf("shm plugin: %s; %d runs per configuration\n\n", backend_available("shm") ? "yes" : "no (reads -1)", runs);

  if (only.empty() || only == "demo") {
    Stats demo_shm, demo_tcp, demo_torch;
    for (int r = 0; r < runs; ++r) {
      demo_shm.add(demo_us(2, 100, "shm"));
      demo_tcp.add(demo_us(2, 100, "gloo"));
      if (!skip_peer) demo_torch.add(torch_us(2, "demo 20"));
    }
    std::printf("1. textbook demo (Linear 64->10, batch 32/worker), 2 workers, time per step\n");
    row("phalanx shm", demo_shm, 1, "us");
    row("phalanx gloo (TCP)", demo_tcp, 1, "us");
    row("pytorch DDP (gloo)", demo_torch, 1, "us");
    std::printf("   bar: shm <= 10 us: %s; pytorch/phalanx shm %.0fx (medians)\n",
                demo_shm.median() > 0 && demo_shm.median() <= 10 ? "met" : "NOT met",
                demo_torch.median() > 0 && demo_shm.median() > 0 ? demo_torch.median() / demo_shm.median() : 0.0);
    const bench::Summary torch_demo = bench::summarise(demo_torch.v);
    bench::result_row("bench_ddp_step", "textbook demo step, 2 workers, shm", bench::summarise(demo_shm.v),
                      "PyTorch DDP (gloo)", torch_demo, "us", 1,
                      demo_shm.median() > 0 ? std::string("shm <= 10 us: ") + (demo_shm.median() <= 10 ? "met" : "NOT met") : "-");
    bench::result_row("bench_ddp_step", "textbook demo step, 2 workers, gloo (TCP)", bench::summarise(demo_tcp.v),
                      "PyTorch DDP (gloo)", torch_demo, "us", 1, "-");
    std::printf("   where the step goes (same batch every step, no data loader; medians):\n");
    for (const std::string backend : {"shm", "gloo"}) {
      Stats compute, allreduce, ddp;
      for (int r = 0; r < runs; ++r) {
        const DemoParts p = demo_parts(backend, 2000);
        compute.add(p.compute_us);
        allreduce.add(p.allreduce_us);
        ddp.add(p.ddp_us);
      }
      if (ddp.v.empty()) continue;
      std::printf("   %-5s step without DDP %6.1f us, allreduce of the bucket (2.6 kB) %6.1f us, DDP step %6.1f us: "
                  "DDP adds %.1f us beyond compute + allreduce\n",
                  backend.c_str(), compute.median(), allreduce.median(), ddp.median(),
                  ddp.median() - compute.median() - allreduce.median());
    }
    Stats hop;
    for (int r = 0; r < runs; ++r) hop.add(hop_us(20000));
    std::printf("   issuing a collective and waiting for it, no bytes moved, on a group's worker thread: %.1f us "
                "(median; shm runs its collectives on the caller's thread and skips this)\n\n",
                hop.median());
  }

  if (only.empty() || only == "mlp") {
    Stats one, shm2, shm2_thread, shm2_staged, tcp2, hid_tcp, t1, t2, cpu1, cpu2, ceiling, cpu_ceiling, lockstep;
    for (int r = 0; r < runs; ++r) {
      const Ceiling top = ceiling_run(20);
      ceiling.add(top.rate);
      cpu_ceiling.add(top.cpu_us);
      lockstep.add(ceiling_run(20, true).rate);
      const MlpResult o = mlp(1, 20, ""), a = mlp(2, 20, "shm");
      one.add(o.step_us);
      cpu1.add(o.cpu_us);
      shm2.add(a.step_us);
      cpu2.add(a.cpu_us);
      shm2_thread.add(mlp(2, 20, "shm", 25.0, ShmPath::worker_thread).step_us);
      shm2_staged.add(mlp(2, 20, "shm", 25.0, ShmPath::staged).step_us);
      const MlpResult b = mlp(2, 20, "gloo");
      tcp2.add(b.step_us);
      if (b.step_us > 0) hid_tcp.v.push_back(b.hidden);
      if (!skip_peer) {
        t1.add(torch_us(1, "mlp 20"));
        t2.add(torch_us(2, "mlp 20"));
      }
    }
    // samples/s from the median step times
    auto rate = [](const Stats& s, int samples) { return s.median() > 0 ? samples / (s.median() * 1e-6) : 0.0; };
    auto times = [&](const Stats& s, int samples, double base) { return base > 0 ? rate(s, samples) / base : 0.0; };
    std::printf("2. MLP 784-1024-1024-10, 128 samples/worker, SGD momentum (time per step)\n");
    row("phalanx 1 worker", one, 1e-3, "ms");
    row("phalanx 2 workers shm", shm2, 1e-3, "ms");
    row("  the same, worker thread", shm2_thread, 1e-3, "ms");
    row("  the same, staged buckets", shm2_staged, 1e-3, "ms");
    row("phalanx 2 workers gloo", tcp2, 1e-3, "ms");
    row("pytorch 1 worker", t1, 1e-3, "ms");
    row("pytorch 2 workers DDP", t2, 1e-3, "ms");
    const double s1 = rate(one, 128);
    std::printf("   samples/s: phalanx 1 worker %.0f; 2 workers shm %.0f (%.2fx), shm on the worker thread %.0f (%.2fx), "
                "gloo %.0f (%.2fx); pytorch 1 worker %.0f, 2 workers %.0f (%.2fx)\n",
                s1, rate(shm2, 256), times(shm2, 256, s1), rate(shm2_thread, 256), times(shm2_thread, 256, s1),
                rate(tcp2, 256), times(tcp2, 256, s1), rate(t1, 128), rate(t2, 256), times(t2, 256, rate(t1, 128)));
    std::printf("   bar: 2 workers on shm >= 1.8x one worker: %s\n", s1 > 0 && rate(shm2, 256) >= 1.8 * s1 ? "met" : "NOT met");
    // The ceiling: one worker alone has both cores' caches and memory bandwidth to itself;
    // two independent one-worker processes at once are what 2 workers can reach here.
    const double top = ceiling.median(), share = top > 0 ? rate(shm2, 256) / top : 0.0;
    std::printf("   ceiling: two independent one-worker processes at once %.0f samples/s [%.0f, %.0f] (%.2fx one worker "
                "alone); DDP 2 workers shm %.0f samples/s = %.2f of the ceiling (%.2fx one worker alone); gloo %.2f of it\n",
                top, ceiling.lo(), ceiling.hi(), s1 > 0 ? top / s1 : 0.0, rate(shm2, 256), share, times(shm2, 256, s1),
                top > 0 ? rate(tcp2, 256) / top : 0.0);
    std::printf("   bar: 2 workers on shm >= 0.95 of the two-process ceiling: %s\n",
                top > 0 ? (share >= 0.95 ? "met" : "NOT met") : "n/a");
    // Where a shortfall comes from: the same two processes waiting for each other after every
    // step (no data) lose what the lock step costs on this machine; DDP against that is the
    // reduction's own cost.
    const double locked = lockstep.median();
    if (top > 0 && locked > 0)
      std::printf("   lock step: the same two processes with a barrier after every step (no data) %.0f samples/s "
                  "[%.0f, %.0f] = %.2f of the ceiling; DDP 2 workers shm = %.2f of the lock step, gloo %.2f\n",
                  locked, lockstep.lo(), lockstep.hi(), locked / top, rate(shm2, 256) / locked, rate(tcp2, 256) / locked);
    if (top > 0 && shm2_staged.median() > 0)
      std::printf("   shm buckets as set (default: zero-copy) %.2f of the ceiling; staged through the slots "
                  "(PHALANX_SHM_ZERO_COPY=0) %.2f\n",
                  share, rate(shm2_staged, 256) / top);
    const bench::Summary torch2 = bench::summarise(t2.v);
    bench::result_row("bench_ddp_step", "MLP 784-1024-1024-10 step, 1 worker, 128 samples", bench::summarise(one.v),
                      "PyTorch", bench::summarise(t1.v), "ms", 1e3, "-");
    bench::result_row("bench_ddp_step", "MLP step, 2 workers x 128, shm", bench::summarise(shm2.v), "PyTorch DDP (gloo)",
                      torch2, "ms", 1e3,
                      s1 > 0 ? std::string("shm 2 workers >= 1.8x 1 worker's samples/s: ") +
                                   (rate(shm2, 256) >= 1.8 * s1 ? "met" : "NOT met") + " (" +
                                   std::to_string(times(shm2, 256, s1)).substr(0, 4) + "x)"
                             : "-");
    bench::result_row("bench_ddp_step", "MLP step, 2 workers x 128, gloo (TCP)", bench::summarise(tcp2.v),
                      "PyTorch DDP (gloo)", torch2, "ms", 1e3, "-");
    {
      // Samples/s as a time per 256 samples, so the row's ratio (time over time) is 1 / share.
      std::vector<double> ceiling_us;
      for (double r : ceiling.v) ceiling_us.push_back(256 / r * 1e6);
      char bar[160];
      std::snprintf(bar, sizeof bar, "shm 2 workers >= 0.95 of the ceiling's samples/s: %s (%.2f; %.2fx one worker alone)",
                    top > 0 ? (share >= 0.95 ? "met" : "NOT met") : "n/a", share, times(shm2, 256, s1));
      bench::result_row("bench_ddp_step", "MLP step, 2 workers x 128, shm, vs the ceiling: 2 independent 1-worker processes at once (time per 256 samples)",
                        bench::summarise(shm2.v), "2 processes at once", bench::summarise(ceiling_us), "ms", 1e3,
                        top > 0 ? bar : "-");
    }
    if (cpu1.median() > 0 && cpu2.median() > 0)
      std::printf("   CPU time per step of one worker's process (medians): alone %.1f ms, one of 2 independent at once %.1f ms, "
                  "one of 2 on shm %.1f ms: on 2 idle cores 2 workers could reach %.2fx\n",
                  cpu1.median() / 1e3, cpu_ceiling.median() / 1e3, cpu2.median() / 1e3, 2 * cpu1.median() / cpu2.median());
    std::printf("   gloo's allreduce hidden behind backward (median): %.0f%% (shm reduces on the caller's thread, "
                "inside backward)\n\n", hid_tcp.v.empty() ? 0.0 : hid_tcp.median() * 100);
  }

  if (only == "hook" && hook_arg.empty()) hook_arg = "all";
  if (!hook_arg.empty() && hook_arg != "none" && (only.empty() || only == "hook")) {
    // 4. Comm hooks: the MLP, 2 workers, each rank its own batch, with the default float32
    // reduction and with the fp16 / bf16 compression hooks, on shm and gloo, and PyTorch's DDP
    // (gloo) with default_hooks' fp16/bf16_compress_hook, all alternating within each run.
    std::vector<std::string> hooks = {"none"};
    if (hook_arg == "all" || hook_arg == "fp16") hooks.push_back("fp16");
    if (hook_arg == "all" || hook_arg == "bf16") hooks.push_back("bf16");
    const std::vector<std::string> who = {"shm", "gloo", "torch"};
    const std::string tmp = "/tmp/phalanx_bench_hook_" + std::to_string(::getpid()) + "_";
    auto file = [&](const std::string& w, const std::string& h, const char* what) { return tmp + w + "_" + h + "_" + what + ".f32"; };
    std::vector<std::vector<Stats>> step(who.size(), std::vector<Stats>(hooks.size()));
    std::vector<std::vector<double>> elements(who.size(), std::vector<double>(hooks.size(), -1));
    std::vector<std::vector<std::string>> error(who.size(), std::vector<std::string>(hooks.size()));
    for (int r = 0; r < runs; ++r)
      for (std::size_t k = 0; k < hooks.size(); ++k)
        for (std::size_t w = 0; w < who.size(); ++w) {
          if (who[w] == "torch" && skip_peer) continue;
          const HookRun hr{hooks[k], file(who[w], hooks[k], "init"), file(who[w], hooks[k], "final")};
          const MlpResult m = who[w] == "torch" ? torch_hook(hooks[k], hr.init_file, hr.final_file, error[w][k])
                                                : mlp(2, 20, who[w], 25.0, ShmPath::zero_copy, &hr);
          step[w][k].add(m.step_us);
          if (m.elements > 0) elements[w][k] = m.elements;
        }
    std::printf("4. comm hooks: MLP 784-1024-1024-10, 2 workers x 128 samples (each rank its own batch), SGD momentum,\n"
                "   float32 reduction (none) vs the fp16/bf16 compression hooks; %d runs each, alternating\n"
                "   bytes sent per worker per step = 2 (W-1)/W x sum over buckets of elements x bytes per element\n"
                "   (4 for float32, 2 for fp16/bf16; W = 2: one bucket's worth; ours: gradients + the pass flag)\n", runs);
    for (std::size_t w = 0; w < who.size(); ++w) {
      const char* label = who[w] == "torch" ? "pytorch DDP (gloo)" : who[w] == "shm" ? "phalanx shm" : "phalanx gloo (TCP)";
      for (std::size_t k = 0; k < hooks.size(); ++k) {
        const Stats& s = step[w][k];
        if (s.v.empty()) {
          std::printf("   %-19s %-5s not run: %s\n", label, hooks[k].c_str(),
                      error[w][k].empty() ? "plugin or peer missing" : ("the peer failed: " + error[w][k]).c_str());
          continue;
        }
        const double bytes = elements[w][k] > 0 ? 2.0 * (2 - 1) / 2 * elements[w][k] * (hooks[k] == "none" ? 4 : 2) : -1;
        const double base = step[w][0].median();
        std::printf("   %-19s %-5s %-28s %6.0f samples/s  %8.3f MB/worker/step  float32 step / this step %.2fx\n", label,
                    hooks[k].c_str(), bench::show(bench::summarise(s.v), "ms", 1e3).c_str(), 256 / (s.median() * 1e-6),
                    bytes / 1e6, base > 0 ? base / s.median() : 0.0);
        if (k > 0 && base > 0)
          bench::result_row("bench_ddp_step", "MLP step, 2 workers x 128, " + who[w] + ", " + hooks[k] + "_compress_hook",
                            bench::summarise(s.v), "the same, float32 reduction", bench::summarise(step[w][0].v), "ms",
                            1e3, "-");
      }
    }
    std::printf("   accuracy after 23 steps (3 warm-up + 20 timed), rank 0's weights w against the float32\n"
                "   reduction's w32 of the same backend and start w0: |w - w32| / |w32|, and / |w32 - w0| (the update)\n");
    for (const std::string& w : who) {
      const std::vector<float> w0 = read_floats(file(w, "none", "init")), w32 = read_floats(file(w, "none", "final"));
      for (std::size_t k = 1; k < hooks.size(); ++k) {
        const std::vector<float> wh = read_floats(file(w, hooks[k], "final"));
        if (w32.empty() || wh.size() != w32.size() || w0.size() != w32.size()) continue;
        double d = 0, n = 0, u = 0;
        for (std::size_t i = 0; i < w32.size(); ++i) {
          d += (double(wh[i]) - w32[i]) * (double(wh[i]) - w32[i]);
          n += double(w32[i]) * w32[i];
          u += (double(w32[i]) - w0[i]) * (double(w32[i]) - w0[i]);
        }
        std::printf("   %-5s %-5s |w - w32| / |w32| = %.2e   / |w32 - w0| = %.2e\n", w.c_str(), hooks[k].c_str(),
                    std::sqrt(d / n), std::sqrt(d / u));
      }
    }
    for (const std::string& w : who)
      for (const std::string& h : hooks)
        for (const char* what : {"init", "final"}) std::remove(file(w, h, what).c_str());
    // What a hook adds on the CPU besides the collective: the conversions of one step's
    // gradients (the buckets' elements), at two magnitudes (fp16's normal range ends at
    // 6.1e-5; gradients below it take float_to_fp16's subnormal path). Best of 7, one thread.
    const std::int64_t n = elements[0][0] > 0 ? static_cast<std::int64_t>(elements[0][0]) : 1863691;
    Generator cg(7);
    std::printf("   the hooks' conversions of %lld elements, one thread, best of 7 (the collective's 16-bit sum\n"
                "   widens and rounds again, 8 lanes at a time: phalanx/core/half_sum.hpp, bench_half_sum):\n",
                static_cast<long long>(n));
    for (const float mag : {1e-3f, 1e-5f}) {
      Tensor a = randn({n}, &cg) * mag;
      Tensor h16 = Tensor::empty(a.shape(), DType::Float16, a.device()), b16 = Tensor::empty(a.shape(), DType::BFloat16, a.device());
      auto best_ms = [](auto&& fn) {
        double best = 1e30;
        for (int r = 0; r < 8; ++r) {
          const double t = bench::now_s();
          fn();
          if (r > 0) best = std::min(best, bench::now_s() - t);
        }
        return best * 1e3;
      };
      const double to16 = best_ms([&] { convert_into(a, h16); }), from16 = best_ms([&] { convert_into(h16, a); });
      const double tob = best_ms([&] { convert_into(a, b16); }), fromb = best_ms([&] { convert_into(b16, a); });
      std::printf("   |g| ~ %.0e: float32 -> fp16 %.2f ms, fp16 -> float32 %.2f ms; float32 -> bf16 %.2f ms, "
                  "bf16 -> float32 %.2f ms\n", mag, to16, from16, tob, fromb);
    }
    std::printf("\n");
  }

  if (only.empty() || only == "sweep") {
    std::printf("3. bucket-size sweep, MLP, 2 workers, the default backend (auto), %d runs each (alternating): "
                "ms per step, median [fastest, slowest]\n", runs);
    const double caps[] = {1.0, 5.0, 25.0, 100.0};
    Stats step[4], hid[4];
    for (int r = 0; r < runs; ++r)
      for (int k = 0; k < 4; ++k) {
        const MlpResult m = mlp(2, 20, "", caps[k]);
        step[k].add(m.step_us);
        if (m.step_us > 0) hid[k].v.push_back(m.hidden);
      }
    for (int k = 0; k < 4; ++k)
      std::printf("   bucket_cap_mb %5.0f: %-28s %7.0f samples/s, hidden %3.0f%%\n", caps[k],
                  bench::show(bench::summarise(step[k].v), "ms", 1e3).c_str(),
                  step[k].median() > 0 ? 256 / (step[k].median() * 1e-6) : 0.0, hid[k].v.empty() ? 0.0 : hid[k].median() * 100);
  }
  bench::print_load_at_end();
  return 0;
}
