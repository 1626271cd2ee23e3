// batch_norm (training, eval, with running stats), layer_norm, embedding, gelu,
// softmax, argmax, clamp and clip_grad_norm_ on CUDA equal the CPU path within float tolerance.
#include <doctest/doctest.h>

#include <functional>

#include "support/gradcheck.hpp"
#include "support/same_on_device.hpp"

using namespace phalanx;
using phalanx::test::max_rel_err;

namespace {
const Device kGpu = Device::cuda(0);

/// f on CPU inputs and on their CUDA copies: output and input gradients within `tol` (0: the same bits).
void same_on_gpu(const phalanx::test::Fn& f, std::vector<Tensor> cpu, double tol = 1e-5) {
  phalanx::test::same_on_device(kGpu, f, std::move(cpu), tol);
}

Tensor rnd(const Shape& s, std::uint64_t seed, float scale = 1.f) {
  Generator g(seed);
  return randn(s, &g) * scale;
}
}  // namespace

TEST_CASE("CUDA: batch_norm (train/eval), layer_norm, embedding, gelu, softmax, argmax, clamp equal the CPU") {
  for (const Shape& s : {Shape{6, 3}, Shape{4, 5, 7}, Shape{8, 16, 9, 11}}) {
    CAPTURE(shape_str(s));
    const std::int64_t c = s[1];
    for (bool training : {true, false}) {
      Tensor rm_c = rnd({c}, 5, 0.2f), rv_c = rnd({c}, 6, 0.1f) + 1.f;
      Tensor rm_g = rm_c.to(kGpu), rv_g = rv_c.to(kGpu);
      same_on_gpu(
          [&](const std::vector<Tensor>& in) {
            const bool gpu = in[0].device() == kGpu;
            return batch_norm(in[0], gpu ? rm_g : rm_c, gpu ? rv_g : rv_c, in[1], in[2], training, 0.1, 1e-5);
          },
          {rnd(s, 1, 2.f) + 0.5f, rnd({c}, 2) + 1.f, rnd({c}, 3)});
      CHECK(max_rel_err(rm_g.to(Device::cpu()), rm_c) < 1e-5);
      CHECK(max_rel_err(rv_g.to(Device::cpu()), rv_c) < 1e-5);
    }
  }
  same_on_gpu([](const std::vector<Tensor>& in) { return layer_norm(in[0], {9, 11}, in[1], in[2]); },
              {rnd({4, 9, 11}, 7), rnd({9, 11}, 8), rnd({9, 11}, 9)});
  const Tensor idx = randint(50, {7, 13});
  same_on_gpu([&](const std::vector<Tensor>& in) { return embedding(idx.to(in[0].device()), in[0], 3); },
              {rnd({50, 6}, 10)});
  same_on_gpu([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {rnd({1000}, 11, 3.f)});
  same_on_gpu([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {rnd({3, 17, 5}, 12)});
  same_on_gpu([](const std::vector<Tensor>& in) { return argmax(in[0], 1); }, {rnd({3, 17, 5}, 13)});
  same_on_gpu([](const std::vector<Tensor>& in) { return argmax(in[0]); }, {rnd({3, 17, 5}, 14)});
  Tensor x = rnd({100}, 15);
  CHECK(max_rel_err(clamp(x.to(kGpu), -0.3f, 0.2f).to(Device::cpu()), clamp(x, -0.3f, 0.2f)) == 0);
}

TEST_CASE("CUDA: BatchNorm2d module (num_batches_tracked on the device) and clip_grad_norm_ equal the CPU") {
  nn::BatchNorm2d a(4, 1e-5, std::nullopt), b(4, 1e-5, std::nullopt);
  b.to(kGpu);
  for (int s = 0; s < 3; ++s) {
    Tensor x = rnd({5, 4, 3, 3}, 20 + s, 1.f + s);
    CHECK(max_rel_err(b(x.to(kGpu)).to(Device::cpu()), a(x)) < 1e-5);
  }
  CHECK(b.num_batches_tracked.item_int() == 3);
  CHECK(max_rel_err(b.running_var.to(Device::cpu()), a.running_var) < 1e-5);
  std::vector<Tensor> pc{zeros({30}).requires_grad_()}, pg{zeros({30}, DType::Float32, kGpu).requires_grad_()};
  Tensor g = rnd({30}, 30);
  pc[0].set_grad(g.clone());
  pg[0].set_grad(g.to(kGpu));
  CHECK(std::abs(nn::clip_grad_norm_(pc, 0.5) - nn::clip_grad_norm_(pg, 0.5)) < 1e-5);
  CHECK(max_rel_err(pg[0].grad().to(Device::cpu()), pc[0].grad()) < 1e-5);
}
