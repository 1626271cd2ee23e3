// Tied weights (one tensor registered under two names, as nanoGPT's lm_head.weight is
// transformer.wte.weight): named_parameters lists it once (PyTorch's remove_duplicate),
// state_dict under every name, load_state_dict as PyTorch's strict load, gradients of both
// uses summed in the one tensor, optimizers and clip_grad_norm_ see it once.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "support/gradcheck.hpp"
#include "support/tied_lm.hpp"

using namespace phalanx;
using namespace phalanx::test;

// Counts heap allocations (the whole gpt_tests program's; only differences are read), to
// show that named_parameters() of an untied model builds no set of seen tensors.
namespace {
std::atomic<long> g_allocations{0};
}
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

/// The same model untied: the output layer holds its own copy of the embedding's values.
struct Untied {
  nn::Embedding emb{kTiedVocab, kTiedWidth};
  nn::Linear hidden{kTiedWidth, kTiedWidth}, head{kTiedWidth, kTiedVocab, false};
  explicit Untied(const TiedLM& m) {
    NoGradGuard ng;
    emb.weight.copy_(m.emb->weight);
    head.weight.copy_(m.emb->weight);
    hidden.weight.copy_(m.hidden->weight);
    hidden.bias.copy_(m.hidden->bias);
  }
  Tensor forward(const Tensor& x) { return head.forward(tanh(hidden.forward(emb.forward(x)))); }
};

}  // namespace

TEST_CASE("a tied weight is one parameter, listed once under its first name; state_dict has both names") {
  TiedLM m;
  CHECK(m.head->weight.is_same(m.emb->weight));
  CHECK(names_of(m.named_parameters()) == std::vector<std::string>{"emb.weight", "hidden.weight", "hidden.bias"});
  CHECK(m.parameters().size() == 3);
  CHECK(names_of(m.named_parameters(false)) ==
        std::vector<std::string>{"emb.weight", "hidden.weight", "hidden.bias", "head.weight"});
  const TensorMap s = m.state_dict();
  CHECK(s.names() == std::vector<std::string>{"emb.weight", "hidden.weight", "hidden.bias", "head.weight"});
  // Both entries share the one storage, as PyTorch's state_dict does.
  CHECK(s.at("emb.weight").data<float>() == s.at("head.weight").data<float>());

  // The same tensor registered twice on one module, and a child shared by two parents.
  struct Twice : nn::Module {
    Twice() {
      Tensor w = randn({3, 3});
      a = register_parameter("a", w);
      b = register_parameter("b", w);
      register_buffer("r", zeros({2}));
      shared = std::make_shared<nn::Linear>(3, 3);
      register_module("x", shared);
      register_module("y", shared);
    }
    Tensor a, b;
    std::shared_ptr<nn::Linear> shared;
  } twice;
  CHECK(names_of(twice.named_parameters()) == std::vector<std::string>{"a", "x.weight", "x.bias"});
  CHECK(twice.state_dict().size() == 7);  // a, b, x.weight, x.bias, y.weight, y.bias, r
}

TEST_CASE("the tied weight's gradient is the sum of both uses; one SGD step moves it once") {
  TiedLM tied;
  Untied untied(tied);
  const TokenData d = make_tokens(32);
  cross_entropy(tied.forward(d.x), d.y).backward();
  cross_entropy(untied.forward(d.x), d.y).backward();
  const Tensor want = add(untied.emb.weight.grad(), untied.head.weight.grad());
  CHECK(max_rel_err(tied.emb->weight.grad(), want) < 1e-6);
  CHECK(max_rel_err(tied.hidden->weight.grad(), untied.hidden.weight.grad()) < 1e-6);

  // The optimizer takes parameters() as is (a duplicate would be refused) and steps it once.
  const Tensor before = tied.emb->weight.clone();
  optim::SGD opt(tied.parameters(), optim::SGDOptions(0.5));
  opt.step();
  CHECK(max_rel_err(tied.emb->weight, sub(before, mul(want, 0.5f))) < 1e-6);
  // Both handles of the tie in one list are the same tensor twice: refused, as PyTorch's groups.
  CHECK_THROWS_AS(optim::SGD(std::vector<Tensor>{tied.emb->weight, tied.head->weight}, optim::SGDOptions(0.1)),
                  ValueError);
}

