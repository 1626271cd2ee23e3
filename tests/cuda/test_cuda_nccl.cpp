// NCCL on the GPU: 200 rounds of allreduce and barrier (and one of every other collective)
// in a world of one with exact values; DDP on CUDA over NCCL equal to one process; the GPU
// check that runs before NCCL does; a creation bounded by the timeout; and, with two or more
// GPUs, the conformance suite's send-then-recv ring (one GPU per rank, ranks as threads).
#include <doctest/doctest.h>

#include <chrono>

#include <phalanx/backends/memory_store.hpp>

#include "cuda/nccl_support.hpp"
#include "support/gradcheck.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using phalanx::test::max_rel_err;
using phalanx::test::nccl_group;
using phalanx::test::nccl_group_of_one;
using phalanx::test::nccl_usable;

namespace {
const Device kGpu = Device::cuda(0);

int cuda_device_count() {
  int n = 1;
  for (; n < 64; ++n) try {
      (void)zeros({1}, DType::Float32, Device::cuda(n));
    } catch (const std::exception&) {
      break;
    }
  return n;
}

template <typename T>
std::vector<T> host(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<T>();
}
}  // namespace

TEST_CASE("nccl: 200 rounds of allreduce and barrier in a world of one, exact values") {
  if (!nccl_usable()) return;
  auto pg = nccl_group_of_one(std::chrono::seconds(60));
  REQUIRE(pg->backend_name() == "nccl");
  for (int round = 0; round < 200; ++round) {
    CAPTURE(round);
    Tensor t = full({1000}, round + 0.25, DType::Float32, kGpu);
    pg->allreduce(t, ReduceOp::Sum)->wait();
    pg->barrier()->wait();
    Tensor a = full({4}, round, DType::Float32, kGpu);
    pg->allreduce(a, ReduceOp::Avg)->wait();
    Tensor i = full({3}, 3.0 * round, DType::Int64, kGpu);
    pg->allreduce(i, ReduceOp::Max)->wait();
    pg->barrier()->wait();
    REQUIRE(host<float>(t) == std::vector<float>(1000, round + 0.25f));
    REQUIRE(host<float>(a) == std::vector<float>(4, static_cast<float>(round)));
    REQUIRE(host<std::int64_t>(i) == std::vector<std::int64_t>(3, 3 * round));
  }
  // 16-bit sums, and one of every other collective
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tensor h = full({5}, 1.5, dt, kGpu);
    pg->allreduce(h)->wait();
    CHECK(host<float>(to_dtype(h, DType::Float32)) == std::vector<float>(5, 1.5f));
  }
  Tensor b = full({7}, 2.0, DType::Float32, kGpu);
  pg->broadcast(b, 0)->wait();
  CHECK(host<float>(b) == std::vector<float>(7, 2.f));
  std::vector<Tensor> outs{zeros({7}, DType::Float32, kGpu)};
  pg->allgather(outs, b)->wait();
  CHECK(host<float>(outs[0]) == std::vector<float>(7, 2.f));
  Tensor rs = zeros({7}, DType::Float32, kGpu);
  pg->reduce_scatter(rs, {full({7}, 3.0, DType::Float32, kGpu)})->wait();
  CHECK(host<float>(rs) == std::vector<float>(7, 3.f));
  Tensor red = full({2}, 4.0, DType::Float32, kGpu);
  pg->reduce(red, 0, ReduceOp::Product)->wait();
  CHECK(host<float>(red) == std::vector<float>(2, 4.f));
  std::vector<Tensor> gouts{zeros({3}, DType::Float32, kGpu)};
  pg->gather(gouts, full({3}, 5.0, DType::Float32, kGpu), 0)->wait();
  CHECK(host<float>(gouts[0]) == std::vector<float>(3, 5.f));
  Tensor so = zeros({3}, DType::Float32, kGpu);
  pg->scatter(so, {full({3}, 6.0, DType::Float32, kGpu)}, 0)->wait();
  CHECK(host<float>(so) == std::vector<float>(3, 6.f));
  // several in flight complete in order
  std::vector<Tensor> ts;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(full({100}, k, DType::Float32, kGpu));
    works.push_back(pg->allreduce(ts.back()));
  }
  for (int k = 0; k < 8; ++k) {
    works[k]->wait();
    CHECK(host<float>(ts[k]) == std::vector<float>(100, static_cast<float>(k)));
  }
  // a CPU tensor is a clear error (it breaks the group: last)
  CHECK_THROWS_WITH_AS(pg->allreduce(ones({2}))->wait(), doctest::Contains("takes CUDA tensors"), TypeError);
}

