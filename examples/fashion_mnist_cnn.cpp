// Fashion-MNIST with a small CNN, BatchNorm and DDP: real data from Debian's dataset-fashion-mnist.
//
//   phalanx-run --nproc-per-node 2 build/examples/fashion_mnist_cnn [--epochs 5] [--no-sync-bn]
//                                                                  [--data DIR] [--require ACC]
//                                                                  [--precision fp32|bf16]
//
// The model is the one PyTorch's DDP tutorials teach with, in nn.Sequential layout:
//   Conv2d(1, 32, 3, padding=1) - BatchNorm2d(32) - ReLU - MaxPool2d(2)      28x28 -> 14x14
//   Conv2d(32, 64, 3, padding=1) - BatchNorm2d(64) - ReLU - MaxPool2d(2)     14x14 -> 7x7
//   Flatten - Linear(64 * 7 * 7, 10)
// Adam (lr 1e-3 at batch 128) with a cosine schedule to 0 over the run, global batch 128 (64
// per worker with 2 workers); another global batch scales the rate linearly.
//
// [1] SyncBatchNorm. Under DDP each worker sees only its shard of the global batch: a plain
//     BatchNorm normalises with the statistics of those 64 samples, and its running
//     statistics (what eval mode uses) are rank 0's, broadcast before every forward.
//     convert_sync_batchnorm swaps every BatchNorm for a SyncBatchNorm, which all-reduces
//     the per-channel sums in the forward (and the matching sums in the backward), so the
//     statistics are those of the global batch of 128: the model trains as on one process
//     at batch 128, whatever the number of workers. --no-sync-bn keeps the plain BatchNorm.
//
// [2] --precision bf16: each forward (and its loss) under autocast bfloat16, as
//     `with torch.autocast("cpu", dtype=torch.bfloat16):` — the convolutions and the Linear
//     in bf16 (float32 sums), BatchNorm, pooling and the loss in the dtype autocast gives
//     them (docs/mixed_precision.md); the weights, their gradients and Adam stay float32.
//     Evaluation runs under it too, so the accuracy printed is the bf16 model's.
//
// Prints loss and test accuracy per epoch (rank 0); every worker evaluates its shard of the
// test set and the counts are summed. --require ACC exits non-zero unless the best test
// accuracy reaches ACC.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <phalanx/core/autocast.hpp>
#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

std::shared_ptr<nn::Sequential> make_cnn(Generator* g) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(1, 32, 3, 1, 1, 1, 1, true, g));
  m->push_back(std::make_shared<nn::BatchNorm2d>(32));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::MaxPool2d>(2));
  m->push_back(std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1, 1, 1, true, g));
  m->push_back(std::make_shared<nn::BatchNorm2d>(64));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::MaxPool2d>(2));
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 10, true, g));
  return m;
}

// Fashion-MNIST as [N, 1, 28, 28] images, standardised.
std::shared_ptr<TensorDataset> load_images(const std::string& dir, bool train) {
  MnistOptions mo;
  mo.standardize = true;
  mo.flatten = false;
  mo.train = train;
  auto flat = load_mnist(dir, mo);
  const std::int64_t n = flat->size();
  return std::make_shared<TensorDataset>(flat->features().reshape({n, 1, 28, 28}), flat->labels());
}

}  // namespace

