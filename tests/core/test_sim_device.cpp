// The sim test accelerator (tests/support/sim_device, docs/devices.md): transfers, the
// host-dereference guard, every op and gradient equal to the CPU bit for bit, poisoned
// memory, and the error a missing device gives. Also the 16-bit fill (2 bytes per element).
#include <doctest/doctest.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "phalanx/core/kernels.hpp"
#include "phalanx/core/xtensor.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;

namespace {
const Device kSim = Device::sim(0);

/// The plugin's exported test hooks (it is already loaded by the registry once a sim tensor
/// exists; RTLD_NOLOAD finds that copy).
void* sim_symbol(const char* name) {
  (void)zeros({1}, DType::Float32, kSim);  // loads the plugin through the registry
  void* h = ::dlopen(PHALANX_SIM_PLUGIN, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(h, "libphalanx_sim.so is not loaded from ", PHALANX_SIM_PLUGIN);
  void* s = ::dlsym(h, name);
  REQUIRE_MESSAGE(s, name, " not exported");
  return s;
}

/// Same bytes (NaN payloads and signed zeros included).
bool same_bits(const Tensor& a, const Tensor& b) {
  // Views are compared by their values.
  const Tensor x = a.contiguous().to(Device::cpu()), y = b.contiguous().to(Device::cpu());
  if (x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

/// Runs f on CPU inputs and on their sim copies: outputs and input gradients are the same bits.
void same_on_sim(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> cpu) {
  std::vector<Tensor> sim;
  for (auto& t : cpu) {
    sim.push_back(t.to(kSim));
    if (t.dtype() == DType::Float32) {
      t.requires_grad_();
      sim.back().requires_grad_();
    }
  }
  Tensor yc = f(cpu), ys = f(sim);
  CHECK(ys.device() == kSim);
  CHECK(same_bits(ys, yc));
  Generator g(1);
  Tensor r = randn(yc.shape(), &g);
  yc.backward(r);
  ys.backward(r.to(kSim));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i].dtype() == DType::Float32) {
      REQUIRE(sim[i].grad().defined());
      CHECK(sim[i].grad().device() == kSim);
      CHECK(same_bits(sim[i].grad(), cpu[i].grad()));
    }
}

std::uint16_t bits16(const Tensor& t, std::int64_t i) {
  return static_cast<const std::uint16_t*>(t.to(Device::cpu()).raw_data())[i];
}
}  // namespace

TEST_CASE("sim: tensors travel cpu <-> sim for every dtype, and narrowed views keep their offset") {
  Tensor f = away_from_zero({7, 5}, 1);
  Tensor i = tensor(std::vector<std::int64_t>{-3, 0, 1, 1LL << 40, 9}, {5});
  for (const Tensor& t : {f, i, to_dtype(f, DType::Float16), to_dtype(f, DType::BFloat16)}) {
    Tensor s = t.to(kSim);
    CHECK(s.device() == kSim);
    CHECK(s.dtype() == t.dtype());
    CHECK(same_bits(s, t));
    CHECK(same_bits(s.clone(), t));              // device-to-device copy
    CHECK(same_bits(s.to(Device::sim(1)), t));  // another sim device: through the host
    Tensor back = Tensor::empty(t.shape(), t.dtype(), kSim);
    back.copy_(t);  // cross-device copy_
    CHECK(same_bits(back, t));
  }
  Tensor s = f.to(kSim);
  CHECK(same_bits(s.narrow_rows(2, 5), f.narrow_rows(2, 5)));
  CHECK(s.narrow_rows(3, 4).reshape({5}).to_vector<float>() == f.narrow_rows(3, 4).reshape({5}).to_vector<float>());
  CHECK(s.narrow_rows(1, 2).reshape({5}).narrow_rows(4, 5).item() == f.to_vector<float>()[9]);
  CHECK(i.to(kSim).narrow_rows(3, 4).item_int() == (1LL << 40));
  CHECK(from_buffer(f.to_vector<float>().data(), {35}, kSim).to_vector<float>() == f.to_vector<float>());
  CHECK(arange(4, DType::Int64, kSim).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3});
}

