// DDP around a module with its own forward signature (forward<M>(args...)), and how a DDP
// prints: the same code path as forward(const Tensor&), PyTorch's `(module): ...` line.
#include <doctest/doctest.h>

#include <string>

#include "support/ddp_fixtures.hpp"
#include "support/gradcheck.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using parallel::DDP;
using parallel::DDPOptions;

namespace {

/// Two inputs, two Linear branches, summed: no forward(const Tensor&) of its own. With
/// with_b false the second branch is left out (an unused parameter set).
class TwoTower : public nn::Module {
 public:
  TwoTower() {
    Generator g(5);
    a = register_module("a", std::make_shared<nn::Linear>(8, 5, true, &g));
    b = register_module("b", std::make_shared<nn::Linear>(6, 5, true, &g));
  }
  Tensor forward(const Tensor& x1, const Tensor& x2) { return a->forward(x1) + b->forward(x2); }
  Tensor forward(const Tensor& x1, const Tensor& x2, bool with_b) {
    return with_b ? forward(x1, x2) : a->forward(x1);
  }
  std::shared_ptr<nn::Linear> a, b;
};

struct TwoInputs {
  Tensor x1, x2, y;
};

TwoInputs make_inputs(std::int64_t n) {
  Generator g(17);
  return {randn({n, 8}, &g), randn({n, 6}, &g), randint(5, {n}, &g)};
}

std::vector<Tensor> copies(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.clone());
  return out;
}

}  // namespace

TEST_CASE("forward<M> with two inputs on 2 ranks equals one process on the global batch (3 SGD momentum steps)") {
  const TwoInputs d = make_inputs(32);
  auto ref = std::make_shared<TwoTower>();
  optim::SGD ref_opt(ref->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < 3; ++s) {
    ref_opt.zero_grad();
    cross_entropy(ref->forward(d.x1, d.x2), d.y).backward();
    ref_opt.step();
  }
  const std::vector<Tensor> want = copies(ref->parameters());
  const std::vector<Tensor> start = copies(TwoTower().parameters());
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store);
    auto ddp = std::make_shared<DDP>(std::make_shared<TwoTower>(), pg);
    optim::SGD opt(ddp->parameters(), optim::SGDOptions(0.1).momentum(0.9));
    const std::int64_t lo = rank * 16, hi = lo + 16;
    const Tensor x1 = d.x1.narrow_rows(lo, hi), x2 = d.x2.narrow_rows(lo, hi), y = d.y.narrow_rows(lo, hi);
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      cross_entropy(ddp->forward<TwoTower>(x1, x2), y).backward();
      opt.step();
    }
    const auto got = ddp->parameters();
    REQUIRE_RANK(rank, got.size() == want.size(), "parameter count");
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = max_rel_err(got[i], want[i]);
      REQUIRE_RANK(rank, err <= 1e-5, detail::concat("parameter ", i, " relative error ", err, " > 1e-5"));
      // The steps moved every parameter: the comparison is not between two untouched models.
      REQUIRE_RANK(rank, max_rel_err(got[i], start[i]) > 1e-3, detail::concat("parameter ", i, " did not move"));
    }
  });
}

TEST_CASE("forward<M> walks the graph from the output with find_unused_parameters (a branch left out)") {
  const TwoInputs d = make_inputs(32);
  auto ref = std::make_shared<TwoTower>();
  optim::SGD ref_opt(ref->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < 3; ++s) {
    ref_opt.zero_grad();
    cross_entropy(ref->forward(d.x1, d.x2, s != 1), d.y).backward();
    // DDP marks the parameters the graph walk did not reach ready with a zero gradient
    // (docs/ddp.md), which momentum then applies.
    if (s == 1)
      for (const Tensor& p : ref->b->parameters()) p.set_grad(zeros(p.shape()));
    ref_opt.step();
  }
  const std::vector<Tensor> want = copies(ref->parameters());
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store);
    DDP ddp(std::make_shared<TwoTower>(), pg, DDPOptions().find_unused_parameters(true));
    optim::SGD opt(ddp.parameters(), optim::SGDOptions(0.1).momentum(0.9));
    const std::int64_t lo = rank * 16, hi = lo + 16;
    const Tensor x1 = d.x1.narrow_rows(lo, hi), x2 = d.x2.narrow_rows(lo, hi), y = d.y.narrow_rows(lo, hi);
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      cross_entropy(ddp.forward<TwoTower>(x1, x2, s != 1), y).backward();  // step 1: branch b unused
      opt.step();
    }
    const auto got = ddp.parameters();
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = max_rel_err(got[i], want[i]);
      REQUIRE_RANK(rank, err <= 1e-5, detail::concat("parameter ", i, " relative error ", err, " > 1e-5"));
    }
  });
}

