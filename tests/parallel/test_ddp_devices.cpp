// DDP on a device that is not the CPU: the sim test accelerator (its memory cannot be read
// by the host; tests/support/sim_device), over Gloo (which stages device tensors through host
// memory), W = 2 and 3 forked workers. Every scenario of the DDP equivalence suite runs twice
// on each rank, over the same group: on CPU tensors and on sim tensors. The two must agree
// bit for bit (sim runs the CPU kernels, so any difference is DDP or Gloo mishandling device
// memory), and the CPU run must equal one process within test_ddp.cpp's tolerances.
// Also: the device decided once by init, and a model that spans devices.
#include <doctest/doctest.h>

#include <cstdlib>
#include <iterator>

#include "support/ddp_fixtures.hpp"
#include "support/gradcheck.hpp"
#include "support/multirank.hpp"
#include "support/staging_check.hpp"

using namespace phalanx;
using namespace phalanx::test;
using namespace phalanx::samplers;
using parallel::DDP;
using parallel::DDPOptions;

namespace {

using Params = std::vector<std::vector<float>>;  // host copies, parameter by parameter

/// A model with a buffer: out = body(x) + shift. The buffer starts different on every rank
/// and each rank but 0 bumps it after using it, so only DDP's broadcasts (at construction,
/// then before every forward) keep every rank on rank 0's value, which one process uses.
class Shifted : public nn::Module {
 public:
  explicit Shifted(int rank) : rank_(rank) {
    body = register_module("body", many_small_one_large());
    shift = register_buffer("shift", full({5}, 0.25 * (rank + 1)));  // a handle: it follows Module::to
  }
  Tensor forward(const Tensor& x) override {
    Tensor out = body->forward(x) + shift;
    shift.add_(ones({5}, DType::Float32, shift.device()), 0.01f * rank_);
    return out;
  }
  std::string describe() const override { return "Shifted"; }
  std::shared_ptr<nn::Sequential> body;
  Tensor shift;

