// Allreduce sweep, float32 sum in place, 4 B ... 64 MiB, for 2 and 4 ranks on this host, all
// columns in one run (docs/benchmarks.md, docs/shm.md):
//   Phalanx shm     (backend "shm", forked ranks, pg->allreduce(t)->wait(): what DDP calls)
//   Phalanx TCP     (backend "gloo" over loopback, same loop)
//   Phalanx MPI     (backend "mpi" under mpirun, when libphalanx_mpi.so is built)
//   OpenMPI         (raw MPI_Allreduce(MPI_IN_PLACE) in the same mpirun job; its shared-memory path)
//   PyTorch Gloo    (bench/peers/torch_allreduce.py, dist.all_reduce)
// Each figure is the median of 5 timed runs (each run: a barrier, then a loop of allreduces;
// each run a launch of its own, the columns taking turns, so that load from other processes
// that comes and goes falls on every column alike),
// with the spread of the 5 (half of max - min, in % of the median), and the CPU time each
// rank spent per allreduce (its process CPU clock, mean over ranks): a rank that busy-polls
// spends a core while it waits, which compute running beside the allreduce would miss.
// Ratios are computed from the medians.
//   bench_allreduce_sweep [--quick] [--ranks 2,4] [--no-peer] [--raw-gloo]
// --quick: fewer sizes (4 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB) and ~4x shorter runs.
// --raw-gloo adds raw Gloo 0.5: three algorithms (not three runs), ring_chunked,
// halving_doubling and gloo::allreduce(opts), each in a column of its own, each the median
// of its 5 runs with spread and CPU time.
// Every benchmark's environment line (bench_support.hpp) comes first; result rows (ROW|...)
// for scripts/bench.sh follow the tables.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef PHALANX_SWEEP_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

struct Plan {
  std::vector<std::int64_t> counts = {1, 1024, 16384, 262144, 1048576, 4194304, 16777216};
  int runs = 1;    ///< timed runs per launch of a column's processes
  int rounds = 5;  ///< launches per column; the columns take turns, so load that comes and goes hits them alike
  double budget_s = 0.02;  ///< aimed time of one timed run
};

/// Iterations of one run: about budget_s at `gbps` GB/s with `overhead_us` per call.
int iters_for(const Plan& p, std::int64_t n, double overhead_us) {
  const double est_us = overhead_us + static_cast<double>(n) * 4 / 2e3;  // ~2 GB/s worst case
  // At least 3 calls per run up to 1 MiB; above, at least 1 (a 64 MiB call over TCP with
  // more ranks than cores takes seconds).
  const double least = n * 4 > (1 << 20) ? 1.0 : 3.0;
  return static_cast<int>(std::max(least, std::min(100000.0, p.budget_s * 1e6 / est_us)));
}

double cpu_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

constexpr double kSlowCall = 0.25;  ///< seconds: a column whose call takes longer stops there
/// Calls of a 4-byte allreduce that every launch makes before timing anything (fast
/// transports: shm, MPI; slow ones: TCP, PyTorch, ~10 ms either way on an idle machine).
constexpr int kSettleFast = 20000, kSettleSlow = 30;

struct Sample {
  double us = 0, cpu_us = 0;
};
/// count -> one Sample per run (us: rank 0's wall time per call; cpu: mean over ranks).
using Series = std::map<std::int64_t, std::vector<Sample>>;

/// One line per (count, run) from every rank: "n run us cpu_us".
Series parse_ranks(const std::vector<std::string>& outs) {
  Series s;
  std::map<std::pair<std::int64_t, int>, std::pair<double, std::vector<double>>> acc;
  for (std::size_t r = 0; r < outs.size(); ++r) {
    std::istringstream in(outs[r]);
    long long n;
    int run;
    double us, cpu;
    while (in >> n >> run >> us >> cpu) {
      auto& a = acc[{n, run}];
      if (r == 0) a.first = us;
      a.second.push_back(cpu);
    }
  }
  for (auto& [key, v] : acc) {
    double c = 0;
    for (double x : v.second) c += x;
    s[key.first].push_back({v.first, c / v.second.size()});
  }
  return s;
}

