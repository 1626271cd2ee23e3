// Every op's output and input gradients on CUDA equal the CPU path within float tolerance;
// fills of every dtype; 16-bit conversions; cross-entropy's deferred label check.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "support/gradcheck.hpp"
#include "support/same_on_device.hpp"

using namespace phalanx;
using phalanx::test::away_from_zero;
using phalanx::test::max_rel_err;

namespace {
const Device kGpu = Device::cuda(0);

/// f on CPU inputs and on their CUDA copies: output and input gradients within `tol` (0: the same bits).
void same_on_gpu(const phalanx::test::Fn& f, std::vector<Tensor> cpu, double tol = 1e-5) {
  phalanx::test::same_on_device(kGpu, f, std::move(cpu), tol);
}

template <typename T>
std::vector<T> host(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<T>();
}
}  // namespace

TEST_CASE("cuda: elementwise ops and their gradients match the CPU") {
  same_on_gpu([](auto& in) { return relu(in[0]); }, {away_from_zero({37, 5}, 1)});
  same_on_gpu([](auto& in) { return tanh(in[0]); }, {away_from_zero({37, 5}, 2)});
  same_on_gpu([](auto& in) { return sigmoid(in[0]); }, {away_from_zero({37, 5}, 3)});
  same_on_gpu([](auto& in) { return exp(in[0]); }, {away_from_zero({37, 5}, 4)});
  same_on_gpu([](auto& in) { return log(exp(in[0])); }, {away_from_zero({37, 5}, 5)});
  same_on_gpu([](auto& in) { return neg(in[0]); }, {away_from_zero({37, 5}, 6)});
  same_on_gpu([](auto& in) { return add(in[0], in[1]); }, {away_from_zero({8, 5}, 7), away_from_zero({5}, 8)});
  same_on_gpu([](auto& in) { return sub(in[0], in[1]); }, {away_from_zero({8, 5}, 9), away_from_zero({8, 5}, 10)});
  same_on_gpu([](auto& in) { return sub(in[0], in[1]); }, {away_from_zero({8, 5}, 11), away_from_zero({5}, 12)});
  same_on_gpu([](auto& in) { return mul(in[0], in[1]); }, {away_from_zero({8, 5}, 13), away_from_zero({5}, 14)});
  same_on_gpu([](auto& in) { return div(in[0], in[1]); }, {away_from_zero({8, 5}, 15), away_from_zero({8, 5}, 16)});
  same_on_gpu([](auto& in) { return div(in[0], in[1]); }, {away_from_zero({8, 5}, 17), away_from_zero({5}, 18)});
  same_on_gpu([](auto& in) { return mul(add(in[0], 2.f), 3.f); }, {away_from_zero({8, 5}, 19)});
  same_on_gpu([](auto& in) { return in[0] / 4.f - 1.f; }, {away_from_zero({8, 5}, 20)});
  same_on_gpu([](auto& in) { Generator g(7); return dropout(in[0], 0.3f, true, &g); }, {away_from_zero({16, 9}, 21)});
}

TEST_CASE("cuda: matmul, linear, reductions, layout, softmax and losses match the CPU") {
  same_on_gpu([](auto& in) { return matmul(in[0], in[1]); }, {away_from_zero({33, 17}, 30), away_from_zero({17, 9}, 31)});
  same_on_gpu([](auto& in) { return linear(in[0], in[1], in[2]); },
              {away_from_zero({64, 784}, 32), away_from_zero({256, 784}, 33), away_from_zero({256}, 34)}, 1e-4);
  same_on_gpu([](auto& in) { return sum(in[0]); }, {away_from_zero({1000}, 35)});
  same_on_gpu([](auto& in) { return mean(in[0]); }, {away_from_zero({7, 11}, 36)});
  same_on_gpu([](auto& in) { return sum(in[0]); }, {away_from_zero({300000}, 37)});  // long row: many blocks
  same_on_gpu([](auto& in) { return sum(in[0], 1); }, {away_from_zero({3, 200000}, 38)});
  same_on_gpu([](auto& in) { return mean(in[0], 1); }, {away_from_zero({6, 7, 3}, 39)});
  same_on_gpu([](auto& in) { return sum(in[0], 0, true); }, {away_from_zero({6, 7, 3}, 40)});
  same_on_gpu([](auto& in) { return mean(in[0], -1, true); }, {away_from_zero({6, 7, 3}, 41)});
  same_on_gpu([](auto& in) { return reshape(in[0], {7, 6}); }, {away_from_zero({6, 7}, 42)});
  same_on_gpu([](auto& in) { return transpose(in[0], 0, 2); }, {away_from_zero({4, 3, 5}, 43)});
  same_on_gpu([](auto& in) { return transpose(in[0], 1, 0); }, {away_from_zero({9, 13}, 44)});
  same_on_gpu([](auto& in) { return log_softmax(in[0], 1); }, {away_from_zero({9, 10}, 45)});
  same_on_gpu([](auto& in) { return log_softmax(in[0], 0); }, {away_from_zero({9, 10, 2}, 46)});  // inner > 1
  Generator g(3);
  Tensor target = randint(10, {64}, &g);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    same_on_gpu([&](auto& in) { return cross_entropy(in[0], in[0].device().is_cpu() ? target : target.to(kGpu), r); },
                {away_from_zero({64, 10}, 47)});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    same_on_gpu([&](auto& in) { return mse_loss(in[0], in[1], r); }, {away_from_zero({9, 4}, 48), away_from_zero({9, 4}, 49)});
  // int64 and 16-bit transposes move the same bytes as on the CPU
  Tensor i64 = arange(60, DType::Int64).reshape({3, 4, 5});
  CHECK(host<std::int64_t>(transpose(i64.to(kGpu), 0, 2)) == transpose(i64, 0, 2).to_vector<std::int64_t>());
  Tensor h = to_dtype(away_from_zero({3, 4, 5}, 50), DType::BFloat16);
  CHECK(host<float>(to_dtype(transpose(h.to(kGpu), 1, 2), DType::Float32)) ==
        to_dtype(transpose(h, 1, 2), DType::Float32).to_vector<float>());
}

