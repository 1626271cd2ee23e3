// Exact mode (docs/exact.md): the same weights, bit for bit, on 1, 2, 3 or 4 workers with a
// shuffled assignment of micro-batches to ranks; close to normal mode; exact_mean; the
// errors; the fixed-point kernels; and normal mode's run-to-run determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>

#include "phalanx/core/autocast.hpp"
#include "phalanx/core/kernels.hpp"
#include "support/ddp_fixtures.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;
using parallel::DDPOptions;

namespace {

constexpr std::int64_t kSamples = 96, kFeatures = 16, kClasses = 5;
constexpr std::int64_t kGlobal = 24, kMicro = 2, kK = kGlobal / kMicro;  // 12 micro-batches a step

Data make_data() { return phalanx::test::make_data(kSamples, kFeatures, kClasses); }

/// Eight parameters; with a tiny bucket cap each gets an int64 bucket of its own.
std::shared_ptr<nn::Module> make_model() {
  Generator g(3);
  return nn::mlp({kFeatures, 24, 24, 24, kClasses}, "tanh", &g);
}

std::vector<std::int64_t> shuffled(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  Generator g(seed);
  for (std::int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[g.next_u64() % (i + 1)]);
  return v;
}

/// Samples of global micro-batch m of step t (shuffled once per epoch of 4 steps).
std::vector<std::int64_t> micro_samples(std::int64_t step, std::int64_t m) {
  const auto order = shuffled(kSamples, 1000 + step / (kSamples / kGlobal));
  const std::int64_t base = (step % (kSamples / kGlobal)) * kGlobal + m * kMicro;
  return {order.begin() + base, order.begin() + base + kMicro};
}

/// Rank r's micro-batches of step t: a shuffled assignment, different every step.
std::vector<std::int64_t> my_micro_batches(std::int64_t step, int rank, int world) {
  const auto perm = shuffled(kK, 7 + step);
  const std::int64_t per = kK / world;
  return {perm.begin() + rank * per, perm.begin() + (rank + 1) * per};
}

void gather(const Data& d, const std::vector<std::int64_t>& idx, Tensor& xb, Tensor& yb) {
  xb = Tensor::empty({static_cast<std::int64_t>(idx.size()), kFeatures});
  yb = Tensor::empty({static_cast<std::int64_t>(idx.size())}, DType::Int64);
  samplers::TensorDataset(d.x, d.y).gather(idx.data(), static_cast<std::int64_t>(idx.size()), xb, yb);
}

std::vector<char> bytes_of(const std::vector<Tensor>& ps) {
  std::vector<char> out;
  for (const auto& p : ps) {
    const auto v = p.to_vector<float>();
    const char* b = reinterpret_cast<const char*>(v.data());
    out.insert(out.end(), b, b + v.size() * sizeof(float));
  }
  return out;
}

DDPOptions exact_options() {
  DDPOptions o;
  o.exact().enabled = true;
  o.exact().global_batch = kGlobal;
  o.exact().micro_batch = kMicro;
  o.bucket_cap_mb(512.0 / (1 << 20)).first_bucket_mb(512.0 / (1 << 20));  // 512 B of gradients: 4 buckets
  return o;
}

/// Forwards under autocast (bf16) when set (read by every rank's thread).
bool g_autocast = false;

struct Run {
  std::vector<char> weights;
  std::vector<double> losses;  // exact_mean per step
};

/// `steps` exact steps on this rank; the weights' bytes and the logged losses.
Run train_exact(ProcessGroupPtr pg, const std::string& opt_kind, int steps, bool zero_grad,
                Device device = Device::cpu()) {
  const Data d = make_data();
  auto model = make_model();
  model->to(device);
  DDP ddp(model, pg, exact_options());
  const int W = pg->size();
  if (ddp.micro_batches_per_rank() != kK / W) throw std::runtime_error("micro_batches_per_rank");
  if (ddp.bucket_layout().size() < 4) throw std::runtime_error("fewer than 4 buckets");
  auto opt = make_opt(opt_kind, ddp.parameters());
  Run run;
  for (int t = 0; t < steps; ++t) {
    if (zero_grad) opt->zero_grad();
    std::vector<std::pair<std::int64_t, double>> losses;
    for (std::int64_t m : my_micro_batches(t, pg->rank(), W)) {
      Tensor xb, yb;
      gather(d, micro_samples(t, m), xb, yb);
      Tensor loss;
      {
        std::optional<autocast> ac;
        if (g_autocast) ac.emplace(DType::BFloat16);
        loss = cross_entropy(ddp.forward(xb.to(device)), yb.to(device));
      }
      losses.emplace_back(m, loss.item());
      loss.backward();
    }
    opt->step();
    run.losses.push_back(parallel::exact_mean(*pg, losses, kK));
  }
  run.weights = bytes_of(ddp.parameters());
  return run;
}

/// W ranks as threads over `backend`: gloo reduces each bucket's int64 sums in one allreduce
/// (on its worker thread), shm (inline) chunk by chunk.
Run run_world(int W, const std::string& opt_kind, int steps, bool zero_grad = true,
              const std::string& backend = "gloo") {
  std::vector<Run> runs(W);
  auto store = std::make_shared<MemoryStore>();
  run_threads(W, [&](int rank) {
    auto pg = make_thread_group(backend, rank, W, store);
    runs[rank] = train_exact(pg, opt_kind, steps, zero_grad);
  });
  for (int r = 1; r < W; ++r) {
    REQUIRE(runs[r].weights == runs[0].weights);
    REQUIRE(runs[r].losses == runs[0].losses);
  }
  return runs[0];
}

/// Normal mode on one process: the same samples as one batch of kGlobal per step.
std::vector<Tensor> train_plain(const std::string& opt_kind, int steps) {
  const Data d = make_data();
  auto model = make_model();
  auto opt = make_opt(opt_kind, model->parameters());
  for (int t = 0; t < steps; ++t) {
    std::vector<std::int64_t> idx;
    for (std::int64_t m = 0; m < kK; ++m) {
      const auto s = micro_samples(t, m);
      idx.insert(idx.end(), s.begin(), s.end());
    }
    Tensor xb, yb;
    gather(d, idx, xb, yb);
    opt->zero_grad();
    cross_entropy(model->forward(xb), yb).backward();
    opt->step();
  }
  return model->parameters();
}

std::vector<float> floats_of(const std::vector<char>& bytes) {
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), bytes.size());
  return f;
}

}  // namespace