TEST_CASE("clip_grad_norm_ over parameters() counts the tied gradient once") {
  TiedLM tied;
  const TokenData d = make_tokens(16);
  cross_entropy(tied.forward(d.x), d.y).backward();
  double want = 0;
  for (const Tensor& p : tied.parameters())
    for (float g : p.grad().to_vector<float>()) want += static_cast<double>(g) * g;
  want = std::sqrt(want);
  const double total = nn::clip_grad_norm_(tied.parameters(), 1e-3);
  CHECK(total == doctest::Approx(want).epsilon(1e-6));
}

TEST_CASE("load_state_dict: strict wants both names; one name loads with strict=false; the last name wins") {
  TiedLM src(1), dst(2);
  const TensorMap s = src.state_dict();
  dst.load_state_dict(s);
  CHECK(max_rel_err(dst.emb->weight, src.emb->weight) == 0);
  CHECK(dst.head->weight.is_same(dst.emb->weight));  // loading copies values in, the tie stays

  TensorMap only_emb;
  for (const auto& [k, v] : s)
    if (k != "head.weight") only_emb.set(k, v);
  TiedLM other(3);
  try {
    other.load_state_dict(only_emb);
    FAIL("a strict load without head.weight must fail");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("missing: head.weight") != std::string::npos);
  }
  TensorMap only_head;
  only_head.set("head.weight", s.at("emb.weight"));
  other.load_state_dict(only_head, false);
  CHECK(max_rel_err(other.emb->weight, src.emb->weight) == 0);

  // Both names with different values: the later one in state_dict order (head.weight) wins.
  TensorMap both = s;
  both.set("head.weight", mul(s.at("emb.weight"), 2.f));
  other.load_state_dict(both);
  CHECK(max_rel_err(other.emb->weight, mul(s.at("emb.weight"), 2.f)) == 0);
}

TEST_CASE("a .npz of a tied model holds both names and loads back into the tie") {
  TiedLM src(4), dst(5);
  char path[] = "/tmp/phalanx_tied_XXXXXX.npz";
  const int fd = ::mkstemps(path, 4);
  REQUIRE(fd >= 0);
  ::close(fd);
  save_npz(path, src.state_dict());
  const TensorMap back = load_npz(path);
  std::remove(path);
  CHECK(back.contains("emb.weight"));
  CHECK(back.contains("head.weight"));
  dst.load_state_dict(back);
  const TokenData d = make_tokens(8);
  NoGradGuard ng;
  CHECK(max_rel_err(dst.forward(d.x), src.forward(d.x)) == 0);
}

TEST_CASE("replace_parameter: shape, dtype and unknown names are one-line errors") {
  nn::Linear a(4, 3), b(4, 2);
  CHECK_THROWS_WITH_AS(a.replace_parameter("weight", b.weight),
                       "Linear.replace_parameter('weight'): the tensor has shape [2, 4] but the parameter has [3, 4]",
                       ShapeError);
  CHECK_THROWS_WITH_AS(a.replace_parameter("kernel", b.weight),
                       "Linear has no parameter 'kernel' to replace (it has: weight, bias)", ValueError);
  CHECK_THROWS_AS(a.replace_parameter("weight", zeros({3, 4}, DType::Int64)), TypeError);
  nn::Linear c(4, 3);
  c.weight = c.replace_parameter("weight", a.weight);
  CHECK(c.parameters().front().is_same(a.weight));
}