 private:
  int rank_;
};

nn::ModulePtr make_model(const std::string& kind, int rank) {
  if (kind == "mlp") {
    Generator g(3);
    return nn::mlp({16, 32, 32, 5}, "relu", &g);
  }
  if (kind == "shifted") return std::make_shared<Shifted>(rank);
  return many_small_one_large();
}

Params host_params(const std::vector<Tensor>& ps) {
  Params out;
  for (const auto& p : ps) out.push_back(p.to_vector<float>());
  return out;
}

/// Trains on `dev` (batches moved there); returns the final parameters.
Params train(nn::Module& model, optim::Optimizer& opt, const Data& d, Sampler* sampler, std::int64_t batch,
             int steps, Device dev) {
  train_steps(model, opt, d, sampler, batch, steps, dev);
  return host_params(model.parameters());
}

// ---- the scenarios: each a step of the equivalence suite, run by every rank on `dev` ----

struct Scenario {
  std::string name, model, opt;
  std::int64_t samples, global_batch;
  int steps;
  bool small_buckets;  // >= 4 buckets
  std::string hook;    // "" or "fp16"
  double tol;          // against one process
};

const Scenario kScenarios[] = {
    {"sgd momentum", "mlp", "sgd", 96, 24, 20, false, "", 1e-5},
    {"adamw, >= 4 buckets", "many_small_one_large", "adamw", 96, 24, 20, true, "", 3e-5},
    // fp16 keeps 11 significant bits: after 5 steps the weights differ by ~lr * steps * 2^-11
    {"fp16 comm hook", "mlp", "sgd", 48, 24, 5, false, "fp16", 2e-3},
    {"buffers, >= 4 buckets", "shifted", "sgd", 96, 24, 10, true, "", 1e-5},
};

Params run_scenario(const Scenario& s, const Data& d, const ProcessGroupPtr& pg, int rank, int W, Device dev) {
  DDPOptions o;
  if (s.small_buckets) o.bucket_cap_mb(512.0 / (1 << 20)).first_bucket_mb(512.0 / (1 << 20));  // 512 B
  auto model = make_model(s.model, rank);
  model->to(dev);
  DDP ddp(model, pg, o);
  if (s.small_buckets) REQUIRE_RANK(rank, ddp.bucket_layout().size() >= 4, s.name + ": at least 4 buckets");
  if (s.hook == "fp16") ddp.register_comm_hook(parallel::fp16_compress_hook());
  auto opt = make_opt(s.opt, ddp.parameters());
  DistributedSamplerOptions so;
  so.num_replicas(W);
  so.rank(rank);
  so.shuffle(false);
  DistributedSampler sampler(s.samples, so);
  return train(ddp, *opt, d, &sampler, s.global_batch / W, s.steps, dev);
}

Params reference(const Scenario& s, const Data& d) {
  auto model = make_model(s.model, 0);  // rank 0's buffer, never bumped
  auto opt = make_opt(s.opt, model->parameters());
  SequentialSampler sampler(s.samples);
  return train(*model, *opt, d, &sampler, s.global_batch, s.steps, Device::cpu());
}

/// no_sync: k micro-batches per step, the first k - 1 inside no_sync().
Params run_no_sync(const Data& d, const ProcessGroupPtr& pg, int rank, int W, Device dev) {
  const int k = 3;
  const std::int64_t micro = 4;
  auto model = make_model("mlp", rank);
  model->to(dev);
  DDP ddp(model, pg);
  optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
  no_sync_steps(ddp, opt, d, rank, W, k, micro, 2, dev);
  return host_params(ddp.parameters());
}

Params no_sync_reference(const Data& d, int W) {
  auto model = make_model("mlp", 0);
  auto opt = make_opt("sgd", model->parameters());
  SequentialSampler sampler(d.x.shape()[0]);
  return train(*model, *opt, d, &sampler, W * 3 * 4, 2, Device::cpu());
}

/// find_unused_parameters: rank 1 uses head b, the others head a; two iterations. Returns
/// the gradients of both heads.
Params run_unused(const Data& d, const ProcessGroupPtr& pg, int rank, Device dev) {
  DDPOptions o;
  o.find_unused_parameters(true);
  auto model = std::make_shared<TwoHeads>();
  model->to(dev);
  DDP ddp(model, pg, o);
  model->use_b = rank == 1;
  for (int it = 0; it < 2; ++it) {
    ddp.zero_grad();
    cross_entropy(ddp.forward(d.x.to(dev)), d.y.to(dev)).backward();
  }
  Params grads;
  for (const auto& p : ddp.parameters()) grads.push_back(p.grad().to_vector<float>());
  return grads;
}

void require_identical(int rank, const std::string& what, const Params& cpu, const Params& sim) {
  REQUIRE_RANK(rank, cpu.size() == sim.size(), what + ": tensor count");
  for (std::size_t i = 0; i < cpu.size(); ++i)
    REQUIRE_RANK(rank, cpu[i] == sim[i], detail::concat(what, ": tensor ", i, " differs between cpu and sim"));
}

void require_close(int rank, const std::string& what, const Params& got, const Params& want, double tol) {
  REQUIRE_RANK(rank, got.size() == want.size(), what + ": tensor count");
  for (std::size_t i = 0; i < got.size(); ++i) {
    double worst = 0;
    for (std::size_t k = 0; k < got[i].size(); ++k) {
      const double w = want[i][k], err = std::abs(got[i][k] - w) / std::max(1.0, std::abs(w));
      worst = std::max(worst, err);
    }
    REQUIRE_RANK(rank, worst <= tol, detail::concat(what, ": tensor ", i, " relative error ", worst, " > ", tol));
  }
}

}  // namespace