TEST_CASE("exact mode: the same weights and logged losses, bit for bit, on W = 1, 2, 3, 4 (SGD momentum, AdamW)") {
  set_num_threads(1);
  for (const std::string opt_kind : {"sgd", "adamw"}) {
    CAPTURE(opt_kind);
    const Run one = run_world(1, opt_kind, 5);
    for (const std::string backend : {"gloo", "shm"})
      for (int W : {2, 3, 4}) {
        CAPTURE(backend);
        CAPTURE(W);
        const Run many = run_world(W, opt_kind, 5, true, backend);
        CHECK(many.weights == one.weights);
        CHECK(many.losses == one.losses);
      }
    // Exactness does not cost accuracy: within 1e-6 (relative, in norm) of normal mode with
    // SGD, whose update is linear in the gradient. Adam's first steps divide each gradient by
    // its own magnitude (m / sqrt(v) ~ sign(g)), so a gradient element that is a few ulp from
    // zero can take another sign when the sums are ordered differently (the float32 GEMM's
    // AVX2 and AVX-512 kernels block differently): 3.4e-6 measured on an AVX2-only EPYC,
    // < 1e-6 on an AVX-512 Xeon; 1e-5 holds both.
    const double tolerance = opt_kind == "sgd" ? 1e-6 : 1e-5;
    const auto plain = train_plain(opt_kind, 5);
    const auto exact = floats_of(one.weights);
    std::size_t at = 0;
    for (const auto& p : plain) {
      const auto v = p.to_vector<float>();
      double diff = 0, norm = 0;
      for (float w : v) {
        diff += (exact[at] - static_cast<double>(w)) * (exact[at] - static_cast<double>(w));
        norm += static_cast<double>(w) * w;
        ++at;
      }
      CHECK(std::sqrt(diff / norm) < tolerance);
    }
  }
}

TEST_CASE("exact mode under autocast (bf16 forward): the same bits on W = 1, 2, 3") {
  // A micro-batch's bf16 forward and its float32 master gradients are the same float
  // operations on whichever rank runs it; the integer sums do not care how they were computed.
  set_num_threads(1);
  const Run fp32 = run_world(1, "sgd", 3);
  g_autocast = true;
  const Run one = run_world(1, "sgd", 3);
  const Run two = run_world(2, "sgd", 3);
  const Run three = run_world(3, "sgd", 3, true, "shm");
  g_autocast = false;
  CHECK(one.weights != fp32.weights);  // autocast took effect
  CHECK(two.weights == one.weights);
  CHECK(two.losses == one.losses);
  CHECK(three.weights == one.weights);
  CHECK(three.losses == one.losses);
}

TEST_CASE("exact mode: W = 2 as forked processes over TCP equals W = 1 in this process") {
  set_num_threads(1);
  const Run one = run_world(1, "sgd", 3);
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  char path[] = "/tmp/phalanx_exact_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    auto pg = parallel::init_process_group();
    const Run r = train_exact(pg, "sgd", 3, false);
    if (rank == 0) {
      std::ofstream(path, std::ios::binary).write(r.weights.data(), static_cast<std::streamsize>(r.weights.size()));
    }
    return 0;
  });
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  CHECK(got == one.weights);
}

TEST_CASE("exact mode on the sim test accelerator: the CPU's bits on W = 1 and 2 (nothing reads device memory on the host)") {
  set_num_threads(1);
  const Run cpu = run_world(1, "adamw", 3);
  for (const auto& [backend, W] : std::vector<std::pair<std::string, int>>{{"gloo", 1}, {"gloo", 2}, {"shm", 2}}) {
    CAPTURE(backend);
    CAPTURE(W);
    std::vector<Run> runs(W);
    auto store = std::make_shared<MemoryStore>();
    run_threads(W, [&](int rank) {
      auto pg = make_thread_group(backend, rank, W, store);
      runs[rank] = train_exact(pg, "adamw", 3, true, Device::sim());
    });
    for (const Run& r : runs) {
      CHECK(r.weights == cpu.weights);
      CHECK(r.losses == cpu.losses);
    }
  }
}

TEST_CASE("exact mode lays out its buckets by the normal reducer's rule") {
  // Reverse registration order; the first bucket closes at 256 B of float32 gradients, the
  // others at 512 B; the 8 KiB weight (parameter 0) and the 512 B bias (1) each fill one.
  const std::vector<std::vector<std::size_t>> want{{17, 16, 15, 14}, {13, 12, 11, 10}, {9, 8, 7, 6},
                                                   {5, 4, 3, 2},     {1},              {0}};
  std::vector<std::vector<std::vector<std::size_t>>> normal(2), exact(2);
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store);
    DDPOptions o = exact_options().first_bucket_mb(256.0 / (1 << 20));
    exact[rank] = DDP(many_small_one_large(), pg, o).bucket_layout();
    o.exact().enabled = false;
    normal[rank] = DDP(many_small_one_large(), pg, o).bucket_layout();
  });
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(normal[rank] == want);
    CHECK(exact[rank] == want);
  }
}