TEST_CASE("cuda: fills of every dtype write whole elements only") {
  for (DType dt : {DType::Float32, DType::Int64, DType::Float16, DType::BFloat16})
    for (std::int64_t n : {1, 255, 256, 257, 4099}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(n);
      // Neighbours allocated around the filled tensor keep their values (an overrun would
      // write into them; compute-sanitizer sees it too).
      Tensor before = full({64}, 7.0, DType::Float32, kGpu);
      Tensor t = full({n}, 1.5, dt, kGpu);
      Tensor after = full({64}, 7.0, DType::Float32, kGpu);
      Tensor z = zeros({n}, dt, kGpu);
      const Tensor as_float = dt == DType::Int64 ? t : to_dtype(t, DType::Float32);
      const Tensor zf = dt == DType::Int64 ? z : to_dtype(z, DType::Float32);
      if (dt == DType::Int64) {
        CHECK(host<std::int64_t>(t) == std::vector<std::int64_t>(n, 1));
        CHECK(host<std::int64_t>(z) == std::vector<std::int64_t>(n, 0));
      } else {
        CHECK(host<float>(as_float) == std::vector<float>(n, 1.5f));
        CHECK(host<float>(zf) == std::vector<float>(n, 0.f));
      }
      CHECK(host<float>(before) == std::vector<float>(64, 7.f));
      CHECK(host<float>(after) == std::vector<float>(64, 7.f));
    }
  // the same rounding as the CPU fill (nearest even)
  for (DType dt : {DType::Float16, DType::BFloat16})
    CHECK(host<float>(to_dtype(full({3}, 0.1, dt, kGpu), DType::Float32)) ==
          to_dtype(full({3}, 0.1, dt), DType::Float32).to_vector<float>());
}

TEST_CASE("cuda: 16-bit conversions round like the CPU") {
  Tensor x = away_from_zero({4096}, 60);
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    CHECK(to_dtype(to_dtype(x.to(kGpu), dt), DType::Float32).to(Device::cpu()).to_vector<float>() ==
          to_dtype(to_dtype(x, dt), DType::Float32).to_vector<float>());
    // the 16-bit bytes themselves, both ways
    CHECK(to_dtype(to_dtype(x, dt).to(kGpu), DType::Float32).to(Device::cpu()).to_vector<float>() ==
          to_dtype(to_dtype(x, dt), DType::Float32).to_vector<float>());
  }
}

TEST_CASE("cuda: a bad label is reported when the loss is read, with the CPU's message") {
  Tensor logits = zeros({2, 3}, DType::Float32, kGpu);
  Tensor bad = tensor(std::vector<std::int64_t>{0, 7}, {2}).to(kGpu);
  // no copy to the host inside cross_entropy: the check is read with the loss
  Tensor loss = cross_entropy(logits, bad, Reduction::None);
  CHECK_THROWS_WITH_AS(loss.to(Device::cpu()), doctest::Contains("target[1] = 7 is not a class index in [0, 3)"),
                       ValueError);
  // reported once; the next step is clean
  Tensor good = tensor(std::vector<std::int64_t>{0, 2}, {2}).to(kGpu);
  CHECK(std::abs(cross_entropy(logits, good).item() - std::log(3.f)) < 1e-6);
  // a bad batch that is never read is reported by the next label check when its kernel has
  // finished, else chained into that check (no host wait) and reported at the next read
  (void)cross_entropy(logits, tensor(std::vector<std::int64_t>{-1, 0}, {2}).to(kGpu));
  CHECK_THROWS_WITH_AS(cross_entropy(logits, good).item(), doctest::Contains("target[0] = -1"), ValueError);
  CHECK(std::abs(cross_entropy(logits, good, Reduction::Sum).item() - 2 * std::log(3.f)) < 1e-5);
  // several checks before a read: the first bad label of the first bad batch is reported
  Tensor bad2 = tensor(std::vector<std::int64_t>{3, 1}, {2}).to(kGpu);
  auto three_then_read = [&] {
    return add(add(cross_entropy(logits, good), cross_entropy(logits, bad2)), cross_entropy(logits, bad)).item();
  };
  CHECK_THROWS_WITH_AS(three_then_read(), doctest::Contains("target[0] = 3 is not a class index in [0, 3)"), ValueError);
  CHECK(std::abs(cross_entropy(logits, good).item() - std::log(3.f)) < 1e-6);
}