TEST_CASE("DDP on sim tensors over gloo, W = 2 and 3: bit for bit the CPU run, and one process") {
  const Data d = make_data(96);
  std::vector<Params> refs;
  for (const Scenario& s : kScenarios) refs.push_back(reference(s, d));
  for (int W : {2, 3}) {
    CAPTURE(W);
    const Params no_sync_ref = no_sync_reference(d, W);
    TcpStoreServer server(TcpStoreOptions{});
    const int port = server.port();
    const auto results = run_processes(W, [&](int rank) {
      set_num_threads(1);
      set_rank_env(rank, W, port);
      ::setenv("PHALANX_STORE_HOSTED", "1", 1);
      ::setenv("PHALANX_DEVICE", "sim", 1);
      parallel::InitOptions io;
      io.timeout = std::chrono::seconds(30);
      auto pg = parallel::init_process_group(io);
      const Device sim = parallel::local_device();
      REQUIRE_RANK(rank, sim == Device::sim(0), "PHALANX_DEVICE=sim decided by init: " + sim.str());
      for (std::size_t i = 0; i < std::size(kScenarios); ++i) {
        const Scenario& s = kScenarios[i];
        const Params cpu = run_scenario(s, d, pg, rank, W, Device::cpu());
        const Params dev = run_scenario(s, d, pg, rank, W, sim);
        require_identical(rank, s.name, cpu, dev);
        require_close(rank, s.name + " vs one process", cpu, refs[i], s.tol);
      }
      {
        const Params cpu = run_no_sync(d, pg, rank, W, Device::cpu());
        const Params dev = run_no_sync(d, pg, rank, W, sim);
        require_identical(rank, "no_sync", cpu, dev);
        require_close(rank, "no_sync vs one process", cpu, no_sync_ref, 1e-5);
      }
      {
        const Data small = make_data(8);
        const Params cpu = run_unused(small, pg, rank, Device::cpu());
        const Params dev = run_unused(small, pg, rank, sim);
        require_identical(rank, "find_unused_parameters", cpu, dev);
        // Head a's gradient is the mean of (W - 1) ranks' full gradient and one zero.
        auto ref = std::make_shared<TwoHeads>();
        cross_entropy(ref->a->forward(small.x), small.y).backward();
        const auto ra = ref->a->weight.grad().to_vector<float>();
        for (std::size_t k = 0; k < ra.size(); ++k)
          REQUIRE_RANK(rank, std::abs(cpu[0][k] - ra[k] * (W - 1) / W) < 1e-6, "head a's gradient");
      }
      parallel::destroy_process_group();
      return 0;
    }, std::chrono::seconds(120));
    for (int r = 0; r < W; ++r) {
      CAPTURE(r);
      CHECK(results[r].exit_code == 0);
      CHECK(results[r].signal == 0);
    }
  }
}

TEST_CASE("gloo stages tensors of any device through host memory: every operation on sim equals it on CPU") {
  const int W = 3;
  auto store = std::make_shared<MemoryStore>();
  run_threads(W, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, W, store);
    check_sim_staging(*pg, {1, 1000, 70000}, DType::Float16, 1);
  });
}

TEST_CASE("a model that spans devices is a ConfigError naming two of its tensors and their devices") {
  auto single = make_world_of_one();
  {
    Generator g(1);
    auto seq = std::make_shared<nn::Sequential>();
    auto first = std::make_shared<nn::Linear>(4, 4, true, &g), second = std::make_shared<nn::Linear>(4, 2, true, &g);
    seq->push_back(first);
    seq->push_back(second);
    second->to(Device::sim());
    // Rejected on any world size, one included, so the error does not depend on it.
    CHECK_THROWS_WITH_AS(std::make_shared<DDP>(seq, single),
                         "DDP: the model spans devices: parameter '0.weight' is on cpu but parameter '1.weight' is "
                         "on sim:0; move the whole model to one device before wrapping it "
                         "(model->to(parallel::local_device()))",
                         ConfigError);
  }
  {
    auto model = std::make_shared<Shifted>(0);
    model->body->to(Device::sim());  // the buffer stays on the CPU
    try {
      DDP ddp(model, single);
      CHECK(false);
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      CHECK(m.find("parameter 'body.0.weight' is on sim:0 but buffer 'shift' is on cpu") != std::string::npos);
    }
  }
  // Moving the model after wrapping it would leave the gradient buckets behind: the next
  // forward says so.
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store);
    auto model = make_model("mlp", rank);
    DDP ddp(model, pg);
    model->to(Device::sim());
    try {
      ddp.forward(Tensor::empty({2, 16}).to(Device::sim()));
      REQUIRE_RANK(rank, false, "expected an error");
    } catch (const ConfigError& e) {
      REQUIRE_RANK(rank, std::string(e.what()).find("moved from cpu to sim:0 after it was wrapped") != std::string::npos,
                   e.what());
    }
  });
}