TEST_CASE("exact mode: sums in cache-sized chunks (CPU, shared memory) give the bits of whole buckets") {
  // 55005 parameters: the first weight (40000) spans two 32768-element chunks; one bucket for
  // all of them (default caps) or three. Chunked: W = 1 and shm (inline);
  // whole buckets: gloo (a worker thread).
  set_num_threads(1);
  const Data d = make_data();
  auto train = [&](ProcessGroupPtr pg, bool small_buckets) {
    Generator g(11);
    DDPOptions o = exact_options();
    if (!small_buckets) o.bucket_cap_mb(25).first_bucket_mb(25);
    DDP ddp(nn::mlp({kFeatures, 2500, kClasses}, "relu", &g), pg, o);
    if (ddp.bucket_layout().size() != (small_buckets ? 3u : 1u)) throw std::runtime_error("bucket layout");
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
    for (int t = 0; t < 2; ++t) {
      for (std::int64_t m : my_micro_batches(t, pg->rank(), pg->size())) {
        Tensor xb, yb;
        gather(d, micro_samples(t, m), xb, yb);
        cross_entropy(ddp.forward(xb), yb).backward();
      }
      opt.step();
    }
    return bytes_of(ddp.parameters());
  };
  for (const bool small_buckets : {false, true}) {
    CAPTURE(small_buckets);
    std::vector<char> one;
    run_threads(1, [&](int) { one = train(make_world_of_one(), small_buckets); });
    for (const auto& [backend, W] : std::vector<std::pair<std::string, int>>{{"gloo", 2}, {"shm", 2}, {"shm", 3}}) {
      CAPTURE(backend);
      CAPTURE(W);
      std::vector<std::vector<char>> got(W);
      auto store = std::make_shared<MemoryStore>();
      run_threads(W, [&](int rank) { got[rank] = train(make_thread_group(backend, rank, W, store), small_buckets); });
      for (const auto& w : got) CHECK(w == one);
    }
  }
}

TEST_CASE("exact mode: ranks whose own settings differ (shm inline on one rank only, a CPU and a sim rank) agree on the schedule") {
  // Whether the sums go chunk by chunk is one collective decision: a rank with shm's worker
  // thread (PHALANX_SHM_INLINE=0) or its model on an accelerator next to a chunking rank
  // must not issue other allreduces than its peer (a mismatch, or the W = 1 bits lost).
  set_num_threads(1);
  const Data d = make_data();
  auto train = [&](ProcessGroupPtr pg, Device device) {
    Generator g(11);
    DDPOptions o = exact_options();
    o.bucket_cap_mb(25).first_bucket_mb(25);  // one bucket of 55005 elements: two chunks
    auto model = nn::mlp({kFeatures, 2500, kClasses}, "relu", &g);
    model->to(device);
    DDP ddp(model, pg, o);
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
    for (int t = 0; t < 2; ++t) {
      for (std::int64_t m : my_micro_batches(t, pg->rank(), pg->size())) {
        Tensor xb, yb;
        gather(d, micro_samples(t, m), xb, yb);
        cross_entropy(ddp.forward(xb.to(device)), yb.to(device)).backward();
      }
      opt.step();
    }
    return bytes_of(ddp.parameters());
  };
  std::vector<char> one;
  run_threads(1, [&](int) { one = train(make_world_of_one(), Device::cpu()); });
  {  // threads: rank 1's model on the sim device (shm stages its tensors)
    std::vector<std::vector<char>> got(2);
    auto store = std::make_shared<MemoryStore>();
    run_threads(2, [&](int rank) {
      got[rank] = train(make_thread_group("shm", rank, 2, store, std::chrono::seconds(20)),
                        rank == 1 ? Device::sim() : Device::cpu());
    });
    for (const auto& w : got) CHECK(w == one);
  }
  // Processes: shm inline on rank 0, on its worker thread on rank 1.
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  char path[] = "/tmp/phalanx_exact_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port, "shm");
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    ::setenv("PHALANX_SHM_INLINE", rank == 0 ? "1" : "0", 1);
    ::setenv("PHALANX_TIMEOUT", "20", 1);
    auto pg = parallel::init_process_group();
    const auto w = train(pg, Device::cpu());
    if (rank == 0) std::ofstream(path, std::ios::binary).write(w.data(), static_cast<std::streamsize>(w.size()));
    return 0;
  });
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  CHECK(got == one);
}

TEST_CASE("exact mode: zero_grad is optional (the step's first micro-batch overwrites .grad)") {
  set_num_threads(1);
  CHECK(run_world(2, "sgd", 3, false).weights == run_world(2, "sgd", 3, true).weights);
}

TEST_CASE("exact mode: .grad() is undefined between micro-batches and the global mean after the last") {
  const Data d = make_data();
  auto pg = make_world_of_one();
  DDPOptions o = exact_options();
  o.exact().global_batch = 4;  // two micro-batches of 2
  auto model = make_model();
  DDP ddp(model, pg, o);
  Tensor xb, yb;
  gather(d, {0, 1}, xb, yb);
  cross_entropy(ddp.forward(xb), yb).backward();
  for (const auto& p : ddp.parameters()) CHECK_FALSE(p.grad().defined());
  gather(d, {2, 3}, xb, yb);
  cross_entropy(ddp.forward(xb), yb).backward();
  auto ref = make_model();
  gather(d, {0, 1, 2, 3}, xb, yb);
  cross_entropy(ref->forward(xb), yb).backward();
  const auto got = ddp.parameters(), want = ref->parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto g = got[i].grad().to_vector<float>(), w = want[i].grad().to_vector<float>();
    for (std::size_t k = 0; k < g.size(); ++k) CHECK(std::abs(g[k] - w[k]) <= 1e-6 * (1 + std::abs(w[k])));
  }
}