int run(int argc, char** argv) {
  int epochs = 5;
  bool sync_bn = true, bf16 = false;
  std::string dir = kFashionMnistDir;
  float require = 0;  // --require ACC: exit non-zero below this best test accuracy
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--epochs" && i + 1 < argc) epochs = std::atoi(argv[++i]);
    else if (a == "--data" && i + 1 < argc) dir = argv[++i];
    else if (a == "--require" && i + 1 < argc) require = std::strtof(argv[++i], nullptr);
    else if (a == "--no-sync-bn") sync_bn = false;
    else if (a == "--precision" && i + 1 < argc) {
      const std::string p = argv[++i];
      if (p != "fp32" && p != "bf16") {
        std::fprintf(stderr, "%s: --precision %s: expected fp32 or bf16 (the CPU autocasts to bfloat16 only)\n",
                     "fashion_mnist_cnn", p.c_str());
        return 2;
      }
      bf16 = p == "bf16";
    }
    else {
      std::fprintf(stderr, "usage: fashion_mnist_cnn [--epochs N] [--no-sync-bn] [--data DIR] [--require ACC] "
                           "[--precision fp32|bf16]\n");
      return 2;
    }
  }
  if (epochs < 1) {
    std::fprintf(stderr, "fashion_mnist_cnn: --epochs must be >= 1\n");
    return 2;
  }
  set_num_threads(1);  // one core per worker
  auto pg = parallel::init_process_group();
  const int rank = pg->rank(), world = pg->size();

  auto train_set = load_images(dir, true);
  auto test_set = load_images(dir, false);

  optim::ScalingOptions so;
  so.base_lr = 1e-3;
  so.base_batch = 128;
  so.global_batch = 128;
  so.world_size = world;
  const auto plan = optim::linear_scaling(so);

  Generator g(42);
  std::shared_ptr<nn::Module> net = make_cnn(&g);
  if (sync_bn) net = parallel::convert_sync_batchnorm(net, pg);  // [1]
  auto model = std::make_shared<parallel::DDP>(net, pg);
  auto sampler = std::make_shared<DistributedSampler>(train_set->size(), DistributedSamplerOptions().seed(7));
  // No prefetch (the default 0): the data is in memory; a thread per worker would only compete
  // for the cores. drop_last: every step a full batch (BatchNorm on a last batch of 32 of
  // 60 000 adds nothing).
  DataLoader loader(train_set, DataLoaderOptions(plan.per_rank_batch).drop_last(true), sampler);
  auto eval_opts = DistributedSamplerOptions().shuffle(false);
  DataLoader test_loader(test_set, DataLoaderOptions(500), std::make_shared<DistributedSampler>(test_set->size(), eval_opts));
  optim::Adam opt(model->parameters(), optim::AdamOptions(plan.lr));
  optim::CosineAnnealingLR schedule(opt, epochs * loader.num_batches());
  if (rank == 0)
    std::printf("Fashion-MNIST CNN, %d worker(s), %s, %s: %s\n", world,
                sync_bn ? "SyncBatchNorm" : "BatchNorm (per worker)", bf16 ? "bf16 autocast" : "float32",
                plan.describe().c_str());

  float best = 0;
  const auto t0 = std::chrono::steady_clock::now();
  // ---- TRAINING LOOP ----
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler->set_epoch(epoch);
    model->train();
    Tensor stats = zeros({4});  // train loss sum, steps, test correct, test count
    float* s = stats.data<float>();
    for (Batch& b : loader) {
      opt.zero_grad();
      Tensor loss;
      {
        std::optional<autocast> guard;  // [2]
        if (bf16) guard.emplace(DType::BFloat16);
        loss = cross_entropy(model->forward(b.x), b.y);
      }
      loss.backward();
      opt.step();
      schedule.step();
      s[0] += loss.item();
      s[1] += 1;
    }
    model->eval();  // BatchNorm uses its running statistics (rank 0's, broadcast by DDP)
    {
      NoGradGuard no_grad;
      std::optional<autocast> guard;  // [2]
      if (bf16) guard.emplace(DType::BFloat16);
      for (Batch& b : test_loader) {
        const Tensor predicted = argmax(model->forward(b.x), 1);  // the first largest logit
        const auto* k = predicted.data<std::int64_t>();
        const auto* y = b.y.data<std::int64_t>();
        for (std::int64_t i = 0; i < b.y.numel(); ++i) s[2] += k[i] == y[i];
        s[3] += static_cast<float>(b.y.numel());
      }
    }
    pg->allreduce(stats)->wait();
    const float acc = s[2] / s[3];
    best = std::max(best, acc);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0)
      std::printf("epoch %d: train loss %.4f, test accuracy %.4f (%.0f s)\n", epoch + 1, s[0] / s[1], acc, seconds);
    std::fflush(stdout);
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
    std::fprintf(stderr, "fashion_mnist_cnn: %s\n", e.what());
    return 1;
  }
}