/// Runs body(rank, out) on `world` forked ranks; returns what each rank wrote.
std::vector<std::string> run_all_ranks(int world, const std::function<void(int, std::FILE*)>& body) {
  const std::string base = "/tmp/phalanx_sweep_" + std::to_string(::getpid()) + "_";
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::FILE* f = std::fopen((base + std::to_string(r)).c_str(), "w");
      int code = 0;
      try {
        body(r, f);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fclose(f);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  std::vector<std::string> outs;
  for (int r = 0; r < world; ++r) {
    const std::string path = base + std::to_string(r);
    std::ifstream in(path);
    outs.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::remove(path.c_str());
  }
  return outs;
}

/// Times `call` in plan.runs runs per count after a warm-up; `barrier` starts each run.
template <typename Call>
void timed_runs(const Plan& plan, std::int64_t n, double overhead_us, std::FILE* out, Call&& call,
                const std::function<void()>& barrier) {
  const int warm = n >= (1 << 22) ? 1 : 3;
  for (int i = 0; i < warm; ++i) call();
  const int iters = iters_for(plan, n, overhead_us);
  for (int run = 0; run < plan.runs; ++run) {
    barrier();
    const double c0 = cpu_now(), t0 = bench::now_s();
    for (int i = 0; i < iters; ++i) call();
    const double dt = (bench::now_s() - t0) / iters * 1e6, dc = (cpu_now() - c0) / iters * 1e6;
    std::fprintf(out, "%lld %d %.4f %.4f\n", static_cast<long long>(n), run, dt, dc);
  }
}

Series phalanx_column(const std::string& backend, int world, const Plan& plan, double overhead_us) {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  return parse_ranks(run_all_ranks(world, [&](int rank, std::FILE* out) {
    BackendConfig cfg;
    cfg.rank = rank;
    cfg.size = world;
    TcpStoreOptions o;
    o.port = port;
    cfg.store = std::make_shared<PrefixStore>("sweep", std::make_shared<TcpStore>(o));
    cfg.local_rank = rank;
    cfg.local_world_size = world;
    auto pg = create_process_group(backend, cfg);
    // Settle first (fresh processes migrate, fault pages in, ramp the clock: the first run
    // after a launch was 3x slower under load), as the MPI and PyTorch columns do.
    Tensor w = ones({1});
    for (int i = 0, k = backend == "shm" ? kSettleFast : kSettleSlow; i < k; ++i) pg->allreduce(w)->wait();
    for (std::int64_t n : plan.counts) {
      Tensor t = ones({n});
      // A call slower than kSlowCall (the Gloo plugin's busy-polling mesh with more ranks than
      // cores: seconds per large allreduce) ends the column: that call is its only figure,
      // the larger sizes read "skipped". Rank 0 decides, so every rank stops alike.
      const double c0 = cpu_now(), t0 = bench::now_s();
      pg->allreduce(t)->wait();
      const double first = bench::now_s() - t0, first_cpu = cpu_now() - c0;
      Tensor slow = full({1}, first > kSlowCall ? 1.0 : 0.0);
      pg->broadcast(slow, 0)->wait();
      if (slow.data<float>()[0] != 0.f) {
        std::fprintf(out, "%lld -1 %.4f %.4f\n", static_cast<long long>(n), first * 1e6, first_cpu * 1e6);
        break;
      }
      timed_runs(plan, n, overhead_us, out, [&] { pg->allreduce(t)->wait(); }, [&] { pg->barrier()->wait(); });
    }
  }));
}

/// Raw Gloo 0.5: the three algorithms, each its own series.
std::map<std::string, Series> raw_gloo_columns(int world, const Plan& plan) {
  const std::string dir = "/tmp/phalanx_sweep_gloo_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  std::map<std::string, std::vector<std::string>> per_algo;
  const auto outs = run_all_ranks(world, [&](int rank, std::FILE* out) {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = ::gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, world);
    ::gloo::rendezvous::FileStore store(dir);
    ctx->connectFullMesh(store, dev);
    std::uint32_t tag = 0;
    auto barrier = [&] {
      ::gloo::BarrierOptions b(ctx);
      b.setTag(++tag);
      ::gloo::barrier(b);
    };
    for (std::int64_t n : plan.counts) {
      std::vector<float> buf(n, 1.f);
      float* p = buf.data();
      ::gloo::AllreduceRingChunked<float> rc(ctx, {p}, static_cast<int>(n));
      ::gloo::AllreduceHalvingDoubling<float> hd(ctx, {p}, static_cast<int>(n));
      std::fprintf(out, "algo ring_chunked\n");
      timed_runs(plan, n, 60, out, [&] { rc.run(); }, barrier);
      std::fprintf(out, "algo halving_doubling\n");
      timed_runs(plan, n, 60, out, [&] { hd.run(); }, barrier);
      std::fprintf(out, "algo allreduce(opts)\n");
      timed_runs(plan, n, 60, out, [&] {
        ::gloo::AllreduceOptions o(ctx);
        o.setOutput(p, static_cast<std::size_t>(n));
        o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&::gloo::sum<float>));
        o.setTag(++tag);
        ::gloo::allreduce(o);
      }, barrier);
    }
  });
  std::system(("rm -rf " + dir).c_str());
  // split each rank's output by algorithm
  for (const auto& text : outs) {
    std::istringstream in(text);
    std::string line, algo;
    std::map<std::string, std::string> mine;
    while (std::getline(in, line)) {
      if (line.rfind("algo ", 0) == 0) algo = line.substr(5);
      else mine[algo] += line + "\n";
    }
    for (auto& [a, t] : mine) per_algo[a].push_back(t);
  }
  std::map<std::string, Series> out;
  for (auto& [a, v] : per_algo) out[a] = parse_ranks(v);
  return out;
}