namespace {
class TwoHeads : public nn::Module {
 public:
  TwoHeads() {
    Generator g(7);
    a = register_module("a", std::make_shared<nn::Linear>(kFeatures, kClasses, true, &g));
    b = register_module("b", std::make_shared<nn::Linear>(kFeatures, kClasses, true, &g));
  }
  Tensor forward(const Tensor& x) override { return use_b ? b->forward(x) : a->forward(x); }
  std::string describe() const override { return "TwoHeads"; }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = false;
};

std::vector<char> train_two_heads(int W, int rank, ProcessGroupPtr pg) {
  const Data d = make_data();
  auto model = std::make_shared<TwoHeads>();
  DDPOptions o = exact_options();
  o.bucket_cap_mb(16.0 / (1 << 20)).first_bucket_mb(16.0 / (1 << 20));  // a bucket per parameter: an unused
  DDP ddp(model, pg, o);                                   // head's buckets hold up the others
  if (ddp.bucket_layout().size() != 4) throw std::runtime_error("expected 4 buckets");
  optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
  for (int t = 0; t < 3; ++t) {
    for (std::int64_t m : my_micro_batches(t, rank, W)) {
      model->use_b = m % 3 == 0;  // head b only in some micro-batches, whoever runs them
      Tensor xb, yb;
      gather(d, micro_samples(t, m), xb, yb);
      cross_entropy(ddp.forward(xb), yb).backward();
    }
    opt.step();
  }
  return bytes_of(ddp.parameters());
}
}  // namespace

TEST_CASE("exact mode: parameters unused by some micro-batches contribute zero, the same bits on any W") {
  std::vector<char> one;
  run_threads(1, [&](int) { one = train_two_heads(1, 0, make_world_of_one()); });
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<char>> got(3);
  run_threads(3, [&](int rank) { got[rank] = train_two_heads(3, rank, make_thread_group("gloo", rank, 3, store)); });
  for (const auto& g : got) CHECK(g == one);
}

TEST_CASE("exact_mean: index order, the same bits on any W, and its errors") {
  // Values whose float sum depends on the order: only the index order is used.
  std::vector<double> v = {1e16, 1.0, -1e16, 3.25, 1e-3, -7.5, 2.0 / 3.0, 1e8, -0.1, 42.0, 5e-9, 1.5};
  double serial = 0;
  for (double x : v) serial += x;
  serial /= static_cast<double>(v.size());
  for (int W : {1, 2, 3, 4}) {
    auto store = std::make_shared<MemoryStore>();
    run_threads(W, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, W, store);
      std::vector<std::pair<std::int64_t, double>> mine;
      const auto perm = shuffled(12, 5);
      for (std::size_t i = rank; i < perm.size(); i += W) mine.emplace_back(perm[i], v[perm[i]]);
      const double got = parallel::exact_mean(*pg, mine, 12);
      REQUIRE_RANK(rank, std::memcmp(&got, &serial, sizeof(double)) == 0, detail::concat(got, " vs ", serial));
    });
  }
  ProcessGroup one(std::make_unique<WorldOfOneBackend>());
  CHECK_THROWS_WITH_AS(parallel::exact_mean(one, {{12, 1.0}}, 12), doctest::Contains("outside [0, 12)"), ValueError);
  CHECK_THROWS_WITH_AS(parallel::exact_mean(one, {{1, 1.0}, {1, 2.0}}, 2), doctest::Contains("twice"), ValueError);
  CHECK_THROWS_WITH_AS(parallel::exact_mean(one, {{0, 1.0}}, 2), doctest::Contains("index 1 was given by 0"),
                       ConfigError);
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store);
    try {
      parallel::exact_mean(*pg, {{0, 1.0}, {1, 2.0}}, 2);  // both ranks give both
      REQUIRE_RANK(rank, false, "expected an error");
    } catch (const ConfigError& e) {
      REQUIRE_RANK(rank, std::string(e.what()).find("index 0 was given by 2 rank(s)") != std::string::npos, e.what());
    }
  });
}

TEST_CASE("exact mode: clear errors for sizes, hooks, no_sync, buffers, input size, backward without forward") {
  auto one = make_world_of_one();
  DDPOptions o = exact_options();
  o.exact().micro_batch = 5;
  CHECK_THROWS_WITH_AS(DDP(make_model(), one, o), doctest::Contains("micro-batch (5) does not divide the global batch (24)"),
                       ConfigError);
  o.exact().micro_batch = 0;
  CHECK_THROWS_AS(DDP(make_model(), one, o), ConfigError);
  auto store = std::make_shared<MemoryStore>();
  run_threads(5, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 5, store);
    try {
      DDP ddp(make_model(), pg, exact_options());
      REQUIRE_RANK(rank, false, "expected an error");
    } catch (const ConfigError& e) {
      REQUIRE_RANK(rank, std::string(e.what()).find("world size (5) does not divide the 12 micro-batches") != std::string::npos,
                   e.what());
    }
  });
  DDP ddp(make_model(), one, exact_options());
  CHECK_THROWS_WITH_AS(ddp.register_comm_hook(parallel::fp16_compress_hook()), doctest::Contains("exact mode"), ConfigError);
  CHECK_THROWS_WITH_AS(ddp.no_sync(), doctest::Contains("exact mode"), ConfigError);
  const Data d = make_data();
  Tensor xb, yb;
  gather(d, {0, 1, 2}, xb, yb);
  CHECK_THROWS_WITH_AS(ddp.forward(xb), doctest::Contains("the micro-batch is 2"), ShapeError);
  {
    NoGradGuard g;  // evaluation: any batch size
    CHECK_NOTHROW(ddp.forward(xb));
  }
  gather(d, {0, 1}, xb, yb);
  Tensor loss = cross_entropy(ddp.forward(xb), yb);
  // A forward without its backward: the next forward voids the step (the missing backward
  // could have failed before reaching a parameter; counting on would shift the micro-batches).
  CHECK_THROWS_WITH_AS(ddp.forward(xb), doctest::Contains("got no backward"), AutogradError);
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("without a forward"), AutogradError);
  cross_entropy(ddp.forward(xb), yb).backward();  // the next step starts cleanly
  class WithBuffer : public nn::Module {
   public:
    WithBuffer() {
      register_module("fc", std::make_shared<nn::Linear>(2, 2));
      register_buffer("running_mean", zeros({2}));
    }
    Tensor forward(const Tensor& x) override { return x; }
    std::string describe() const override { return "WithBuffer"; }
  };
  CHECK_THROWS_WITH_AS(DDP(std::make_shared<WithBuffer>(), one, exact_options()), doctest::Contains("running_mean"),
                       ConfigError);
}

