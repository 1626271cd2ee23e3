#pragma once
// Checks run by every rank of a multi-host (or posing-as-multi-host) job: the conformance
// suite, then DDP on W workers equal to one process on the global batch (SGD momentum).
// Shared by tests/tools/test_two_nodes.cpp (forked ranks) and tests/support/hierarchy_worker.cpp
// (ranks started by phalanx-run). Throws on the first mismatch, naming the rank.
#include <algorithm>
#include <cmath>

#include "support/conformance.hpp"

namespace phalanx::test {

/// DDP on `pg` (W workers, 24 / W samples each) equals one process on batches of 24, 12 steps.
inline void check_ddp_equals_one_process(const ProcessGroupPtr& pg) {
  const int W = pg->size(), rank = pg->rank();
  Generator g(99);
  const Tensor x = randn({96, 16}, &g), y = randint(5, {96}, &g);
  auto make_model = [] {
    Generator mg(3);
    return nn::mlp({16, 32, 32, 5}, "relu", &mg);
  };
  auto train = [&](nn::Module& model, samplers::Sampler& sampler, std::int64_t batch) {
    optim::SGD opt(model.parameters(), optim::SGDOptions(0.1).momentum(0.9));
    std::shared_ptr<samplers::Sampler> s(&sampler, [](samplers::Sampler*) {});
    samplers::DataLoader loader(std::make_shared<samplers::TensorDataset>(x, y), {batch}, s);
    int step = 0;
    for (std::int64_t epoch = 0; step < 12; ++epoch) {
      loader.set_epoch(epoch);
      for (samplers::Batch& b : loader) {
        opt.zero_grad();
        cross_entropy(model.forward(b.x), b.y).backward();
        opt.step();
        if (++step == 12) break;
      }
    }
  };
  auto one = make_model();
  samplers::SequentialSampler all(96);
  train(*one, all, 24);
  parallel::DDP ddp(make_model(), pg);
  samplers::DistributedSampler mine(96, samplers::DistributedSamplerOptions().num_replicas(W).rank(rank).shuffle(false));
  train(ddp, mine, 24 / W);
  const auto want = one->parameters();
  const auto got = ddp.parameters();
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto a = got[i].to_vector<float>(), b = want[i].to_vector<float>();
    double err = 0;
    for (std::size_t k = 0; k < a.size(); ++k)
      err = std::max(err, std::abs(static_cast<double>(a[k]) - b[k]) / std::max(1e-3, std::abs(static_cast<double>(b[k]))));
    if (!(err <= 1e-5))
      throw std::runtime_error(detail::concat("rank ", rank, ": DDP on ", W, " workers (", pg->backend_name(),
                                              ") differs from one process: parameter ", i, " relative error ", err));
  }
}

}  // namespace phalanx::test
