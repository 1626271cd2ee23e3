// Fashion-MNIST with DDP: real data from Debian's dataset-fashion-mnist.
//
//   phalanx-run --nproc-per-node 2 build/examples/fashion_mnist [--epochs 5] [--data DIR]
//
// An MLP 784-256-10, SGD with momentum and a cosine schedule, global batch 128 (64 per worker
// with 2 workers), the linear-scaling recipe from a rate tuned at batch 128. Prints loss and
// test accuracy per epoch (rank 0); every worker evaluates its shard of the test set and the
// counts are summed. --require ACC exits non-zero unless the test accuracy reaches ACC.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

int run(int argc, char** argv) {
  int epochs = 5;
  std::string dir = kFashionMnistDir;
  float require = 0;  // --require ACC: exit non-zero below this final test accuracy
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--epochs" && i + 1 < argc) epochs = std::atoi(argv[++i]);
    else if (a == "--data" && i + 1 < argc) dir = argv[++i];
    else if (a == "--require" && i + 1 < argc) require = std::strtof(argv[++i], nullptr);
    else {
      std::fprintf(stderr, "usage: fashion_mnist [--epochs N] [--data DIR] [--require ACC]\n");
      return 2;
    }
  }
  set_num_threads(1);
  auto pg = parallel::init_process_group();  // [1]
  const int rank = pg->rank(), world = pg->size();

  MnistOptions mo;
  mo.standardize = true;
  auto train_set = load_mnist(dir, mo);
  mo.train = false;
  auto test_set = load_mnist(dir, mo);

  optim::ScalingOptions so;
  so.base_lr = 0.05;
  so.base_batch = 128;
  so.global_batch = 128;
  so.world_size = world;
  const auto plan = optim::linear_scaling(so);

  Generator g(42);
  auto model = std::make_shared<parallel::DDP>(nn::mlp({784, 256, 10}, "relu", &g), pg);  // [2]
  auto sampler = std::make_shared<DistributedSampler>(train_set->size(), DistributedSamplerOptions().seed(7));  // [3]
  DataLoader loader(train_set, DataLoaderOptions(plan.per_rank_batch).prefetch(2), sampler);
  auto eval_opts = DistributedSamplerOptions().shuffle(false);
  DataLoader test_loader(test_set, {1000}, std::make_shared<DistributedSampler>(test_set->size(), eval_opts));
  optim::SGD opt(model->parameters(), optim::SGDOptions(plan.lr).momentum(0.9));
  optim::CosineAnnealingLR schedule(opt, epochs * loader.num_batches());
  if (rank == 0) std::printf("Fashion-MNIST, %d worker(s): %s\n", world, plan.describe().c_str());

  float acc = 0, best = 0;
  // ---- TRAINING LOOP ----
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler->set_epoch(epoch);
    model->train();
    Tensor stats = zeros({4});  // train loss sum, steps, test correct, test count
    float* s = stats.data<float>();
    for (Batch& b : loader) {
      opt.zero_grad();
      Tensor loss = cross_entropy(model->forward(b.x), b.y);
      loss.backward();
      opt.step();
      schedule.step();
      s[0] += loss.item();
      s[1] += 1;
    }
    model->eval();
    {
      NoGradGuard no_grad;
      for (Batch& b : test_loader) {
        const Tensor predicted = argmax(model->forward(b.x), 1);  // the first largest logit
        const auto* k = predicted.data<std::int64_t>();
        const auto* y = b.y.data<std::int64_t>();
        for (std::int64_t i = 0; i < b.y.numel(); ++i) s[2] += k[i] == y[i];
        s[3] += static_cast<float>(b.y.numel());
      }
    }
    pg->allreduce(stats)->wait();
    acc = s[2] / s[3];
    best = std::max(best, acc);
    if (rank == 0) std::printf("epoch %d: train loss %.4f, test accuracy %.4f\n", epoch + 1, s[0] / s[1], acc);
  }
  // ---- END TRAINING LOOP ----
  parallel::destroy_process_group();
  if (rank == 0 && require > 0)
    std::printf("best test accuracy %.4f (required %.2f): %s\n", best, require, best >= require ? "ok" : "NOT REACHED");
  return best >= require ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a clear one-line error, never an abort
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
