// The kernel-table boundary's invariants (core/src/kernel_checks.cpp, docs/errors.md): a
// kernel called against what the op layer promises throws InternalError naming the kernel
// and the invariant; well-formed calls pass; PHALANX_CHECK formats nothing when it holds.
#include <doctest/doctest.h>

#include <string>

#include <phalanx/core/error.hpp>
#include <phalanx/core/kernels.hpp>
#include <phalanx/phalanx.hpp>

using namespace phalanx;

namespace {

// The message of the InternalError `f` throws ("" when it throws none, or another error).
template <typename F>
std::string internal_error_of(F&& f) {
  try {
    f();
  } catch (const InternalError& e) {
    return e.what();
  } catch (...) {
    return "";
  }
  return "";
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

int g_evaluated = 0;
int evaluated() { return ++g_evaluated; }

}  // namespace

TEST_CASE("kernel checks: a size the op layer should have matched names the kernel and the invariant") {
  DeviceKernels& k = kernels_for(Device::cpu());
  Tensor x = ones({4}), out = Tensor::empty({3});
  const std::string m = internal_error_of([&] { k.unary(UnaryOp::Relu, x, out); });
  INFO(m);
  CHECK(has(m, "kernel cpu.unary"));
  CHECK(has(m, "'out' has 3 elements, expected 4 = x's numel"));
  CHECK(has(m, "kernel_checks.cpp:"));  // file:line of the check
  CHECK(has(m, "please report it"));
}

TEST_CASE("kernel checks: dtypes, undefined arguments and geometry") {
  DeviceKernels& k = kernels_for(Device::cpu());
  Tensor logits = zeros({2, 3}), probs = zeros({2, 3}), loss = zeros({2});
  Tensor float_target = zeros({2}), target = Tensor::empty({2}, DType::Int64);
  target.fill_(0);
  std::string m = internal_error_of([&] { k.cross_entropy(logits, float_target, probs, loss); });
  CHECK(has(m, "kernel cpu.cross_entropy: 'target' is float32, expected int64"));
  Tensor undefined;
  m = internal_error_of([&] { k.cross_entropy(logits, target, probs, undefined); });
  CHECK(has(m, "kernel cpu.cross_entropy: argument 'loss' is undefined"));
  Tensor in = zeros({2, 3, 4}), sums = zeros({8});
  m = internal_error_of([&] { k.sum_dim(in, 2, 3, 4, sums, 1.f); });
  CHECK(m.empty());  // in 2 * 3 * 4, out 2 * 4: holds
  m = internal_error_of([&] { k.sum_dim(in, 2, 4, 4, sums, 1.f); });
  CHECK(has(m, "kernel cpu.sum_dim: 'in' has 24 elements, expected 32 = outer * d * inner"));
  Tensor a = ones({6}), b = ones({4}), o = zeros({6});
  m = internal_error_of([&] { k.binary(BinaryOp::Add, a, b, o); });
  CHECK(has(m, "kernel cpu.binary: out's numel must be one operand's, and the other's a period of it"));
}

TEST_CASE("kernel checks: well-formed calls and ops pass") {
  DeviceKernels& k = kernels_for(Device::cpu());
  CHECK(std::string(k.name()) == "cpu");
  Tensor x = tensor(std::vector<float>{-1.f, 2.f, -3.f, 4.f}, {2, 2}), out = Tensor::empty({2, 2});
  k.unary(UnaryOp::Relu, x, out);
  CHECK(out.to_vector<float>() == std::vector<float>{0.f, 2.f, 0.f, 4.f});
  Tensor bias = ones({2}), y = Tensor::empty({2, 2});
  k.binary(BinaryOp::Add, x, bias, y);  // a bias row: period 2 of 4
  CHECK(y.to_vector<float>() == std::vector<float>{0.f, 3.f, -2.f, 5.f});
  Tensor target = Tensor::empty({2}, DType::Int64);
  target.fill_(1);
  Tensor l = cross_entropy(matmul(x, x), target);  // through the op layer
  CHECK(l.numel() == 1);
}

TEST_CASE("kernel checks: empty tensors pass (an inner dimension of 0, an empty batch)") {
  Tensor a = zeros({2, 0}), b = zeros({0, 3});
  a.requires_grad_(true);
  b.requires_grad_(true);
  Tensor c = matmul(a, b);  // gemm with k = 0: lda = 0
  CHECK(c.to_vector<float>() == std::vector<float>(6, 0.f));
  CHECK_NOTHROW(sum(c).backward());
  auto linear = nn::mlp({5, 3});
  Tensor x = zeros({0, 5});
  x.requires_grad_(true);
  Tensor y = linear->forward(x);
  CHECK(y.numel() == 0);
  CHECK_NOTHROW(sum(y).backward());
}

TEST_CASE("PHALANX_CHECK: nothing is evaluated when the check holds; both values when it fails") {
  g_evaluated = 0;
  PHALANX_CHECK(1 + 1 == 2, "message ", evaluated());
  CHECK(g_evaluated == 0);
  const std::string m = internal_error_of([] { PHALANX_CHECK(1 + 1 == 3, "value ", evaluated()); });
  CHECK(g_evaluated == 1);
  CHECK(has(m, "check failed: 1 + 1 == 3 value 1"));
  const std::string e = internal_error_of([] { PHALANX_CHECK_EQ(2 * 3, 7); });
  CHECK(has(e, "check failed: 2 * 3 == 7 (6 vs 7)"));
}

TEST_CASE("kernel checks: the optimizers' group entries check every entry as the per-tensor ones do") {
  DeviceKernels& k = kernels_for(Device::cpu());
  Tensor p = zeros({4}), g = ones({4}), short_g = ones({3}), buf = zeros({4}), none;
  SgdUpdate u{0.1f, 0.9f, 0.f, 0.f, false, false};
  std::string m = internal_error_of([&] { k.sgd_update_group({{&p, &g, &buf, true}, {&p, &short_g, &buf, false}}, u); });
  CHECK(has(m, "kernel cpu.sgd_update_group: 'grad' has 3 elements, expected 4 = param's numel"));
  m = internal_error_of([&] { k.sgd_update_group({{&p, &g, &none, false}}, u); });
  CHECK(has(m, "kernel cpu.sgd_update_group: a momentum update needs its buffer"));
  m = internal_error_of([&] { k.sgd_update_group({{&p, nullptr, &buf, false}}, u); });
  CHECK(has(m, "kernel cpu.sgd_update_group: every entry points at its three tensors"));
  m = internal_error_of([&] { k.sgd_update_group({{&p, &g, &buf, true}}, u); });
  CHECK(m.empty());
  CHECK(p.to_vector<float>() == std::vector<float>(4, -0.1f));  // first step: buf = g, p -= lr * buf
  AdamUpdate a{};
  a.amsgrad = true;
  Tensor m1 = zeros({4}), v1 = zeros({4});
  m = internal_error_of([&] { k.adam_update_group({{&p, &g, &m1, &v1, &none, a}}); });
  CHECK(has(m, "kernel cpu.adam_update_group: amsgrad needs max_exp_avg_sq of param's numel"));
  m = internal_error_of([&] { k.adam_update_group({}); });
  CHECK(m.empty());
}