TEST_CASE("exact mode: a NaN gradient on one rank voids the step on every rank, naming the parameter; the next step works") {
  const Data d = make_data();
  // In a middle micro-batch, and in the last one (whose buckets are agreed during backward).
  for (const std::size_t nan_at : {std::size_t{2}, std::size_t{5}}) {
    CAPTURE(nan_at);
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::string> messages(2);
    run_threads(2, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, 2, store, std::chrono::seconds(20));
      DDP ddp(make_model(), pg, exact_options());
      for (int t = 0; t < 2; ++t) {
        bool failed = false;
        for (std::int64_t m : my_micro_batches(t, rank, 2)) {
          Tensor xb, yb;
          gather(d, micro_samples(t, m), xb, yb);
          if (t == 0 && rank == 1 && m == my_micro_batches(t, rank, 2)[nan_at]) xb.mul_(NAN);
          try {
            cross_entropy(ddp.forward(xb), yb).backward();
          } catch (const ValueError& e) {
            failed = true;
            messages[rank] = e.what();
            REQUIRE_RANK(rank, std::string(e.what()).find("gradient of parameter '") != std::string::npos &&
                                   std::string(e.what()).find("not finite") != std::string::npos,
                         e.what());
          }
        }
        REQUIRE_RANK(rank, failed == (t == 0), "the NaN step fails on every rank, the next one does not");
        for (const auto& p : ddp.parameters()) REQUIRE_RANK(rank, p.grad().defined() == (t == 1), "gradients");
      }
    });
    CHECK(messages[0] == messages[1]);  // the same parameter named on every rank
  }
}

TEST_CASE("exact mode: a backward that stops part-way on one rank voids the step on every rank; the next step is in step") {
  const Data d = make_data();
  // In a middle micro-batch, and in the last one, after some buckets' maxima were agreed.
  for (const std::size_t fail_at : {std::size_t{1}, std::size_t{5}}) {
    CAPTURE(fail_at);
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::vector<char>> after(2);
    run_threads(2, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, 2, store, std::chrono::seconds(20));
      auto model = make_model();
      DDP ddp(model, pg, exact_options());
      bool fail = false;
      const Tensor where = model->parameters()[2];
      const auto id = where.register_grad_accumulated_hook([&](const Tensor&) {
        if (fail) throw ValueError("injected failure inside backward");
      });
      const auto mine = my_micro_batches(0, rank, 2);
      std::string seen;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        Tensor xb, yb;
        gather(d, micro_samples(0, mine[i]), xb, yb);
        fail = rank == 0 && i == fail_at;
        try {
          cross_entropy(ddp.forward(xb), yb).backward();
        } catch (const Error& e) {
          seen += e.what();
          if (rank == 0 && i == fail_at) break;  // the failing rank leaves the step
        }
      }
      fail = false;
      if (rank == 0) {
        // Its next forward completes the void step with the peer and says so.
        Tensor xb, yb;
        gather(d, micro_samples(1, 0), xb, yb);
        try {
          cross_entropy(ddp.forward(xb), yb).backward();
          REQUIRE_RANK(rank, false, "expected the void step's error");
        } catch (const AutogradError& e) {
          REQUIRE_RANK(rank, std::string(e.what()).find("step is void on every rank") != std::string::npos, e.what());
        }
        REQUIRE_RANK(rank, seen.find("injected") != std::string::npos, seen);
      } else {
        REQUIRE_RANK(rank, seen.find("stopped part-way on at least one of 2") != std::string::npos, seen);
      }
      where.remove_grad_accumulated_hook(id);
      // The next step pairs with the peer's next step and gives the exact gradients.
      for (std::int64_t m : my_micro_batches(1, rank, 2)) {
        Tensor xb, yb;
        gather(d, micro_samples(1, m), xb, yb);
        cross_entropy(ddp.forward(xb), yb).backward();
      }
      std::vector<Tensor> grads;
      for (const auto& p : ddp.parameters()) grads.push_back(p.grad());
      after[rank] = bytes_of(grads);
    });
    CHECK(after[0] == after[1]);
  }
}