TEST_CASE("replace_parameter alone ties: forward reads the new tensor, an optimizer step moves it") {
  Generator g(5);
  nn::Embedding emb(kTiedVocab, kTiedWidth, std::nullopt, &g);
  nn::Linear head(kTiedWidth, kTiedVocab, false, &g);
  head.replace_parameter("weight", emb.weight);  // no `head.weight = ...`: the member follows
  CHECK(head.weight.is_same(emb.weight));
  const Tensor x = randn({3, kTiedWidth}, &g);
  {
    NoGradGuard ng;
    CHECK(max_rel_err(head.forward(x), matmul(x, transpose(emb.weight, 0, 1))) < 1e-6);
  }
  cross_entropy(head.forward(x), randint(kTiedVocab, {3}, &g)).backward();
  optim::SGD opt(head.parameters(), optim::SGDOptions(0.5));
  NoGradGuard ng;
  const Tensor before = head.forward(x).clone();
  opt.step();
  CHECK(max_rel_err(head.forward(x), before) > 1e-3);
  CHECK(max_rel_err(head.forward(x), matmul(x, transpose(emb.weight, 0, 1))) < 1e-6);

  // The other layers that keep handles follow too.
  nn::LayerNorm a({4}), b({4});
  a.replace_parameter("bias", b.bias);
  CHECK(a.bias.is_same(b.bias));
  nn::MultiheadAttention m(8, 2), n(8, 2);
  m.replace_parameter("in_proj_weight", n.in_proj_weight);
  CHECK(m.in_proj_weight.is_same(n.in_proj_weight));
}

TEST_CASE("replace_parameter refuses a computed tensor and another device; a detached one trains") {
  nn::Linear a(4, 3), b(4, 3);
  // A computed tensor never gets a .grad: an optimizer would skip it without a word.
  CHECK_THROWS_WITH_AS(a.replace_parameter("weight", mul(b.weight, 2.f)),
                       "Linear.replace_parameter('weight'): the tensor is computed (not a leaf): pass another "
                       "module's parameter, or detach() it",
                       ValueError);
  CHECK_THROWS_WITH_AS(a.replace_parameter("weight", zeros({3, 4}, DType::Int64)),
                       "Linear.replace_parameter('weight'): the tensor is int64 but the parameter is float32",
                       TypeError);
  nn::Linear s(4, 3);
  s.to(Device::sim());
  CHECK_THROWS_AS(a.replace_parameter("weight", s.weight), ValueError);
  Tensor d = b.weight.detach();
  CHECK(!d.requires_grad());
  a.weight = a.replace_parameter("weight", d);
  CHECK(a.parameters().front().is_same(d));
  CHECK(d.requires_grad());
}

namespace {
struct ThreeLayers : nn::Module {
  ThreeLayers() {
    for (const char* n : {"a", "b", "c"}) layers.push_back(register_module(n, std::make_shared<nn::Linear>(4, 4)));
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};
/// A module that registers another module's parameter as its own (a tie without replace_parameter).
struct Sharing : nn::Module {
  explicit Sharing(const Tensor& w) { register_parameter("w", w); }
};
long allocations_of(const std::function<void()>& f) {
  const long before = g_allocations.load();
  f();
  return g_allocations.load() - before;
}
}  // namespace

TEST_CASE("named_parameters of an untied model builds no set (zero_grad, clip_grad_norm_ call it each step)") {
  ThreeLayers m;
  const long listed = allocations_of([&] { CHECK(m.named_parameters(false).size() == 6); });
  const long deduplicated = allocations_of([&] { CHECK(m.named_parameters(true).size() == 6); });
  CHECK(deduplicated == listed);  // a std::set would add one node per tensor
  CHECK(allocations_of([&] { m.named_buffers(true); }) == allocations_of([&] { m.named_buffers(false); }));

  // Every way to tie is still seen: replace_parameter, and registering a registered tensor.
  TiedLM tied;
  CHECK(tied.named_parameters().size() == tied.named_parameters(false).size() - 1);
  struct Both : nn::Module {
    Both() {
      first = register_module("first", std::make_shared<nn::Linear>(4, 4));
      second = register_module("second", std::make_shared<Sharing>(first->weight));
    }
    std::shared_ptr<nn::Linear> first;
    std::shared_ptr<Sharing> second;
  } both;
  CHECK(both.named_parameters().size() == 2);
  CHECK(both.named_parameters(false).size() == 3);
}
