// The option structs are libtorch's (PHALANX_ARG = TORCH_ARG): every setter chains and its
// getter reads the value back; the defaults and the one-number constructors are unchanged.
#include <doctest/doctest.h>

#include <numeric>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

TEST_CASE("SGDOptions: defaults, every setter chained and read back, one-number forms") {
  const optim::SGDOptions d;
  CHECK(d.lr() == 0.01);
  CHECK(d.momentum() == 0.0);
  CHECK(d.dampening() == 0.0);
  CHECK(d.weight_decay() == 0.0);
  CHECK(d.nesterov() == false);
  const auto o = optim::SGDOptions(0.1).momentum(0.9).dampening(0.25).weight_decay(1e-4).nesterov(true).lr(0.2);
  CHECK(o.lr() == 0.2);
  CHECK(o.momentum() == 0.9);
  CHECK(o.dampening() == 0.25);
  CHECK(o.weight_decay() == 1e-4);
  CHECK(o.nesterov() == true);
  optim::SGDOptions m(0.5);
  CHECK(&m.momentum(0.8) == &m);  // setters return the options themselves
  m.lr() = 0.3;                   // the non-const getter is a reference, as libtorch's
  CHECK(m.lr() == 0.3);
  CHECK(m.momentum_ == 0.8);      // storage is public, as libtorch's
  CHECK(optim::SGDOptions{0.1}.lr() == 0.1);
  const optim::SGDOptions implicit = 0.05;  // /* implicit */ as libtorch's SGDOptions(double lr)
  CHECK(implicit.lr() == 0.05);
  // The optimizer takes the values.
  Tensor p = ones({2}).requires_grad_();
  optim::SGD sgd({p}, optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3).nesterov(true));
  CHECK(sgd.defaults().at("lr") == 0.1);
  CHECK(sgd.defaults().at("momentum") == 0.9);
  CHECK(sgd.defaults().at("weight_decay") == 1e-3);
  CHECK(sgd.defaults().at("nesterov") == 1.0);
}

TEST_CASE("AdamOptions and AdamWOptions: setters, betas(b1, b2), AdamW's weight decay 0.01 by default") {
  const optim::AdamOptions d;
  CHECK(d.lr() == 1e-3);
  CHECK(d.beta1() == 0.9);
  CHECK(d.beta2() == 0.999);
  CHECK(d.eps() == 1e-8);
  CHECK(d.weight_decay() == 0.0);
  CHECK(d.amsgrad() == false);
  const auto a = optim::AdamOptions(2e-3).beta1(0.8).beta2(0.99).eps(1e-6).weight_decay(0.1).amsgrad(true);
  CHECK(a.lr() == 2e-3);
  CHECK(a.beta1() == 0.8);
  CHECK(a.beta2() == 0.99);
  CHECK(a.eps() == 1e-6);
  CHECK(a.weight_decay() == 0.1);
  CHECK(a.amsgrad() == true);
  const auto b = optim::AdamOptions().betas(0.5, 0.75);
  CHECK(b.beta1() == 0.5);
  CHECK(b.beta2() == 0.75);

  const optim::AdamWOptions w;
  CHECK(w.lr() == 1e-3);
  CHECK(w.weight_decay() == 0.01);
  const auto w2 = optim::AdamWOptions(5e-4).betas(0.85, 0.95).eps(1e-7).weight_decay(0.2).amsgrad(true);
  CHECK(w2.lr() == 5e-4);
  CHECK(w2.beta1() == 0.85);
  CHECK(w2.beta2() == 0.95);
  CHECK(w2.eps() == 1e-7);
  CHECK(w2.weight_decay() == 0.2);
  CHECK(w2.amsgrad() == true);

  Tensor p = ones({2}).requires_grad_();
  CHECK(optim::AdamW({p}).defaults().at("weight_decay") == 0.01);
  CHECK(optim::AdamW({p}, optim::AdamWOptions(1e-2)).defaults().at("lr") == 1e-2);
  CHECK(optim::Adam({p}, optim::AdamOptions(1e-2)).defaults().at("weight_decay") == 0.0);
  CHECK(optim::Adam({p}, optim::AdamOptions().betas(0.8, 0.9)).defaults().at("beta2") == 0.9);
}

TEST_CASE("DistributedSamplerOptions: setters chained and read back; shuffle(false) turns shuffling off") {
  const DistributedSamplerOptions d;
  CHECK(d.num_replicas() == -1);
  CHECK(d.rank() == -1);
  CHECK(d.shuffle() == true);
  CHECK(d.seed() == 0);
  CHECK(d.drop_last() == false);
  const auto o = DistributedSamplerOptions().num_replicas(4).rank(3).shuffle(false).seed(42).drop_last(true);
  CHECK(o.num_replicas() == 4);
  CHECK(o.rank() == 3);
  CHECK(o.shuffle() == false);
  CHECK(o.seed() == 42);
  CHECK(o.drop_last() == true);

  std::vector<std::int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  DistributedSampler plain(50, DistributedSamplerOptions().num_replicas(1).rank(0).shuffle(false));
  DistributedSampler shuffled(50, DistributedSamplerOptions().num_replicas(1).rank(0));
  for (std::int64_t epoch : {0, 1, 2}) {
    plain.set_epoch(epoch);
    shuffled.set_epoch(epoch);
    CHECK(plain.indices() == identity);
    CHECK(shuffled.indices() != identity);  // the default shuffles
  }
}

TEST_CASE("DataLoaderOptions and DDPOptions: setters chained and read back") {
  const DataLoaderOptions d;
  CHECK(d.batch_size() == 1);
  CHECK(d.drop_last() == false);
  CHECK(d.prefetch() == 0);
  const auto l = DataLoaderOptions(64).drop_last(true).prefetch(2);
  CHECK(l.batch_size() == 64);
  CHECK(l.drop_last() == true);
  CHECK(l.prefetch() == 2);
  CHECK(DataLoaderOptions{32}.batch_size() == 32);
  CHECK(DataLoaderOptions().batch_size(8).batch_size() == 8);

  const parallel::DDPOptions p;
  CHECK(p.bucket_cap_mb() == 25.0);
  CHECK(p.first_bucket_mb() == 1.0);
  CHECK(p.find_unused_parameters() == false);
  CHECK(p.broadcast_buffers() == true);
  CHECK(p.exact().enabled == false);
  const auto q = parallel::DDPOptions()
                     .bucket_cap_mb(50)
                     .first_bucket_mb(2)
                     .find_unused_parameters(true)
                     .broadcast_buffers(false)
                     .exact({true, 64, 16});
  CHECK(q.bucket_cap_mb() == 50.0);
  CHECK(q.first_bucket_mb() == 2.0);
  CHECK(q.find_unused_parameters() == true);
  CHECK(q.broadcast_buffers() == false);
  CHECK(q.exact().enabled);
  CHECK(q.exact().global_batch == 64);
  CHECK(q.exact().micro_batch == 16);
}