TEST_CASE("forward<M> with the wrong M, and forward(x) on a module without one, are errors naming the types") {
  DDP ddp(std::make_shared<TwoTower>(), make_world_of_one());
  const Tensor x = zeros({2, 8});
  CHECK_THROWS_WITH_AS(ddp.forward<nn::Sequential>(x),
                       "DDP forward<Sequential> / module<Sequential>: the wrapped module is TwoTower, not "
                       "Sequential; use forward<TwoTower>(...) and module<TwoTower>(), or wrap a Sequential",
                       ValueError);
  CHECK_THROWS_AS(ddp.module<nn::Sequential>(), ValueError);
  CHECK(&ddp.module<TwoTower>() == &ddp.module());
  const DDP& as_const = ddp;
  CHECK(&as_const.module() == &ddp.module());
  CHECK_THROWS_WITH_AS(ddp.forward(x),
                       "TwoTower has no forward(const Tensor&): call its own forward(...), or "
                       "ddp->forward<TwoTower>(inputs...) under DDP",
                       ValueError);
  // Neither left anything half done: a correct call still works.
  CHECK(ddp.forward<TwoTower>(x, zeros({2, 6})).shape() == Shape{2, 5});
  // A base class of the wrapped module is an M too.
  CHECK_THROWS_AS(ddp.forward<nn::Module>(x), ValueError);  // Module's own forward(const Tensor&)
}

TEST_CASE("a DDP prints its module as PyTorch does, `(module): ...`, and keeps the plain state_dict names") {
  Generator g(1);
  auto net = nn::mlp({4, 3, 2}, "relu", &g);
  DDP ddp(net, make_world_of_one());
  CHECK(ddp.str() ==
        "DistributedDataParallel(\n"
        "  (module): Sequential(\n"
        "    (0): Linear(in_features=4, out_features=3, bias=True)\n"
        "    (1): ReLU()\n"
        "    (2): Linear(in_features=3, out_features=2, bias=True)\n"
        "  )\n"
        ")");
  std::vector<std::string> names;
  for (auto& [n, t] : ddp.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(ddp.state_dict().contains("0.weight"));
}

namespace {
/// TwoTower with a SyncBatchNorm after the sum: collectives in every training forward.
class TwoTowerSyncBN : public TwoTower {
 public:
  explicit TwoTowerSyncBN(ProcessGroupPtr pg) {
    bn = register_module("bn", std::make_shared<parallel::SyncBatchNorm>(5, 1e-5, 0.1, true, true, std::move(pg)));
  }
  Tensor forward(const Tensor& x1, const Tensor& x2) { return bn->forward(TwoTower::forward(x1, x2)); }
  std::shared_ptr<parallel::SyncBatchNorm> bn;
};
}  // namespace

TEST_CASE("under Join, a joined rank whose last forward took several inputs refuses to shadow SyncBatchNorm") {
  const TwoInputs d = make_inputs(32);
  std::vector<std::string> errors(2);
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    // A short timeout: the rank still training then stops waiting for the refusing one.
    auto pg = make_thread_group("gloo", rank, 2, store, std::chrono::seconds(3));
    DDP ddp(std::make_shared<TwoTowerSyncBN>(pg), pg);
    try {
      parallel::Join join({&ddp});
      for (int s = 0; s < 1 + rank; ++s) {  // rank 0 runs out of inputs first
        const std::int64_t lo = 8 * (2 * s + rank), hi = lo + 8;
        const Tensor x1 = d.x1.narrow_rows(lo, hi), x2 = d.x2.narrow_rows(lo, hi), y = d.y.narrow_rows(lo, hi);
        cross_entropy(ddp.forward<TwoTowerSyncBN>(x1, x2), y).backward();
      }
      join.finish();
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  CHECK(errors[0] ==
        "DDP under Join: this rank's last forward took several inputs (forward<M>(...)), so it cannot shadow the "
        "collectives in the others' forward (SyncBatchNorm) with an empty batch; give every rank the same number "
        "of batches, or use a model without forward collectives");
  CHECK(!errors[1].empty());  // the rank still training does not wait forever
}
