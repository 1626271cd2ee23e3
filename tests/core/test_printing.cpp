// std::cout << t prints the values as PyTorch 1.13's repr does (expected strings from torch in
// tests/fixtures/norm_parity.npz, made by scripts/fixtures/norm.py).
#include <doctest/doctest.h>

#include <sstream>

#include "support/gradcheck.hpp"

using namespace phalanx;

namespace {
const TensorMap& fx() {
  static const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/norm_parity.npz");
  return f;
}
std::string expected(const std::string& k) {
  std::string s;
  for (std::int64_t c : fx().at("print." + k + ".str").to_vector<std::int64_t>()) s += static_cast<char>(c);
  return s;
}
std::string printed(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}
}  // namespace

TEST_CASE("printing: float tensors (fixed, integer-valued, scientific, wrapped, summarised, 3-D, scalar, "
          "non-finite, empty, requires_grad) as PyTorch") {
  for (const std::string k : {"small", "ints_as_float", "sci", "big_int_float", "wrap", "summarized", "summarized_1d",
                              "cube", "scalar", "nonfinite", "zeros", "empty", "empty1d", "requires_grad",
                              "long_suffix"}) {
    CAPTURE(k);
    Tensor t = fx().at("print." + k + ".values").clone();
    if (k == "requires_grad" || k == "long_suffix") t.requires_grad_();
    CHECK(printed(t) == expected(k));
  }
}

TEST_CASE("printing: int64 tensors, device and dtype suffixes, grad_fn, undefined") {
  for (const std::string k : {"int64", "int64_big"}) {
    CAPTURE(k);
    CHECK(printed(fx().at("print." + k + ".values")) == expected(k));
  }
  CHECK(printed(tensor(std::vector<float>{0.1f, -2.f, 3.f, 4.f}, {2, 2})) == "tensor([[ 0.1000, -2.0000],\n        [ 3.0000,  4.0000]])");
  CHECK(printed(tensor(std::vector<float>{1.5f, 2.f}, {2}).to(Device::sim(0))) == "tensor([1.5000, 2.0000], device='sim:0')");
  Tensor a = tensor(std::vector<float>{1.f, 2.f}, {2}).requires_grad_();
  const std::string s = printed(a * 2.f);
  CHECK(s.rfind("tensor([2., 4.], grad_fn=<", 0) == 0);
  CHECK(printed(Tensor()) == "tensor(undefined)");
  CHECK(tensor(std::vector<float>{1.f}, {1}).str() == "Tensor[1] float32 cpu");  // str() stays the short description
}

namespace {
/// A module with two inputs and nothing but its own forward: the defaults of describe()
/// and forward(const Tensor&) apply.
struct PairSum : nn::Module {
  Tensor forward(const Tensor& a, const Tensor& b) { return a + b; }
};
}  // namespace

TEST_CASE("printing modules as PyTorch: Linear's bias=True/False, nesting, the class name by default") {
  Generator g(0);
  CHECK(nn::Linear(64, 32, true, &g).describe() == "Linear(in_features=64, out_features=32, bias=True)");
  CHECK(nn::Linear(64, 32, false, &g).describe() == "Linear(in_features=64, out_features=32, bias=False)");
  CHECK(nn::mlp({4, 3, 2}, "relu", &g)->str() ==
        "Sequential(\n"
        "  (0): Linear(in_features=4, out_features=3, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Linear(in_features=3, out_features=2, bias=True)\n"
        ")");
  PairSum pair;
  CHECK(pair.describe() == "PairSum");  // demangled, without namespaces
  CHECK(pair.str() == "PairSum");
  CHECK(short_type_name(typeid(nn::Sequential)) == "Sequential");
  CHECK(short_type_name<std::pair<nn::Linear, int>>() == "pair<Linear, int>");
}

TEST_CASE("a module without forward(const Tensor&) says which forward to call") {
  PairSum pair;
  nn::Module& m = pair;
  CHECK_THROWS_WITH_AS(m.forward(ones({2})),
                       "PairSum has no forward(const Tensor&): call its own forward(...), or "
                       "ddp->forward<PairSum>(inputs...) under DDP",
                       ValueError);
  CHECK(pair.forward(ones({2}), ones({2})).to_vector<float>() == std::vector<float>{2.f, 2.f});
}
