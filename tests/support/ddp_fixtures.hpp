#pragma once
// The data, models and optimizers that the DDP tests share: tests/parallel/test_ddp.cpp (one
// process against W workers), test_ddp_devices.cpp (the same on the sim accelerator) and
// test_exact.cpp (exact mode).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

namespace phalanx::test {

struct Data {
  Tensor x, y;
};

/// n samples of `features` normal features, labels in [0, classes); the same for every call.
inline Data make_data(std::int64_t n, std::int64_t features = 16, std::int64_t classes = 5) {
  Generator g(99);
  return {randn({n, features}, &g), randint(classes, {n}, &g)};
}

/// Many small parameters and one large one (larger than the tests' 512 B bucket cap).
inline std::shared_ptr<nn::Sequential> many_small_one_large() {
  Generator g(5);
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Linear>(16, 128, true, &g));  // 2048 + 128 floats: the large one
  seq->push_back(std::make_shared<nn::Tanh>());
  seq->push_back(std::make_shared<nn::Linear>(128, 8, true, &g));
  for (int i = 0; i < 6; ++i) {
    seq->push_back(std::make_shared<nn::ReLU>());
    seq->push_back(std::make_shared<nn::Linear>(8, 8, true, &g));
  }
  seq->push_back(std::make_shared<nn::Linear>(8, 5, true, &g));
  return seq;
}

/// Two heads on 16 features; forward uses one of them (`use_b`), the other stays unused.
class TwoHeads : public nn::Module {
 public:
  TwoHeads() {
    Generator g(7);
    a = register_module("a", std::make_shared<nn::Linear>(16, 5, true, &g));
    b = register_module("b", std::make_shared<nn::Linear>(16, 5, true, &g));
  }
  Tensor forward(const Tensor& x) override { return use_b ? b->forward(x) : a->forward(x); }
  std::string describe() const override { return "TwoHeads"; }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = false;
};

/// Trains `steps` steps of `batch` samples drawn by `sampler` (epoch after epoch), the batches
/// moved to `dev`; the result is in the model's parameters.
inline void train_steps(nn::Module& model, optim::Optimizer& opt, const Data& d, samplers::Sampler* sampler,
                        std::int64_t batch, int steps, Device dev = Device::cpu()) {
  auto ds = std::make_shared<samplers::TensorDataset>(d.x, d.y);
  std::shared_ptr<samplers::Sampler> s(sampler, [](samplers::Sampler*) {});
  samplers::DataLoader loader(ds, {batch}, s);
  int step = 0;
  for (std::int64_t epoch = 0; step < steps; ++epoch) {
    loader.set_epoch(epoch);
    for (samplers::Batch& b : loader) {
      opt.zero_grad();
      cross_entropy(model.forward(b.x.to(dev)), b.y.to(dev)).backward();
      opt.step();
      if (++step == steps) break;
    }
  }
}

/// `steps` steps of k accumulated micro-batches of `micro` samples per rank, the first k - 1
/// inside no_sync(), the loss scaled by 1/k. Rank r's share of global batch g: a
/// DistributedSampler's positions r, r+W, ... (without shuffling).
inline void no_sync_steps(parallel::DDP& ddp, optim::Optimizer& opt, const Data& d, int rank, int W, int k,
                          std::int64_t micro, int steps, Device dev = Device::cpu()) {
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    for (int m = 0; m < k; ++m) {
      std::vector<std::int64_t> idx;
      for (std::int64_t j = 0; j < micro; ++j) idx.push_back(step * W * k * micro + rank + W * (m * micro + j));
      Tensor xb = Tensor::empty({micro, d.x.shape()[1]}), yb = Tensor::empty({micro}, DType::Int64);
      samplers::TensorDataset(d.x, d.y).gather(idx.data(), micro, xb, yb);
      Tensor loss = cross_entropy(ddp.forward(xb.to(dev)), yb.to(dev)) * (1.f / k);
      if (m < k - 1) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    opt.step();
  }
}

/// "sgd": SGD with momentum; anything else: AdamW with weight decay.
inline std::unique_ptr<optim::Optimizer> make_opt(const std::string& kind, const std::vector<Tensor>& ps) {
  if (kind == "sgd") return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions(1e-2).weight_decay(0.05));
}

}  // namespace phalanx::test