TEST_CASE("fixed-point kernels: round half to even, negatives, order independence, conversion back") {
  DeviceKernels& k = kernels_for(Device::cpu());
  Tensor x = Tensor::empty({6});
  const std::vector<float> xs = {0.375f, 0.625f, -0.375f, -0.625f, 1.0f, -2.0f};
  std::memcpy(x.data<float>(), xs.data(), sizeof(float) * xs.size());
  Tensor acc = zeros({6}, DType::Int64);
  k.fixed_point_accumulate(x, 4.0, acc);  // 1.5 2.5 -1.5 -2.5 4 -8
  CHECK(acc.to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 2, -2, -2, 4, -8});
  k.fixed_point_accumulate(x, 4.0, acc);
  CHECK(acc.to_vector<std::int64_t>() == std::vector<std::int64_t>{4, 4, -4, -4, 8, -16});
  Tensor out = Tensor::empty({6});
  k.fixed_point_to_float(acc, 4.0, 2.0, out);  // (acc / 4) / 2
  CHECK(out.to_vector<float>() == std::vector<float>{0.5f, 0.5f, -0.5f, -0.5f, 1.0f, -2.0f});
  // Order independence: 40 values of mixed magnitude summed in many orders, same bits.
  Generator g(1);
  std::vector<Tensor> vals;
  for (int i = 0; i < 40; ++i) vals.push_back(randn({257}, &g).mul_(std::pow(10.f, static_cast<float>(i % 7 - 3))));
  const double scale = std::ldexp(1.0, 40);
  std::vector<std::int64_t> first;
  std::vector<float> first_float;
  for (int order = 0; order < 5; ++order) {
    const auto perm = shuffled(40, 100 + order);
    Tensor a = zeros({257}, DType::Int64);
    for (std::int64_t i : perm) k.fixed_point_accumulate(vals[i], scale, a);
    Tensor f = Tensor::empty({257});
    k.fixed_point_to_float(a, scale, 40.0, f);
    if (order == 0) {
      first = a.to_vector<std::int64_t>();
      first_float = f.to_vector<float>();
    } else {
      CHECK(a.to_vector<std::int64_t>() == first);
      CHECK(f.to_vector<float>() == first_float);
    }
  }
  // The kernel's (vector) conversion is llrint's, at every scale the reducer can pick, on
  // lengths that are not a multiple of the vector width; the conversion back is the
  // correctly rounded (double(acc) / scale) / count.
  Tensor wide = randn({1027}, &g);
  auto wv = wide.to_vector<float>();
  for (std::size_t i = 0; i < wv.size(); ++i) wv[i] *= std::pow(10.f, static_cast<float>(static_cast<int>(i % 13) - 6));
  wv[3] = 0.f;
  wv[4] = -0.f;
  wv[5] = 1e-45f;
  wv[6] = -1e-45f;
  std::memcpy(wide.data<float>(), wv.data(), wv.size() * sizeof(float));
  float wmax = 0;
  for (float f : wv) wmax = std::max(wmax, std::abs(f));
  int we = 0;
  std::frexp(static_cast<double>(wmax), &we);
  for (const char* simd : {"scalar", "avx2", "avx512"})  // each path this CPU has
  for (int sexp = -60; sexp <= 61 - 2 - we; sexp += 7) {
    const std::string path = simd;
    CAPTURE(path);
    CAPTURE(sexp);
    ::setenv("PHALANX_FIXED_POINT_SIMD", simd, 1);
    const double sc = std::ldexp(1.0, sexp);
    Tensor a = zeros({1027}, DType::Int64);
    k.fixed_point_accumulate(wide, sc, a);
    k.fixed_point_accumulate(wide, sc, a);
    const auto got = a.to_vector<std::int64_t>();
    bool same = true, same_back = true;
    for (std::size_t i = 0; i < wv.size(); ++i) same = same && got[i] == 2 * std::llrint(static_cast<double>(wv[i]) * sc);
    // A power-of-two count is folded into the scale's reciprocal (no division): same bits.
    for (const double count : {3.0, 1.0, 2.0, 4.0, 12.0, 1048576.0}) {
      Tensor back = Tensor::empty({1027});
      k.fixed_point_to_float(a, sc, count, back);
      const auto gb = back.to_vector<float>();
      for (std::size_t i = 0; i < wv.size(); ++i)
        same_back = same_back && gb[i] == static_cast<float>((static_cast<double>(got[i]) / sc) / count);
    }
    ::unsetenv("PHALANX_FIXED_POINT_SIMD");
    CHECK(same);
    CHECK(same_back);
  }
  // The conversion back on int64 sums of any size (rounded to double, then to float), at
  // scales from 2^-80 to 2^200 and power-of-two counts up to 2^30, and a few others.
  {
    std::vector<std::int64_t> big(1003);
    for (std::size_t i = 0; i < big.size(); ++i)
      big[i] = static_cast<std::int64_t>(g.next_u64() >> (1 + i % 62)) * (i % 2 ? -1 : 1);
    big[0] = (std::int64_t{1} << 62) - 1;
    big[1] = -(std::int64_t{1} << 62);
    big[2] = 0;
    Tensor a = Tensor::empty({1003}, DType::Int64);
    std::memcpy(a.data<std::int64_t>(), big.data(), big.size() * 8);
    for (const char* simd : {"scalar", "avx2", "avx512"})
      for (int sexp = -80; sexp <= 200; sexp += 40)
        for (const double count : {1.0, 2.0, 8.0, 1073741824.0, 6.0, 12.0}) {
          const std::string path = simd;
          CAPTURE(path);
          CAPTURE(sexp);
          CAPTURE(count);
          ::setenv("PHALANX_FIXED_POINT_SIMD", simd, 1);
          const double sc = std::ldexp(1.0, sexp);
          Tensor back = Tensor::empty({1003});
          k.fixed_point_to_float(a, sc, count, back);
          ::unsetenv("PHALANX_FIXED_POINT_SIMD");
          const auto gb = back.to_vector<float>();
          bool same = true;
          for (std::size_t i = 0; i < big.size(); ++i) {
            const float want = static_cast<float>((static_cast<double>(big[i]) / sc) / count);
            same = same && std::memcmp(&gb[i], &want, sizeof want) == 0;  // -0 vs 0, Inf too
          }
          CHECK(same);
        }
  }
  // A scale that is not a power of two: x * scale may end in .5 beyond 2^51 (2^51 + 1.5 rounds
  // to 2^51 + 2, where a cast would truncate); llrint's bits on every path all the same.
  for (const char* simd : {"scalar", "avx2", "avx512"}) {
    const std::string path = simd;
    CAPTURE(path);
    ::setenv("PHALANX_FIXED_POINT_SIMD", simd, 1);
    const std::vector<float> odd = {1.f, -1.f, 0.5f, -0.5f, 1.f, -1.f, 0.25f, 3.f, -3.f};
    Tensor ox = Tensor::empty({9});
    std::memcpy(ox.data<float>(), odd.data(), sizeof(float) * odd.size());
    for (const double sc : {2251799813685249.5, 3.0, 0.3}) {
      CAPTURE(sc);
      Tensor a = zeros({9}, DType::Int64);
      k.fixed_point_accumulate(ox, sc, a);
      const auto got = a.to_vector<std::int64_t>();
      for (std::size_t i = 0; i < odd.size(); ++i) CHECK(got[i] == std::llrint(static_cast<double>(odd[i]) * sc));
    }
    ::unsetenv("PHALANX_FIXED_POINT_SIMD");
  }
  // abs_max_into: a running max per slot; NaN sticks.
  for (const char* simd : {"scalar", "avx2", "avx512"}) {
    const std::string path = simd;
    CAPTURE(path);
    ::setenv("PHALANX_FIXED_POINT_SIMD", simd, 1);
    Tensor big = randn({1001}, &g);
    auto bv = big.to_vector<float>();
    bv[777] = -1000.f;
    std::memcpy(big.data<float>(), bv.data(), bv.size() * sizeof(float));
    Tensor mm = zeros({1});
    k.abs_max_into(big, mm, 0);
    CHECK(mm.to_vector<float>()[0] == 1000.f);
    bv[500] = NAN;
    std::memcpy(big.data<float>(), bv.data(), bv.size() * sizeof(float));
    k.abs_max_into(big, mm, 0);
    CHECK(std::isnan(mm.to_vector<float>()[0]));
    ::unsetenv("PHALANX_FIXED_POINT_SIMD");
  }
  Tensor m = zeros({2});
  k.abs_max_into(x, m, 1);
  CHECK(m.to_vector<float>() == std::vector<float>{0.f, 2.f});
  Tensor bad = Tensor::empty({3});
  const float bs[3] = {1.f, NAN, 0.5f};
  std::memcpy(bad.data<float>(), bs, sizeof(bs));
  k.abs_max_into(bad, m, 0);
  k.abs_max_into(x, m, 0);
  CHECK(std::isnan(m.to_vector<float>()[0]));
}