TEST_CASE("nccl: DDP on CUDA over NCCL (world of one) equals one process") {
  if (!nccl_usable()) return;
  parallel::InitOptions o;
  o.backend = "nccl";
  o.device = "cuda";
  auto pg = parallel::init_process_group(o);
  CHECK(pg->backend_name() == "nccl");
  Generator g(5);
  auto net = nn::mlp({784, 256, 10}, "relu", &g);
  auto plain = nn::mlp({784, 256, 10}, "relu", &g);  // the same model on the GPU, no DDP
  auto ref = nn::mlp({784, 256, 10}, "relu", &g);    // and on the CPU
  plain->load_state_dict(net->state_dict());
  ref->load_state_dict(net->state_dict());
  net->to(kGpu);
  plain->to(kGpu);
  parallel::DDP model(net, pg);
  optim::SGD opt(model.parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::SGD plain_opt(plain->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::SGD ref_opt(ref->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  Tensor x = randn({128, 784}, &g), y = randint(10, {128}, &g);
  Tensor xg = x.to(kGpu), yg = y.to(kGpu);
  for (int s = 0; s < 5; ++s) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model.forward(xg), yg);
    loss.backward();
    opt.step();
    plain_opt.zero_grad();
    Tensor plain_loss = cross_entropy(plain->forward(xg), yg);
    plain_loss.backward();
    plain_opt.step();
    ref_opt.zero_grad();
    Tensor ref_loss = cross_entropy(ref->forward(x), y);
    ref_loss.backward();
    ref_opt.step();
    CHECK(std::abs(loss.item() - plain_loss.item()) <= 1e-6f * std::max(1.f, std::abs(plain_loss.item())));
    CHECK(std::abs(loss.item() - ref_loss.item()) < 1e-4f * std::max(1.f, std::abs(ref_loss.item())));
  }
  for (std::size_t i = 0; i < ref->parameters().size(); ++i) {
    CAPTURE(i);
    CHECK(model.parameters()[i].device() == kGpu);
    // one GPU process: DDP averages over a world of one, so (nearly) the same bits
    CHECK(max_rel_err(model.parameters()[i].to(Device::cpu()), plain->parameters()[i].to(Device::cpu())) < 1e-6);
    // the CPU: cuBLAS and the CPU GEMM add in different orders
    CHECK(max_rel_err(model.parameters()[i].to(Device::cpu()), ref->parameters()[i]) < 1e-4);
  }
  parallel::destroy_process_group();
}

TEST_CASE("nccl: ranks that would share a GPU fail before NCCL starts, naming LOCAL_RANK and the fix") {
  if (!nccl_usable()) return;
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(5));
  BackendConfig c;
  c.rank = 1;
  c.size = 2;
  c.store = store;
  c.local_rank = 1;
  c.local_world_size = 1000;  // more workers on this node than it has GPUs
  try {
    create_process_group("nccl", c);
    FAIL("a node with more workers than GPUs was accepted");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    CHECK(m.find("LOCAL_RANK=1") != std::string::npos);
    CHECK(m.find("1000 workers on this node") != std::string::npos);
    CHECK(m.find("CUDA device") != std::string::npos);
    CHECK(m.find("gloo backend") != std::string::npos);
  }
  c.local_world_size = 1;
  c.device = Device::cuda(999);
  CHECK_THROWS_WITH_AS(create_process_group("nccl", c), doctest::Contains("was given cuda:999"), ConfigError);
  CHECK(store->num_keys() == 0);  // nothing reached the rendezvous
}

TEST_CASE("nccl hang: a communicator whose peer never joins times out, naming the rank") {
  if (!nccl_usable()) return;
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(30));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(nccl_group(0, 2, store, std::chrono::seconds(3)), doctest::Contains("rank(s) 1 did not join"),
                       TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(25));
}

TEST_CASE("nccl: the send-then-recv ring, one GPU per rank (needs two or more GPUs)") {
  if (!nccl_usable()) return;
  const int world = cuda_device_count();
  if (world < 2) {
    MESSAGE("SKIPPED: one CUDA device; the ring needs two (NCCL cannot put two ranks on one GPU)");
    return;
  }
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(60));
  test::run_threads(world, [&](int r) {
    auto pg = nccl_group(r, world, store, std::chrono::seconds(60), r, world);
    const Device dev = Device::cuda(r);
    // 16 MiB exceeds NCCL's buffers: posted one by one, this pattern deadlocks
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{70000}, std::int64_t{1} << 22}) {
      Tensor out = full({n}, r + 1.0, DType::Float32, dev), in = zeros({n}, DType::Float32, dev);
      auto s = pg->send(out, (r + 1) % world, 7);
      auto v = pg->recv(in, (r + world - 1) % world, 7);
      if (r % 2 == 0) {
        s->wait();
        v->wait();
      } else {
        v->wait();
        s->wait();
      }
      const float from = static_cast<float>((r + world - 1) % world + 1);
      if (host<float>(in) != std::vector<float>(static_cast<std::size_t>(n), from))
        throw std::runtime_error(detail::concat("rank ", r, ": ring of ", n, " floats received wrong values"));
      Tensor t = full({4}, 1.0, DType::Float32, dev);  // a collective after the point-to-point ones
      pg->allreduce(t)->wait();
      if (host<float>(t) != std::vector<float>(4, static_cast<float>(world)))
        throw std::runtime_error(detail::concat("rank ", r, ": allreduce after the ring is wrong"));
    }
  });
}