TEST_CASE("sim: host code cannot read sim memory: data<T>() throws, pointers are non-canonical") {
  Tensor s = ones({4}, DType::Float32, kSim);
  try {
    (void)s.data<float>();
    FAIL("data<float>() on a sim tensor did not throw");
  } catch (const TypeError& e) {
    const std::string m = e.what();
    CHECK(m.find("sim:0") != std::string::npos);
    CHECK(m.find(".to(Device::cpu())") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  CHECK_THROWS_AS((void)zeros({2}, DType::Int64, kSim).data<std::int64_t>(), TypeError);
  CHECK(s.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  CHECK(s.narrow_rows(2, 3).item() == 1.f);
  CHECK(s.to(Device::cpu()).data<float>()[3] == 1.f);
  CHECK(to_xarray<float>(s)(2) == 1.f);  // copies to the host
  CHECK_THROWS_AS(as_xview<float>(s), TypeError);

  // Every sim pointer carries the tag bit (1 << 55): non-canonical on x86-64, kernel space
  // on AArch64, so a host dereference faults at once (not tested: it would crash).
  auto tag = reinterpret_cast<unsigned long long (*)()>(sim_symbol("phalanx_sim_tag"))();
  CHECK(tag == (1ull << 55));
  for (std::int64_t n : {0, 1, 17, 4096, 1 << 20}) {
    Tensor t = Tensor::empty({n}, DType::Float32, kSim);
    CHECK((reinterpret_cast<std::uintptr_t>(t.raw_data()) & tag) != 0);
  }
  CHECK((reinterpret_cast<std::uintptr_t>(s.narrow_rows(3, 4).raw_data()) & tag) != 0);
  CHECK((reinterpret_cast<std::uintptr_t>(ones({4}).raw_data()) & tag) == 0);

  // The host paths that read a tensor copy it first.
  const std::string npy = serialize_npy(s);
  CHECK(parse_npy(npy.data(), npy.size(), "s").to_vector<float>() == s.to_vector<float>());
  std::ostringstream os;
  os << s;
  CHECK(os.str() == "tensor([1., 1., 1., 1.], device='sim:0')");  // the values, as PyTorch prints them
  CHECK(s.str() == "Tensor[4] float32 sim:0");
}

TEST_CASE("sim: the kernels refuse host tensors, host pointers and ranges outside live blocks") {
  DeviceKernels& k = kernels_for(kSim);
  CHECK(std::string(k.name()) == "sim");
  Tensor s = zeros({8}, DType::Float32, kSim), c = ones({8});
  CHECK_THROWS_AS(k.axpy(1.f, c, s), InternalError);  // a CPU operand handed to the sim table: the boundary check
  CHECK_THROWS_AS(s.add_(c), TypeError);
  CHECK_THROWS_AS(add(s, c), TypeError);
  std::vector<float> host(8);
  CHECK_THROWS_AS(k.copy_to_host(host.data(), c.raw_data(), 32), ValueError);   // host as source
  CHECK_THROWS_AS(k.copy_from_host(s.raw_data(), s.raw_data(), 32), ValueError);  // sim as source
  CHECK_THROWS_AS(k.copy_to_host(host.data(), s.raw_data(), 4096), ValueError);  // overrun
  void* freed;
  {
    Tensor t = zeros({1024}, DType::Float32, kSim);
    freed = t.raw_data();
  }
  CHECK_THROWS_AS(k.copy_to_host(host.data(), freed, 32), ValueError);  // use after free
  try {
    k.copy_to_host(host.data(), freed, 32);
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("outside every live sim block") != std::string::npos);
  }
}

TEST_CASE("sim: memory from the allocator reads as NaN until written; freed blocks are poisoned") {
  auto poisoned = reinterpret_cast<int (*)(const void*)>(sim_symbol("phalanx_sim_freed_block_poisoned"));
  auto live_blocks = reinterpret_cast<std::size_t (*)()>(sim_symbol("phalanx_sim_live_blocks"));
  const std::size_t live_before = live_blocks();
  Tensor fresh = Tensor::empty({64}, DType::Float32, kSim);
  for (float v : fresh.to_vector<float>()) CHECK(std::isnan(v));
  std::uint32_t b;
  const float first = fresh.to_vector<float>()[0];
  std::memcpy(&b, &first, 4);
  CHECK(b == 0xFFFFFFFFu);
  CHECK(live_blocks() == live_before + 1);
  void* p = fresh.raw_data();
  fresh.fill_(1.f);
  CHECK(poisoned(p) == -1);  // live: not in the quarantine
  fresh = Tensor();
  CHECK(live_blocks() == live_before);
  CHECK(poisoned(p) == 1);
  {
    Tensor a = ones({300}, DType::Float32, kSim);
    void* q = a.narrow_rows(100, 200).raw_data();
    a = Tensor();
    CHECK(poisoned(q) == 1);  // any address inside the freed block
  }
}

TEST_CASE("sim: every op's output and gradient equal the CPU's bit for bit") {
  same_on_sim([](auto& in) { return relu(in[0]); }, {away_from_zero({37, 5}, 1)});
  same_on_sim([](auto& in) { return tanh(in[0]); }, {away_from_zero({37, 5}, 2)});
  same_on_sim([](auto& in) { return sigmoid(in[0]); }, {away_from_zero({37, 5}, 3)});
  same_on_sim([](auto& in) { return exp(in[0]); }, {away_from_zero({37, 5}, 4)});
  same_on_sim([](auto& in) { return log(exp(in[0])); }, {away_from_zero({37, 5}, 5)});
  same_on_sim([](auto& in) { return neg(in[0]); }, {away_from_zero({37, 5}, 6)});
  same_on_sim([](auto& in) { return add(in[0], in[1]); }, {away_from_zero({8, 5}, 7), away_from_zero({5}, 8)});
  same_on_sim([](auto& in) { return sub(in[0], in[1]); }, {away_from_zero({8, 5}, 9), away_from_zero({8, 5}, 10)});
  same_on_sim([](auto& in) { return mul(in[0], in[1]); }, {away_from_zero({8, 5}, 11), away_from_zero({5}, 12)});
  same_on_sim([](auto& in) { return div(in[0], in[1]); }, {away_from_zero({8, 5}, 13), away_from_zero({8, 5}, 14)});
  same_on_sim([](auto& in) { return div(in[0], in[1]); }, {away_from_zero({5}, 13), away_from_zero({8, 5}, 14)});
  same_on_sim([](auto& in) { return mul(add(in[0], 2.f), 3.f) / 7.f; }, {away_from_zero({8, 5}, 15)});
  same_on_sim([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({33, 17}, 16), away_from_zero({17, 9}, 17)});
  same_on_sim([](auto& in) { return linear(in[0], in[1], in[2]); },
              {away_from_zero({64, 100}, 18), away_from_zero({40, 100}, 19), away_from_zero({40}, 20)});
  same_on_sim([](auto& in) { return linear(in[0], in[1], Tensor()); },
              {away_from_zero({3, 7, 10}, 18), away_from_zero({4, 10}, 19)});
  same_on_sim([](auto& in) { return sum(in[0]); }, {away_from_zero({1000}, 21)});
  same_on_sim([](auto& in) { return mean(in[0]); }, {away_from_zero({10, 3}, 21)});
  same_on_sim([](auto& in) { return mean(in[0], 1); }, {away_from_zero({6, 7, 3}, 22)});
  same_on_sim([](auto& in) { return sum(in[0], 2, true); }, {away_from_zero({6, 7, 3}, 22)});
  same_on_sim([](auto& in) { return transpose(in[0], 0, 2); }, {away_from_zero({4, 3, 5}, 23)});
  same_on_sim([](auto& in) { return in[0].reshape({15, 4}).flatten(0); }, {away_from_zero({4, 3, 5}, 23)});
  same_on_sim([](auto& in) { return log_softmax(in[0], 1); }, {away_from_zero({9, 10}, 24)});
  same_on_sim([](auto& in) { return log_softmax(in[0], 1); }, {away_from_zero({3, 10, 4}, 24)});
  Generator g(3);
  Tensor target = randint(10, {64}, &g);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    same_on_sim([&](auto& in) { return cross_entropy(in[0], in[0].device().is_cpu() ? target : target.to(kSim), r); },
                {away_from_zero({64, 10}, 25)});
  same_on_sim([](auto& in) { return mse_loss(in[0], in[1]); }, {away_from_zero({9, 4}, 26), away_from_zero({9, 4}, 27)});
  Generator d1(8), d2(8);
  Tensor x = away_from_zero({50, 4}, 28);
  CHECK(same_bits(dropout(x.to(kSim), 0.3f, true, &d1), dropout(x, 0.3f, true, &d2)));
  // A bad label is found on the device and reported like on the CPU.
  CHECK_THROWS_AS(cross_entropy(zeros({2, 3}, DType::Float32, kSim),
                                tensor(std::vector<std::int64_t>{0, 7}, {2}).to(kSim)),
                  ValueError);
}

TEST_CASE("sim: an MLP trained with SGD (momentum) and AdamW equals the CPU run bit for bit") {
  for (int which = 0; which < 2; ++which) {
    Generator g(5);
    auto net = nn::mlp({20, 32, 16, 10}, "relu", &g);
    auto ref = nn::mlp({20, 32, 16, 10}, "relu", &g);
    ref->load_state_dict(net->state_dict());
    net->to(kSim);
    for (const Tensor& p : net->parameters()) CHECK(p.device() == kSim);
    std::unique_ptr<optim::Optimizer> os, oc;
    if (which == 0) {
      os = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true));
      oc = std::make_unique<optim::SGD>(ref->parameters(), optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true));
    } else {
      const auto a = optim::AdamWOptions().weight_decay(0.1).amsgrad(true);
      os = std::make_unique<optim::AdamW>(net->parameters(), a);
      oc = std::make_unique<optim::AdamW>(ref->parameters(), a);
    }
    Tensor x = randn({32, 20}, &g), y = randint(10, {32}, &g);
    Tensor xs = x.to(kSim), ys = y.to(kSim);
    for (int s = 0; s < 4; ++s) {
      os->zero_grad();
      Tensor ls = cross_entropy(net->forward(xs), ys);
      ls.backward();
      os->step();
      oc->zero_grad();
      Tensor lc = cross_entropy(ref->forward(x), y);
      lc.backward();
      oc->step();
      CHECK(ls.item() == lc.item());
    }
    for (std::size_t i = 0; i < ref->parameters().size(); ++i) {
      CHECK(net->parameters()[i].device() == kSim);
      CHECK(same_bits(net->parameters()[i], ref->parameters()[i]));
    }
  }
}

