// Exact mode's cost (its bar): MLP 784-1024-1024-10, global batch 256, 2 workers,
// SGD momentum. The normal DDP step (128 samples per worker, one forward and backward) and
// the exact step (micro-batch 64: two forwards and backwards per worker, fixed-point sums)
// in the same run, on the same process group, alternating step by step; a run is `steps`
// steps of each, the ratio is taken from the medians over the runs (bar: <= 1.3x).
//   build/bench/bench_exact_step [runs] [steps] [exact bucket_cap_mb]
// Two rows without DDP (each rank alone, same model and data) tell the passes' share:
// one 128-sample forward and backward, and two of 64.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double process_cpu_s() {
  timespec t;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 7;
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 10;
  const double cap_mb = argc > 3 ? std::atof(argv[3]) : 0;  // exact mode: both bucket caps (default: DDP's)
  const int world = 2;
  const std::int64_t global = 256, micro = 64;
  bench::print_environment("bench_exact_step");  // the shared environment lines (bench_support.hpp)
  std::printf("CPU: %s\nBLAS: %s\n", cpu_model().c_str(), blas_info().c_str());
  std::printf("MLP 784-1024-1024-10, global batch %lld, %d workers, SGD momentum; %d runs of %d steps of each kind\n\n",
              static_cast<long long>(global), world, reps, steps);
  TcpStoreServer server(TcpStoreOptions{});
  const std::string out = bench::run_ranks(world, [&](int rank, std::FILE* f) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(server.port()).c_str(), 1);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    set_num_threads(1);
    auto pg = parallel::init_process_group();
    auto make = [&](bool exact) {
      Generator g(0);
      parallel::DDPOptions o;
      if (exact) {
        o.exact().enabled = true;
        o.exact().global_batch = global;
        o.exact().micro_batch = micro;
        if (cap_mb > 0) o.bucket_cap_mb(cap_mb).first_bucket_mb(cap_mb);
      }
      return std::make_shared<parallel::DDP>(nn::mlp({784, 1024, 1024, 10}, "relu", &g), pg, o);
    };
    auto normal = make(false), exact = make(true);
    optim::SGD opt_n(normal->parameters(), optim::SGDOptions(0.01).momentum(0.9));
    optim::SGD opt_e(exact->parameters(), optim::SGDOptions(0.01).momentum(0.9));
    Generator g(1 + rank);
    const std::int64_t local = global / world;
    Tensor x = randn({local, 784}, &g), y = randint(10, {local}, &g);
    std::vector<Tensor> xs, ys;
    for (std::int64_t m = 0; m < exact->micro_batches_per_rank(); ++m) {
      xs.push_back(x.narrow_rows(m * micro, (m + 1) * micro));
      ys.push_back(y.narrow_rows(m * micro, (m + 1) * micro));
    }
    auto normal_step = [&] {
      opt_n.zero_grad();
      cross_entropy(normal->forward(x), y).backward();
      opt_n.step();
    };
    auto exact_step = [&] {
      for (std::size_t m = 0; m < xs.size(); ++m) cross_entropy(exact->forward(xs[m]), ys[m]).backward();
      opt_e.step();
    };
    Generator g0(0);
    auto plain = nn::mlp({784, 1024, 1024, 10}, "relu", &g0);
    optim::SGD opt_p(plain->parameters(), optim::SGDOptions(0.01).momentum(0.9));
    auto plain_one = [&] {
      opt_p.zero_grad();
      cross_entropy(plain->forward(x), y).backward();
      opt_p.step();
    };
    auto plain_two = [&] {
      opt_p.zero_grad();
      for (std::size_t m = 0; m < xs.size(); ++m) cross_entropy(plain->forward(xs[m]), ys[m]).backward();
      opt_p.step();
    };
    // One step of each kind in turn, each timed alone (from a barrier to its end on rank 0):
    // on a shared machine both kinds then see the same load.
    auto timed = [&](const std::function<void()>& step, double& cpu) {
      pg->barrier()->wait();
      const double t = bench::now_s(), c = process_cpu_s();
      step();
      cpu += (process_cpu_s() - c) * 1e3;
      return (bench::now_s() - t) * 1e3;
    };
    for (int i = 0; i < 3; ++i) {
      normal_step();
      exact_step();
    }
    const std::vector<std::function<void()>> kinds = {normal_step, exact_step, plain_one, plain_two};
    std::vector<std::vector<double>> wall(kinds.size()), cpu(kinds.size());  // per run: mean ms per step
    for (int r = 0; r < reps; ++r) {
      std::vector<double> w(kinds.size(), 0), c(kinds.size(), 0);
      for (int i = 0; i < steps; ++i)
        for (std::size_t k = 0; k < kinds.size(); ++k) w[k] += timed(kinds[k], c[k]);
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        wall[k].push_back(w[k] / steps);
        cpu[k].push_back(c[k] / steps);
      }
    }
    const auto& tn = wall[0];
    const auto& te = wall[1];
    const auto& cn = cpu[0];
    const auto& ce = cpu[1];
    if (f) {
      auto row = [&](const char* name, const std::vector<double>& v) {
        std::fprintf(f, "   %-22s median %7.2f ms   min %7.2f   max %7.2f\n", name, median(v),
                     *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
      };
      row("normal DDP step", tn);
      row("exact step (2 x 64)", te);
      row("no DDP, 1 x 128", wall[2]);
      row("no DDP, 2 x 64", wall[3]);
      std::fprintf(f, "   exact / normal (medians): %.2fx   (bar <= 1.3x)\n", median(te) / median(tn));
      std::fprintf(f, "   CPU time of rank 0's process per step (all its threads), medians: normal %.2f ms, exact %.2f ms: "
                   "%.2fx\n", median(cn), median(ce), median(ce) / median(cn));
    }
  });
  std::printf("%s", out.c_str());
  return out.empty() ? 1 : 0;
}