TEST_CASE("normal mode: two runs with the same world size, seed and data give the same bits") {
  set_num_threads(1);
  auto run = [](const std::string& tag) {
    std::vector<std::vector<char>> out(2);
    auto store = std::make_shared<MemoryStore>();
    run_threads(2, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, 2, std::make_shared<PrefixStore>(tag, store));
      const Data d = make_data();
      DDPOptions o;
      o.bucket_cap_mb(1024.0 / (1 << 20)).first_bucket_mb(1024.0 / (1 << 20));
      DDP ddp(make_model(), pg, o);
      auto opt = make_opt("adamw", ddp.parameters());
      for (int t = 0; t < 4; ++t) {
        std::vector<std::int64_t> idx;
        for (std::int64_t m = rank; m < kK; m += 2) {
          const auto s = micro_samples(t, m);
          idx.insert(idx.end(), s.begin(), s.end());
        }
        Tensor xb, yb;
        gather(d, idx, xb, yb);
        opt->zero_grad();
        cross_entropy(ddp.forward(xb), yb).backward();
        opt->step();
      }
      out[rank] = bytes_of(ddp.parameters());
    });
    CHECK(out[0] == out[1]);
    return out[0];
  };
  CHECK(run("a") == run("b"));
}

namespace {

/// One exact step of a Linear(kCols, 1) under loss = sum(output), one sample per micro-batch:
/// the weight's gradient in micro-batch j is exactly rows[j], the bias's is 1. Returns the
/// weight's gradient after the step (the reducer's result).
constexpr std::int64_t kCols = 9, kSteps6 = 6;
std::vector<float> linear_step(DDP& ddp, const std::vector<std::vector<float>>& rows, int rank, int world) {
  const std::int64_t per = kSteps6 / world;
  for (std::int64_t j = rank * per; j < (rank + 1) * per; ++j) {
    Tensor x = Tensor::empty({1, kCols});
    std::memcpy(x.data<float>(), rows[j].data(), sizeof(float) * kCols);
    sum(ddp.forward(x)).backward();
  }
  return ddp.parameters()[0].grad().to_vector<float>();
}

/// The recipe of docs/exact.md written out: the scale from the max over all K values, llrint
/// each, sum in int64, float((double(sum) / 2^s) / K).
std::vector<float> recipe(const std::vector<std::vector<float>>& rows) {
  float mx = 0;
  for (const auto& r : rows)
    for (float v : r) mx = std::max(mx, std::abs(v));
  int e = 0;
  std::frexp(static_cast<double>(mx), &e);
  const double sc = mx == 0 ? 1.0 : std::ldexp(1.0, 61 - 3 - e);  // K = 6 <= 2^3
  std::vector<float> out;
  for (std::int64_t i = 0; i < kCols; ++i) {
    std::int64_t acc = 0;
    for (const auto& r : rows) acc += std::llrint(static_cast<double>(r[i]) * sc);
    out.push_back(static_cast<float>((static_cast<double>(acc) / sc) / 6.0));
  }
  return out;
}

}  // namespace