TEST_CASE("sim: 16-bit conversions and the exact-mode kernels equal the CPU's") {
  Tensor x = away_from_zero({4096}, 50);
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tensor hs = to_dtype(x.to(kSim), dt), hc = to_dtype(x, dt);
    CHECK(hs.device() == kSim);
    CHECK(same_bits(hs, hc));
    CHECK(same_bits(to_dtype(hs, DType::Float32), to_dtype(hc, DType::Float32)));
  }
  DeviceKernels& ks = kernels_for(kSim);
  DeviceKernels& kc = kernels_for(Device::cpu());
  Tensor v = away_from_zero({777}, 51) * 3.f;
  Tensor ms = zeros({3}, DType::Float32, kSim), mc = zeros({3});
  ks.abs_max_into(v.to(kSim), ms, 1);
  kc.abs_max_into(v, mc, 1);
  CHECK(same_bits(ms, mc));
  CHECK(ms.to_vector<float>()[1] > 0.f);
  const double scale = std::ldexp(1.0, 40);
  Tensor as = zeros({777}, DType::Int64, kSim), ac = zeros({777}, DType::Int64);
  for (int r = 0; r < 3; ++r) {
    Tensor part = away_from_zero({777}, 60 + r);
    ks.fixed_point_accumulate(part.to(kSim), scale, as);
    kc.fixed_point_accumulate(part, scale, ac);
  }
  CHECK(same_bits(as, ac));
  Tensor os = Tensor::empty({777}, DType::Float32, kSim), oc = Tensor::empty({777});
  ks.fixed_point_to_float(as, scale, 3.0, os);
  kc.fixed_point_to_float(ac, scale, 3.0, oc);
  CHECK(same_bits(os, oc));
}

