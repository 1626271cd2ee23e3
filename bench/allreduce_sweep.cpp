// Allreduce sweep, 4 B ... 64 MiB float32, 2 ranks on loopback, in one run:
//   Phalanx's gloo backend (through ProcessGroup, what DDP uses),
//   raw Gloo 0.5 (ring_chunked and halving_doubling class algorithms built once per size,
//   and the generic gloo::allreduce), and PyTorch 1.13's gloo all_reduce.
// Prints latency, algbw and busbw (nccl-tests definitions: algbw = bytes / time,
// busbw = algbw * 2 (n-1) / n). Bars (issue 3): Phalanx >= PyTorch's bandwidth at >= 1 MiB,
// <= 2/3 of PyTorch's latency at <= 64 KiB.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

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

const std::vector<std::int64_t> kCounts = {1, 1024, 16384, 262144, 1048576, 4194304, 16777216};

int iters_for(std::int64_t n) {
  return static_cast<int>(std::max<std::int64_t>(3, std::min<std::int64_t>(200, 200000000 / (n * 4 + 1))));
}

template <typename Fn>
double time_us(std::int64_t n, Fn&& fn, const std::function<void()>& barrier) {
  for (int i = 0; i < 3; ++i) fn();
  const int iters = iters_for(n);
  barrier();
  const double t = bench::now_s();
  for (int i = 0; i < iters; ++i) fn();
  return (bench::now_s() - t) / iters * 1e6;
}

/// Runs `body(rank, out)` on 2 forked ranks; parses rank 0's "key value" lines.
std::map<std::string, double> run_two(const std::function<void(int, FILE*)>& body) {
  std::map<std::string, double> m;
  std::istringstream in(bench::run_ranks(2, body));
  std::string k;
  double v;
  while (in >> k >> v) m[k] = v;
  return m;
}

void phalanx_side(int rank, FILE* out, int port) {
  BackendConfig cfg;
  cfg.rank = rank;
  cfg.size = 2;
  TcpStoreOptions o;
  o.port = port;
  cfg.store = std::make_shared<PrefixStore>("bench", std::make_shared<TcpStore>(o));
  auto pg = create_process_group("gloo", cfg);
  auto barrier = [&] { pg->barrier()->wait(); };
  for (std::int64_t n : kCounts) {
    Tensor t = randn({n});
    const double us = time_us(n, [&] { pg->allreduce(t)->wait(); }, barrier);
    if (out) std::fprintf(out, "phalanx_%lld %f\n", static_cast<long long>(n), us);
  }
}

void raw_gloo_side(int rank, FILE* out, const std::string& dir) {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = ::gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, 2);
  ::gloo::rendezvous::FileStore store(dir);
  ctx->connectFullMesh(store, dev);
  std::uint32_t tag = 0;
  auto barrier = [&] {
    ::gloo::BarrierOptions b(ctx);
    b.setTag(++tag);
    ::gloo::barrier(b);
  };
  for (std::int64_t n : kCounts) {
    std::vector<float> buf(n, 1.f);
    float* p = buf.data();
    ::gloo::AllreduceRingChunked<float> rc(ctx, {p}, static_cast<int>(n));
    ::gloo::AllreduceHalvingDoubling<float> hd(ctx, {p}, static_cast<int>(n));
    const double rc_us = time_us(n, [&] { rc.run(); }, barrier);
    const double hd_us = time_us(n, [&] { hd.run(); }, barrier);
    const double gen_us = time_us(n, [&] {
      ::gloo::AllreduceOptions o(ctx);
      o.setOutput(p, static_cast<std::size_t>(n));
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&::gloo::sum<float>));
      o.setTag(++tag);
      ::gloo::allreduce(o);
    }, barrier);
    if (out) {
      std::fprintf(out, "ring_chunked_%lld %f\n", static_cast<long long>(n), rc_us);
      std::fprintf(out, "halving_doubling_%lld %f\n", static_cast<long long>(n), hd_us);
      std::fprintf(out, "generic_%lld %f\n", static_cast<long long>(n), gen_us);
    }
  }
}

std::map<std::string, double> torch_side() {
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  std::string counts;
  for (auto n : kCounts) counts += " " + std::to_string(n);
  const std::string script = bench::peer_script("torch_allreduce.py");
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                          " WORLD_SIZE=2 OMP_NUM_THREADS=1 ";
  const std::string cmd = "(" + env + "RANK=1 " + bench::python() + " " + script + counts + " >/dev/null 2>&1 & " + env +
                          "RANK=0 " + bench::python() + " " + script + counts + "; wait) 2>/dev/null";
  std::map<std::string, double> m;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return m;
  char line[256];
  while (fgets(line, sizeof line, p)) {
    long long n;
    double us;
    if (std::sscanf(line, "n=%lld us=%lf", &n, &us) == 2) m["torch_" + std::to_string(n)] = us;
  }
  pclose(p);
  return m;
}

std::string human(std::int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  const bool skip_peer = argc > 1 && std::string(argv[1]) == "--no-peer";
  std::map<std::string, double> all;
  {
    TcpStoreServer server(TcpStoreOptions{});
    const int port = server.port();
    for (auto& kv : run_two([&](int r, FILE* f) { phalanx_side(r, f, port); })) all.insert(kv);
  }
  {
    const std::string dir = "/tmp/phalanx_bench_gloo_" + std::to_string(::getpid());
    ::mkdir(dir.c_str(), 0700);
    for (auto& kv : run_two([&](int r, FILE* f) { raw_gloo_side(r, f, dir); })) all.insert(kv);
    std::system(("rm -rf " + dir).c_str());
  }
  if (!skip_peer)
    for (auto& kv : torch_side()) all.insert(kv);

  std::printf("allreduce, 2 ranks, loopback, float32 (busbw = algbw for 2 ranks)\n");
  std::printf("%-8s | %10s %9s | %10s %9s | %10s %-16s | %8s %8s\n", "size", "phalanx", "GB/s", "torch",
              "GB/s", "raw gloo", "(best of 3)", "lat t/p", "bw p/t");
  for (std::int64_t n : kCounts) {
    const std::string k = std::to_string(n);
    const double p = all["phalanx_" + k], t = all.count("torch_" + k) ? all["torch_" + k] : -1;
    const double rc = all["ring_chunked_" + k], hd = all["halving_doubling_" + k], g = all["generic_" + k];
    double best = rc;
    std::string which = "ring_chunked";
    if (hd < best) best = hd, which = "halving_doubling";
    if (g < best) best = g, which = "allreduce(opts)";
    const double bytes = static_cast<double>(n) * 4;
    std::printf("%-8s | %10.1f %9.3f | %10.1f %9.3f | %10.1f %-16s | %8.2f %8.2f\n", human(n * 4).c_str(), p,
                bytes / p / 1e3, t, t > 0 ? bytes / t / 1e3 : 0.0, best, which.c_str(), t > 0 ? t / p : 0.0,
                t > 0 ? t / p : 0.0);
  }
  std::printf("\nraw gloo per algorithm (us): size, ring_chunked, halving_doubling, allreduce(opts)\n");
  for (std::int64_t n : kCounts) {
    const std::string k = std::to_string(n);
    std::printf("  %-8s %10.1f %10.1f %10.1f\n", human(n * 4).c_str(), all["ring_chunked_" + k],
                all["halving_doubling_" + k], all["generic_" + k]);
  }
  std::printf("\nlat t/p = torch latency / phalanx latency (bar: >= 1.5 at <= 64 KiB);\n"
              "bw p/t = phalanx bandwidth / torch bandwidth (bar: >= 1 at >= 1 MiB)\n");
  return 0;
}