#ifdef PHALANX_SWEEP_MPI
/// Under mpirun (bench_allreduce_sweep --mpi-worker [--quick]): Phalanx's mpi backend
/// (if built) and raw MPI_Allreduce, alternating per size; rank 0 prints "col n run us cpu".
int mpi_worker(const Plan& plan) {
  ProcessGroupPtr pg;
  std::string why;
  const bool have_plugin = backend_available("mpi", &why);
  if (have_plugin) {
    ::setenv("PHALANX_BACKEND", "mpi", 1);
    pg = parallel::init_process_group();  // initialises MPI
  } else {
    MPI_Init(nullptr, nullptr);
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (!have_plugin && rank == 0) std::printf("no-plugin %s\n", why.c_str());
  auto report = [&](const char* col, std::int64_t n, const std::vector<Sample>& s) {
    for (std::size_t k = 0; k < s.size(); ++k) {
      double cpu = s[k].cpu_us, sum = 0;
      MPI_Reduce(&cpu, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank == 0) std::printf("%s %lld %zu %.4f %.4f\n", col, static_cast<long long>(n), k, s[k].us, sum / world);
    }
  };
  {  // settle, as the other columns do
    Tensor w = ones({1});
    for (int i = 0; i < kSettleFast; ++i) MPI_Allreduce(MPI_IN_PLACE, w.data<float>(), 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (pg)
      for (int i = 0; i < kSettleFast; ++i) pg->allreduce(w)->wait();
  }
  for (std::int64_t n : plan.counts) {
    Tensor t = ones({n});
    float* a = t.data<float>();
    const int iters = iters_for(plan, n, 2);
    auto loop = [&](auto&& call) {
      std::vector<Sample> s;
      for (int i = 0; i < 3; ++i) call();
      for (int run = 0; run < plan.runs; ++run) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double c0 = cpu_now(), t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) call();
        s.push_back({(MPI_Wtime() - t0) / iters * 1e6, (cpu_now() - c0) / iters * 1e6});
      }
      return s;
    };
    const auto raw = loop([&] { MPI_Allreduce(MPI_IN_PLACE, a, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
    report("openmpi", n, raw);
    if (pg) report("mpi", n, loop([&] { pg->allreduce(t)->wait(); }));
  }
  std::fflush(stdout);
  if (!have_plugin) MPI_Finalize();
  return 0;  // the plugin finalises MPI at exit
}
#endif

/// Runs this program under mpirun as the MPI worker; returns the "openmpi" and "mpi" series.
std::map<std::string, Series> mpi_columns(int world, bool quick, std::string& note) {
  std::map<std::string, Series> out;
#ifndef PHALANX_SWEEP_MPI
  note = "this build has no MPI (install libopenmpi-dev and reconfigure)";
  return out;
#else
  char self[4096] = {0};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return out;
  const std::string cmd = "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "
                          "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np " +
                          std::to_string(world) + " " + self + " --mpi-worker" + (quick ? " --quick" : "") + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[1024];
  std::string other;
  while (fgets(line, sizeof line, p)) {
    char col[32];
    long long n;
    int run;
    double us, cpu;
    if (std::sscanf(line, "%31s %lld %d %lf %lf", col, &n, &run, &us, &cpu) == 5)
      out[col][n].push_back({us, cpu});
    else if (std::string(line).rfind("no-plugin ", 0) == 0)
      note = "libphalanx_mpi.so: " + std::string(line + 10);
    else
      other += line;
  }
  const int rc = pclose(p);
  if (out.empty()) note = "mpirun failed (rc " + std::to_string(rc) + "): " + other.substr(0, 300);
  if (!note.empty() && note.back() == '\n') note.pop_back();
  return out;
#endif
}

/// PyTorch's gloo all_reduce (bench/peers/torch_allreduce.py): "n= run= us= cpu_us=" lines.
Series torch_column(int world, const Plan& plan, std::string& note) {
  Series s;
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  std::string args = bench::peer_script("torch_allreduce.py") + " --runs " + std::to_string(plan.runs) +
                     " --budget " + std::to_string(plan.budget_s);
  for (auto n : plan.counts) args += " " + std::to_string(n);
  const std::string out = bench::run_python_ranks(world, port, args);
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    long long n;
    int run;
    double us, cpu;
    if (std::sscanf(line.c_str(), "n=%lld run=%d us=%lf cpu_us=%lf", &n, &run, &us, &cpu) == 4) s[n].push_back({us, cpu});
  }
  if (s.empty()) note = "PyTorch did not run (python3-torch missing? set PHALANX_PYTHON): " + out.substr(0, 200);
  return s;
}

/// A DDP-like step on `world` forked ranks over shm: `flops` of arithmetic, then an
/// allreduce of `n` floats (n = 0: compute only). Returns the step time (us) of one run.
double step_us(int world, std::int64_t n, long flops, int steps) {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto outs = run_all_ranks(world, [&](int rank, std::FILE* out) {
    BackendConfig cfg;
    cfg.rank = rank;
    cfg.size = world;
    TcpStoreOptions o;
    o.port = port;
    cfg.store = std::make_shared<PrefixStore>("share", std::make_shared<TcpStore>(o));
    auto pg = create_process_group("shm", cfg);
    Tensor t = ones({std::max<std::int64_t>(n, 1)});
    volatile float sink = 0;
    pg->barrier()->wait();
    const double t0 = bench::now_s();
    for (int s = 0; s < steps; ++s) {
      float a = 1.0001f, b = 0.9999f;
      for (long i = 0; i < flops / 2; ++i) a = a * b + 1e-7f;  // a dependent chain: one core's worth
      sink = sink + a;
      if (n > 0) pg->allreduce(t)->wait();
    }
    pg->barrier()->wait();
    std::fprintf(out, "%f\n", (bench::now_s() - t0) / steps * 1e6);
  });
  return std::atof(outs[0].c_str());
}

std::string human(std::int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

struct Stat {
  double med = -1, spread = 0, cpu = -1;
  bool ok() const { return med > 0; }
};

Stat stat_of(const Series& s, std::int64_t n) {
  auto it = s.find(n);
  if (it == s.end() || it->second.empty()) return {};
  std::vector<double> us, cpu;
  for (const auto& x : it->second) us.push_back(x.us), cpu.push_back(x.cpu_us);
  std::sort(us.begin(), us.end());
  std::sort(cpu.begin(), cpu.end());
  Stat st;
  st.med = us[us.size() / 2];
  st.spread = (us.back() - us.front()) / 2 / st.med * 100;
  st.cpu = cpu[cpu.size() / 2];
  return st;
}

std::string cell(const Stat& s, bool column_ran = false) {
  char buf[64];
  if (!s.ok()) return column_ran ? "skipped (slow)" : "n/a";
  if (s.med < 100) std::snprintf(buf, sizeof buf, "%.2f ±%.0f%% [%.2f]", s.med, s.spread, s.cpu);
  else std::snprintf(buf, sizeof buf, "%.0f ±%.0f%% [%.0f]", s.med, s.spread, s.cpu);
  return buf;
}

/// A column's runs at one size as a bench::Summary (wall time per call, rank 0's clock).
bench::Summary summary_of(const Series& s, std::int64_t n) {
  auto it = s.find(n);
  if (it == s.end()) return {};
  std::vector<double> us;
  for (const auto& x : it->second)
    if (x.us > 0) us.push_back(x.us);
  return bench::summarise(us);
}

std::string ratio(const Stat& a, const Stat& b) {
  if (!a.ok() || !b.ok()) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", a.med / b.med);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Plan plan;
  bool quick = false, peer = true, raw_gloo = false, mpi_worker_mode = false;
  std::vector<int> worlds = {2, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--no-peer") peer = false;
    else if (a == "--raw-gloo") raw_gloo = true;
    else if (a == "--mpi-worker") mpi_worker_mode = true;
    else if (a == "--ranks" && i + 1 < argc) {
      worlds.clear();
      std::stringstream ss(argv[++i]);
      std::string w;
      while (std::getline(ss, w, ',')) worlds.push_back(std::stoi(w));
    } else {
      std::fprintf(stderr, "usage: bench_allreduce_sweep [--quick] [--ranks 2,4] [--no-peer] [--raw-gloo]\n");
      return 2;
    }
  }
  if (quick) {
    plan.counts = {1, 1024, 16384, 262144, 4194304};
    plan.budget_s = 0.005;
  }
#ifdef PHALANX_SWEEP_MPI
  if (mpi_worker_mode) return mpi_worker(plan);
#else
  if (mpi_worker_mode) return 2;
#endif
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table as soon as it is known (nothing pending at a fork)
  bench::print_environment("bench_allreduce_sweep");
  std::printf("allreduce sweep: float32 sum in place\n");
  for (int world : worlds) {
    std::map<std::string, Series> cols, rg;
    std::string mpi_note, torch_note = peer ? "" : "--no-peer";
    bool mpi_runs = true;
    const auto merge = [](Series& into, const Series& from) {
      for (const auto& [n, v] : from) into[n].insert(into[n].end(), v.begin(), v.end());
    };
    for (int round = 0; round < plan.rounds; ++round) {
      merge(cols["shm"], phalanx_column("shm", world, plan, 0.5));
      merge(cols["tcp"], phalanx_column("gloo", world, plan, 40));
      if (mpi_runs) {  // a column that could not run is not retried
        const auto got = mpi_columns(world, quick, mpi_note);
        mpi_runs = !got.empty();
        for (const auto& [k, v] : got) merge(cols[k], v);
      }
      if (torch_note.empty()) merge(cols["torch"], torch_column(world, plan, torch_note));
      if (raw_gloo)
        for (const auto& [a, v] : raw_gloo_columns(world, plan)) merge(rg[a], v);
    }

    std::printf("\n%d ranks%s. Cells: median us per allreduce of %d runs ±(max-min)/2 in %% of it "
                "[CPU us per allreduce, mean per rank]; each run a launch of its own, the columns taking turns\n",
                world, world > static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)) ? " (more ranks than cores)" : "",
                plan.runs * plan.rounds);
    std::printf("%-8s | %-24s | %-24s | %-24s | %-24s | %-24s | %8s %8s %8s\n", "size", "Phalanx shm", "Phalanx TCP",
                "Phalanx MPI", "OpenMPI (raw)", "PyTorch gloo", "shm/OMPI", "shm GB/s", "torch/shm");
    for (std::int64_t n : plan.counts) {
      const Stat shm = stat_of(cols["shm"], n), tcp = stat_of(cols["tcp"], n), mpi = stat_of(cols["mpi"], n),
                 ompi = stat_of(cols["openmpi"], n), torch = stat_of(cols["torch"], n);
      char gbps[16] = "n/a";
      if (shm.ok()) std::snprintf(gbps, sizeof gbps, "%.2f", n * 4 / shm.med / 1e3);
      std::printf("%-8s | %-24s | %-24s | %-24s | %-24s | %-24s | %8s %8s %8s\n", human(n * 4).c_str(),
                  cell(shm, !cols["shm"].empty()).c_str(), cell(tcp, !cols["tcp"].empty()).c_str(), cell(mpi).c_str(),
                  cell(ompi).c_str(), cell(torch).c_str(),
                  ratio(shm, ompi).c_str(), gbps, ratio(torch, shm).c_str());
    }
    if (!mpi_note.empty()) std::printf("Phalanx MPI / OpenMPI: %s\n", mpi_note.c_str());
    if (!torch_note.empty()) std::printf("PyTorch: %s\n", torch_note.c_str());
    // Result rows for scripts/bench.sh: Phalanx shm against raw OpenMPI and PyTorch gloo at
    // the smallest size, 1 MiB and the largest (the bars against OpenMPI are for 2 ranks).
    for (std::int64_t n : {plan.counts.front(), std::int64_t{262144}, plan.counts.back()})
      for (const char* peer_col : {"openmpi", "torch"}) {
        if (cols[peer_col].empty()) continue;
        const bench::Summary o = summary_of(cols["shm"], n), t = summary_of(cols[peer_col], n);
        const bool ompi = std::string(peer_col) == "openmpi";
        const double limit = ompi && world == 2 ? (n * 4 <= 65536 ? 2.0 : n * 4 >= (1 << 20) ? 1.3 : 0.0) : 0.0;
        std::string bar = "-";
        if (limit > 0) {
          bar = limit == 2.0 ? "<= 2" : "<= 1.3";
          if (o.ok() && t.ok()) bar += o.median / t.median <= limit ? ": met" : ": NOT met";
        }
        bench::result_row("bench_allreduce_sweep",
                          "allreduce " + human(n * 4) + ", " + std::to_string(world) + " ranks, Phalanx shm", o,
                          ompi ? "raw OpenMPI" : "PyTorch gloo", t, "us", 1, bar);
      }
    // The like-for-like row beside them: the same transport on both sides (TCP over loopback,
    // the Gloo plugin against PyTorch's Gloo), not only shared memory against TCP.
    if (!cols["tcp"].empty() && !cols["torch"].empty())
      for (std::int64_t n : {plan.counts.front(), std::int64_t{262144}, plan.counts.back()})
        bench::result_row("bench_allreduce_sweep",
                          "allreduce " + human(n * 4) + ", " + std::to_string(world) + " ranks, Phalanx TCP (gloo plugin)",
                          summary_of(cols["tcp"], n), "PyTorch gloo", summary_of(cols["torch"], n), "us", 1, "-");
    if (raw_gloo) {
      std::printf("raw Gloo 0.5, three algorithms (not runs), each the median us of its %d runs (ring_chunked / "
                  "halving_doubling / allreduce(opts)):\n", plan.runs * plan.rounds);
      for (std::int64_t n : plan.counts)
        std::printf("  %-8s %12s %12s %12s\n", human(n * 4).c_str(), cell(stat_of(rg["ring_chunked"], n)).c_str(),
                    cell(stat_of(rg["halving_doubling"], n)).c_str(), cell(stat_of(rg["allreduce(opts)"], n)).c_str());
    }
  }
  {
    // Oversubscription: the same step (compute, then a 1 MiB allreduce) on 2 and on 4 ranks.
    // With 2 cores, 4 ranks get half a core each, so the compute alone takes ~2x: the step
    // should not take much more than that (a rank that busy-waits would take the core from
    // the rank it waits for).
    const long flops = quick ? 200000 : 1000000;
    const int steps = quick ? 20 : 40;
    std::printf("\nOversubscription (shm; step = %ld flops of dependent arithmetic, then allreduce of 1 MiB; "
                "median of 5 runs of %d steps, the four cases taking turns):\n", flops, steps);
    std::vector<double> r[4];  // the four cases take turns, 5 runs each
    for (int round = 0; round < 5; ++round) {
      r[0].push_back(step_us(2, 0, flops, steps));
      r[1].push_back(step_us(4, 0, flops, steps));
      r[2].push_back(step_us(2, 262144, flops, steps));
      r[3].push_back(step_us(4, 262144, flops, steps));
    }
    for (auto& v : r) std::sort(v.begin(), v.end());
    const double c2 = r[0][2], c4 = r[1][2], s2 = r[2][2], s4 = r[3][2];
    std::printf("  compute only: 2 ranks %.0f us, 4 ranks %.0f us (x%.2f: the compute share)\n", c2, c4, c4 / c2);
    std::printf("  compute + allreduce: 2 ranks %.0f us, 4 ranks %.0f us (x%.2f)\n", s2, s4, s4 / s2);
  }
  std::printf("\nskipped (slow): a call of the size before took over %.2f s, so the column stopped there "
              "(its figure is that one call).\n", kSlowCall);
  std::printf("shm/OMPI = Phalanx shm time / raw OpenMPI time (medians; bars for 2 ranks: <= 2 up to 64 KiB, "
              "<= 1.3 from 1 MiB); torch/shm = PyTorch gloo time / Phalanx shm time (speed-up).\n"
              "GB/s = bytes / time (algbw; busbw = algbw * 2 (n-1) / n).\n");
  bench::print_load_at_end();
  return 0;
}
