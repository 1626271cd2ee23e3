// What the per-host data cache costs and saves on Fashion-MNIST (train, 60000 x 784):
// load time in private memory (PHALANX_DATA_CACHE=off), building the cache entry (cold),
// and mapping it (warm: map + checksum pass); then the DataLoader's gather of a 64-row batch
// (the per-rank batch of --global-batch 128 on 2 workers) from private float32, from the
// mapped float32 entry (standardized when cached), and from mapped raw bytes standardized
// at gather time (the alternative design). Gathers: thread CPU time per batch; loads: wall
// time; 5 rounds of each (the loads: a fresh cache folder per round), medians with the
// fastest and slowest round, ratios of the medians.
// The memory itself is measured across processes by scripts/measure_data_pss.sh.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>
#include <phalanx/data/data_cache.hpp>

#include "bench_support.hpp"

using namespace phalanx;
using namespace phalanx::samplers;

namespace {
double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

constexpr int kRounds = 5;

// Per-batch time (µs) of 2000 batches of 64 random rows, one entry per round.
std::vector<double> per_batch_us(std::int64_t n, const std::function<void(const std::int64_t*)>& gather) {
  Generator g(7);
  const std::vector<std::int64_t> idx = randint(n, {64 * 2000}, &g).to_vector<std::int64_t>();
  std::vector<double> rounds;
  for (int round = 0; round < kRounds; ++round) {
    const double t = cpu_s();
    for (int b = 0; b < 2000; ++b) gather(idx.data() + 64 * b);
    rounds.push_back((cpu_s() - t) / 2000 * 1e6);
  }
  return rounds;
}
}  // namespace

int main() {
  set_num_threads(1);
  bench::print_environment("bench_data_memory");
  char dir[] = "/tmp/phalanx_bench_cache_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  MnistOptions o;
  o.standardize = true;  // as phalanx-train loads it
  std::vector<double> load_off, load_cold, load_warm;
  std::shared_ptr<TensorDataset> priv, mapped;
  for (int round = 0; round < kRounds; ++round) {
    const std::string sub = std::string(dir) + "/round" + std::to_string(round);  // a cold cache each round
    setenv("PHALANX_DATA_CACHE", "off", 1);
    double t = bench::now_s();
    priv = load_mnist(kFashionMnistDir, o);
    load_off.push_back(bench::now_s() - t);
    setenv("PHALANX_DATA_CACHE", sub.c_str(), 1);
    mapped.reset();
    t = bench::now_s();
    load_mnist(kFashionMnistDir, o);
    load_cold.push_back(bench::now_s() - t);
    t = bench::now_s();
    mapped = load_mnist(kFashionMnistDir, o);
    load_warm.push_back(bench::now_s() - t);
  }
  const bench::Summary off = bench::summarise(load_off), cold = bench::summarise(load_cold),
                       warm = bench::summarise(load_warm);
  std::printf("load Fashion-MNIST train, standardized, %d rounds, median [fastest, slowest]:\n  private %s   cache cold %s"
              "   cache warm %s\n", kRounds, bench::show(off, "s").c_str(), bench::show(cold, "s").c_str(),
              bench::show(warm, "s").c_str());

  // The raw pixels in a mapped file of their own, for standardizing at gather time.
  const std::string raw_path = std::string(dir) + "/raw.u8";
  {
    Tensor px = load_idx(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz");
    std::vector<unsigned char> bytes(px.numel());
    const auto* p = px.data<std::int64_t>();
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(p[i]);
    FILE* f = std::fopen(raw_path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  const int fd = open(raw_path.c_str(), O_RDONLY);
  const std::size_t raw_n = 60000 * 784;
  const auto* raw = static_cast<const unsigned char*>(mmap(nullptr, raw_n, PROT_READ, MAP_PRIVATE, fd, 0));
  close(fd);

  const std::int64_t n = priv->size();
  Tensor x = Tensor::empty({64, 784}), y = Tensor::empty({64}, DType::Int64);
  const bench::Summary us_priv = bench::summarise(per_batch_us(n, [&](const std::int64_t* i) { priv->gather(i, 64, x, y); }));
  const bench::Summary us_map = bench::summarise(per_batch_us(n, [&](const std::int64_t* i) { mapped->gather(i, 64, x, y); }));
  const float scale = 1.f / 255.f, mean = o.mean, sd = o.std;
  const auto* labels = mapped->labels().data<std::int64_t>();
  const bench::Summary us_u8 = bench::summarise(per_batch_us(n, [&](const std::int64_t* i) {
    float* xd = x.data<float>();
    auto* yd = y.data<std::int64_t>();
    for (int r = 0; r < 64; ++r) {
      const unsigned char* s = raw + i[r] * 784;
      for (int c = 0; c < 784; ++c) xd[r * 784 + c] = (static_cast<float>(s[c]) * scale - mean) / sd;
      yd[r] = labels[i[r]];
    }
  }));
  std::printf("gather 64 x 784 (µs per batch, thread CPU time, median [fastest, slowest] of %d rounds):\n  private float32 %s"
              "   mapped float32 %s   mapped uint8 + standardize %s\n", kRounds, bench::show(us_priv, "us").c_str(),
              bench::show(us_map, "us").c_str(), bench::show(us_u8, "us").c_str());
  std::printf("shared bytes per host:  float32 entry %.0f MB   uint8 entry %.0f MB\n",
              mapped->features().nbytes() / 1e6, raw_n / 1e6);
  bench::result_row("bench_data_memory", "load Fashion-MNIST from the warm per-host cache vs private memory", warm,
                    "private load", off, "s", 1, "-");
  bench::result_row("bench_data_memory", "gather 64 rows from the mapped float32 cache vs private float32", us_map,
                    "private", us_priv, "us", 1, "-");
  bench::result_row("bench_data_memory", "gather 64 rows: mapped uint8 + standardize vs mapped float32", us_u8,
                    "mapped float32", us_map, "us", 1, "-");
  std::system((std::string("rm -rf ") + dir).c_str());
  bench::print_load_at_end();
  return 0;
}
