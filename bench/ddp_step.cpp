// DDP benchmarks, 2 workers on this 2-core machine, Phalanx and PyTorch DDP (gloo) in the
// same run (issue 7's bars):
//   1. the textbook's demo (Linear 64->10, 512 samples, batch 32 per worker, SGD lr 0.05):
//      Phalanx's time per step <= 1/10 of PyTorch's;
//   2. MLP 784-1024-1024-10, 128 samples per worker, SGD momentum: 2 workers >= 1.3x the
//      samples/s of 1 worker and >= 1.8x PyTorch DDP's; how much allreduce is hidden;
//   3. a bucket-size sweep (1, 5, 25, 100 MiB) on the MLP.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

void worker_env(int rank, int world, int port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("PHALANX_STORE_HOSTED", "1", 1);
  set_num_threads(1);
}

/// The textbook's demo: microseconds per step.
double demo_us(int world, int epochs) {
  TcpStoreServer server(TcpStoreOptions{});
  const std::string out = bench::run_ranks(world, [&](int rank, std::FILE* f) {
    worker_env(rank, world, server.port());
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

struct MlpResult {
  double step_us = -1, hidden = 0;
};

/// MLP 784-1024-1024-10 at 128 samples per worker (world 1 = no DDP).
MlpResult mlp(int world, int steps, double bucket_mb = 25.0) {
  TcpStoreServer server(TcpStoreOptions{});
  const std::string out = bench::run_ranks(world, [&](int rank, std::FILE* f) {
    worker_env(rank, world, server.port());
    auto pg = parallel::init_process_group();
    Generator g(0);
    nn::ModulePtr model = nn::mlp({784, 1024, 1024, 10}, "relu", &g);
    std::shared_ptr<parallel::DDP> ddp;
    if (world > 1) {
      parallel::DDPOptions o;
      o.bucket_cap_mb = bucket_mb;
      ddp = std::make_shared<parallel::DDP>(model, pg, o);
      model = ddp;
    }
    optim::SGD opt(model->parameters(), optim::SGDOptions{0.01, 0.9});
    Tensor x = randn({128, 784}, &g), y = randint(10, {128}, &g);
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
    const double t = bench::now_s();
    for (int i = 0; i < steps; ++i) step();
    if (f) std::fprintf(f, "step_us=%f hidden=%f\n", (bench::now_s() - t) / steps * 1e6, hidden / steps);
  });
  return {bench::find_value(out, "step_us"), bench::find_value(out, "hidden")};
}

double torch_us(int world, const std::string& args) {
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  return bench::find_value(bench::run_python_ranks(world, port, bench::peer_script("torch_ddp.py") + " " + args),
                           "step_us");
}

}  // namespace

int main(int argc, char** argv) {
  const bool skip_peer = argc > 1 && std::string(argv[1]) == "--no-peer";
  std::printf("BLAS: %s\n\n", blas_info().c_str());

  // Best of three runs on each side: this machine's timings swing between runs.
  double demo = 1e30, demo_torch = skip_peer ? -1 : 1e30;
  for (int r = 0; r < 3; ++r) {
    demo = std::min(demo, demo_us(2, 100));
    if (!skip_peer) demo_torch = std::min(demo_torch, torch_us(2, "demo 20"));
  }
  std::printf("1. textbook demo (Linear 64->10, batch 32/worker), 2 workers, time per step (best of 3 runs)\n");
  std::printf("   phalanx %8.1f us   pytorch DDP %8.1f us   pytorch/phalanx %.1fx   (bar >= 10x)\n\n", demo,
              demo_torch, demo_torch > 0 ? demo_torch / demo : 0.0);

  const MlpResult one = mlp(1, 20), two = mlp(2, 20);
  const double t1 = skip_peer ? -1 : torch_us(1, "mlp 20"), t2 = skip_peer ? -1 : torch_us(2, "mlp 20");
  const double s1 = 128 / (one.step_us * 1e-6), s2 = 256 / (two.step_us * 1e-6);
  const double ts1 = t1 > 0 ? 128 / (t1 * 1e-6) : 0, ts2 = t2 > 0 ? 256 / (t2 * 1e-6) : 0;
  std::printf("2. MLP 784-1024-1024-10, 128 samples/worker, SGD momentum (samples/s in total)\n");
  std::printf("   %-10s %12s %12s %14s %14s\n", "", "phalanx", "pytorch", "phalanx step", "pytorch step");
  std::printf("   %-10s %12.0f %12.0f %11.1f ms %11.1f ms\n", "1 worker", s1, ts1, one.step_us / 1e3, t1 / 1e3);
  std::printf("   %-10s %12.0f %12.0f %11.1f ms %11.1f ms\n", "2 workers", s2, ts2, two.step_us / 1e3, t2 / 1e3);
  std::printf("   scaling: phalanx %.2fx of 1 worker (bar >= 1.3), pytorch %.2fx; phalanx/pytorch at 2 workers %.2fx "
              "(bar >= 1.8)\n",
              s2 / s1, ts1 > 0 ? ts2 / ts1 : 0.0, ts2 > 0 ? s2 / ts2 : 0.0);
  std::printf("   allreduce hidden behind backward: %.0f%%\n\n", two.hidden * 100);

  std::printf("3. bucket-size sweep, MLP, 2 workers\n");
  for (double mb : {1.0, 5.0, 25.0, 100.0}) {
    const MlpResult r = mlp(2, 20, mb);
    std::printf("   bucket_cap_mb %5.0f: %8.1f ms/step, %7.0f samples/s, hidden %3.0f%%\n", mb, r.step_us / 1e3,
                256 / (r.step_us * 1e-6), r.hidden * 100);
  }
  return 0;
}