TEST_CASE("the device is decided once by init: cuda = cuda:LOCAL_RANK, an explicit index stays, bad names fail") {
  struct Env {
    const char* name;
    std::string old;
    bool had;
    Env(const char* n, const char* v) : name(n), had(std::getenv(n) != nullptr) {
      if (had) old = std::getenv(n);
      ::setenv(n, v, 1);
    }
    ~Env() { had ? ::setenv(name, old.c_str(), 1) : ::unsetenv(name); }
  };
  Env rank("RANK", "3"), world("WORLD_SIZE", "4"), local("LOCAL_RANK", "1"), local_world("LOCAL_WORLD_SIZE", "2");
  parallel::InitOptions o;
  o.device = "cuda";
  CHECK(parallel::resolve_device(o) == Device::cuda(1));
  o.device = "cuda:0";
  CHECK(parallel::resolve_device(o) == Device::cuda(0));
  o.device = "sim";
  CHECK(parallel::resolve_device(o) == Device::sim(0));
  o.device = "tpu";
  CHECK_THROWS_WITH_AS(parallel::resolve_device(o),
                       "unknown device 'tpu' (from the device option): use cpu, cuda (= cuda:LOCAL_RANK), cuda:N, "
                       "sim or sim:N",
                       ConfigError);
  {
    Env dev("PHALANX_DEVICE", "gpu");
    CHECK_THROWS_WITH_AS(parallel::resolve_device({}),
                         "unknown device 'gpu' (from PHALANX_DEVICE): use cpu, cuda (= cuda:LOCAL_RANK), cuda:N, "
                         "sim or sim:N",
                         ConfigError);
    CHECK_THROWS_AS(parallel::local_device(), ConfigError);  // before init: the environment's
  }
  {
    Env dev("PHALANX_DEVICE", "cuda");
    CHECK(parallel::local_device() == Device::cuda(1));  // before init: the environment's
  }
  CHECK(parallel::local_device() == Device::cpu());
}

/// A model with 16-bit buffers that start different on every rank.
class SixteenBit : public nn::Module {
 public:
  explicit SixteenBit(int rank) {
    Generator g(3);
    body = register_module("body", std::make_shared<nn::Linear>(4, 2, true, &g));
    half = register_buffer("half", full({3}, 0.5 * (rank + 1), DType::Float16));
    brain = register_buffer("brain", full({2}, -1.5 * (rank + 1), DType::BFloat16));
  }
  Tensor forward(const Tensor& x) override { return body->forward(x); }
  std::string describe() const override { return "SixteenBit"; }
  std::shared_ptr<nn::Linear> body;
  Tensor half, brain;
};

TEST_CASE("DDP broadcasts float16 and bfloat16 buffers from rank 0 too (sim, W = 2)") {
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store);
    auto model = std::make_shared<SixteenBit>(rank);
    model->to(Device::sim());
    DDP ddp(model, pg);
    const auto half = to_dtype(model->half.to(Device::cpu()), DType::Float32).to_vector<float>();
    const auto brain = to_dtype(model->brain.to(Device::cpu()), DType::Float32).to_vector<float>();
    REQUIRE_RANK(rank, half == std::vector<float>(3, 0.5f), "float16 buffer is " + std::to_string(half[0]));
    REQUIRE_RANK(rank, brain == std::vector<float>(2, -1.5f), "bfloat16 buffer is " + std::to_string(brain[0]));
  });
}