TEST_CASE("fill of float16/bfloat16 writes 2 bytes per element and leaves its neighbours alone") {
  for (Device dev : {Device::cpu(), kSim})
    for (DType dt : {DType::Float16, DType::BFloat16}) {
      CAPTURE(dev.str());
      CAPTURE(dtype_name(dt));
      Tensor big = full({16}, -2.0, dt, dev);  // the canaries
      Tensor mid = big.narrow_rows(5, 9);      // elements 5..8, inside the buffer
      mid.fill_(1.0);
      const std::uint16_t one = dt == DType::Float16 ? 0x3C00 : 0x3F80;
      const std::uint16_t minus_two = 0xC000;  // -2 in both formats
      for (std::int64_t i = 0; i < 16; ++i) CHECK(bits16(big, i) == (i >= 5 && i < 9 ? one : minus_two));
      mid.zero_();
      for (std::int64_t i = 0; i < 16; ++i) CHECK(bits16(big, i) == (i >= 5 && i < 9 ? 0 : minus_two));
      CHECK(same_bits(zeros({3}, dt, dev), to_dtype(zeros({3}), dt)));
      CHECK(same_bits(full({3}, 0.1, dt, dev), to_dtype(full({3}, 0.1), dt)));  // rounded as convert
    }
}

// Run in a child process (below) with PHALANX_SIM_UNAVAILABLE set: no sim kernels load.
TEST_CASE("sim child: a device that cannot load gives one clear line") {
  if (!std::getenv("PHALANX_SIM_CHILD")) return;
  try {
    (void)zeros({2}, DType::Float32, kSim);
    FAIL("creating a sim tensor did not throw");
  } catch (const TypeError& e) {
    const std::string m = e.what();
    CHECK(m.find("no kernels for device sim:0") != std::string::npos);
    CHECK(m.find("the sim device plugin cannot run here: PHALANX_SIM_UNAVAILABLE is set") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
}

TEST_CASE("sim: loading errors are clear (checked in a fresh process)") {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("PHALANX_SIM_CHILD", "1", 1);
    ::setenv("PHALANX_SIM_UNAVAILABLE", "switched off by the test", 1);
    ::execl("/proc/self/exe", "core_tests", "--test-case=sim child*", "--no-version", "--minimal", nullptr);
    ::_exit(127);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