TEST_CASE("exact mode at the extremes: FLT_MAX, denormals, ties, -0, an all-zero gradient; every SIMD path, W = 1, 2, 3") {
  const float fmax = std::numeric_limits<float>::max(), den = std::numeric_limits<float>::denorm_min();
  const float q = std::ldexp(1.f, -58);  // with max 1 (s = 57): q * 2^57 = 0.5, a tie
  // Steps of 6 micro-batches (K = 6, not a power of two), 9 columns each.
  std::vector<std::vector<std::vector<float>>> steps = {
      // FLT_MAX in every micro-batch (6 * FLT_MAX overflows a float, not the int64 sum), and its negative
      {{fmax, -fmax, 1.f, 0.f, -0.f, fmax, 3e38f, -3e38f, den},
       {fmax, -fmax, 2.f, 0.f, -0.f, fmax, 3e38f, 3e38f, 0.f},
       {fmax, -fmax, 3.f, 0.f, -0.f, -fmax, 3e38f, -3e38f, 0.f},
       {fmax, -fmax, 4.f, 0.f, -0.f, fmax, 3e38f, 3e38f, 0.f},
       {fmax, -fmax, 5.f, 0.f, -0.f, -fmax, 3e38f, -3e38f, 0.f},
       {fmax, -fmax, 6.f, 0.f, -0.f, fmax, 3e38f, 3e38f, 0.f}},
      // ties (x.5 after scaling: 0.5, 1.5, 2.5 and negatives) on a max of 1
      {{1.f, q, 3 * q, 5 * q, -q, -3 * q, -5 * q, 7 * q, -0.f},
       {0.f, q, 3 * q, 5 * q, -q, -3 * q, -5 * q, 9 * q, -0.f},
       {0.f, q, 3 * q, 5 * q, -q, -3 * q, -5 * q, -7 * q, -0.f},
       {0.f, q, 3 * q, 5 * q, -q, -3 * q, -5 * q, 11 * q, -0.f},
       {0.f, q, 3 * q, 5 * q, -q, -3 * q, -5 * q, 13 * q, -0.f},
       {-1.f, q, 3 * q, 5 * q, -q, -3 * q, -5 * q, -15 * q, -0.f}},
      // only denormals: the max is the smallest float
      std::vector<std::vector<float>>(6, {den, -den, den, 0.f, -0.f, den, -den, den, 0.f}),
      // an all-zero gradient (max 0)
      std::vector<std::vector<float>>(6, std::vector<float>(kCols, 0.f)),
      // a max just below a power of two, with the largest values at the int64 bound
      std::vector<std::vector<float>>(6, {0.99999994f, -0.99999994f, 0.5f, q, -q, 1e-20f, 0.f, 0.75f, -0.25f}),
  };
  for (const char* simd : {"scalar", "avx2", "avx512"}) {  // each path this CPU has
    const std::string path = simd;
    CAPTURE(path);
    ::setenv("PHALANX_FIXED_POINT_SIMD", simd, 1);
    for (const auto& [backend, W] : std::vector<std::pair<std::string, int>>{{"single", 1}, {"gloo", 2}, {"gloo", 3},
                                                                             {"shm", 2}, {"shm", 3}}) {
      CAPTURE(backend);
      CAPTURE(W);
      std::vector<std::vector<std::vector<float>>> got(W);
      auto store = std::make_shared<MemoryStore>();
      run_threads(W, [&](int rank) {
        auto pg = W == 1 ? ProcessGroupPtr(make_world_of_one())
                         : make_thread_group(backend, rank, W, store);
        Generator g(5);
        DDPOptions o;
        o.exact({true, kSteps6, 1});
        DDP ddp(nn::mlp({kCols, 1}, "tanh", &g), pg, o);
        for (const auto& rows : steps) got[rank].push_back(linear_step(ddp, rows, rank, W));
      });
      for (std::size_t t = 0; t < steps.size(); ++t) {
        CAPTURE(t);
        const auto want = recipe(steps[t]);
        for (int r = 0; r < W; ++r)
          CHECK(std::memcmp(got[r][t].data(), want.data(), sizeof(float) * kCols) == 0);  // -0 vs 0 too
      }
      CHECK(got[0][0][0] == fmax);  // the mean of six FLT_MAX, neither Inf nor wrapped
      CHECK(got[0][0][1] == -fmax);
      CHECK(got[0][1][1] == 0.f);  // six ties 0.5 -> 0 (half away from zero would give 6 / 2^57 / 6)
    }
    ::unsetenv("PHALANX_FIXED_POINT_SIMD");
  }
}

TEST_CASE("exact mode: a void step leaves no trace: the next step's gradients are a fresh DDP's, on W = 1 and 2") {
  set_num_threads(1);
  const Data d = make_data();
  // A fresh DDP's gradients for step 1 (W = 1).
  auto step_grads = [&](DDP& ddp, int rank, int W, std::int64_t t) {
    for (std::int64_t m : my_micro_batches(t, rank, W)) {
      Tensor xb, yb;
      gather(d, micro_samples(t, m), xb, yb);
      cross_entropy(ddp.forward(xb), yb).backward();
    }
    std::vector<Tensor> grads;
    for (const auto& p : ddp.parameters()) grads.push_back(p.grad());
    return bytes_of(grads);
  };
  std::vector<char> fresh;
  {
    DDP ddp(make_model(), make_world_of_one(), exact_options());
    fresh = step_grads(ddp, 0, 1, 1);
  }
  for (int W : {1, 2}) {
    CAPTURE(W);
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::vector<char>> after(W);
    run_threads(W, [&](int rank) {
      auto pg = W == 1 ? ProcessGroupPtr(make_world_of_one())
                       : make_thread_group("gloo", rank, W, store, std::chrono::seconds(20));
      DDP ddp(make_model(), pg, exact_options());
      const auto mine = my_micro_batches(0, rank, W);
      if (rank == 0) {
        // Micro-batch 0 with a huge loss (huge maxima), then a forward without its backward:
        // the next forward voids the step.
        Tensor xb, yb;
        gather(d, micro_samples(0, mine[0]), xb, yb);
        (cross_entropy(ddp.forward(xb), yb) * 1e30f).backward();
        gather(d, micro_samples(0, mine[1]), xb, yb);
        (void)ddp.forward(xb);
        bool voided = false;
        try {
          (void)ddp.forward(xb);
        } catch (const AutogradError&) {
          voided = true;
        }
        REQUIRE_RANK(rank, voided, "expected the void step's error");
      } else {
        try {
          for (std::int64_t m : mine) {
            Tensor xb, yb;
            gather(d, micro_samples(0, m), xb, yb);
            (cross_entropy(ddp.forward(xb), yb) * 1e30f).backward();  // the group's agreed maxima: huge
          }
          REQUIRE_RANK(rank, false, "expected the void step's error");
        } catch (const PeerFailedError&) {
        }
      }
      after[rank] = step_grads(ddp, rank, W, 1);
    });
    for (const auto& a : after) CHECK(a == fresh);
  }
}
