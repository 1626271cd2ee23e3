// A whole training loop of your own, written the way a PyTorch DDP script is.
//
//   custom_loop [--epochs 4] [--out DIR] [--resume] [--stop-after-epoch K]
//   phalanx-run --nproc-per-node 2 custom_loop --out run2
//
// What it shows, in the order the program meets it:
//   1. a custom Module with two branches and two inputs (WideAndDeep::forward(signal, meta)),
//      called through DDP as ddp->forward<WideAndDeep>(signal, meta);
//   2. a custom dataset written one sample at a time (MapDataset::get(i)); the DataLoader
//      gathers the samples of a batch straight into its batch tensors;
//   3. DistributedSampler + DataLoader with chainable options, set_epoch every epoch;
//   4. AdamW with a linear warmup then a cosine decay (SequentialLR), gradient clipping;
//   5. a validation pass whose loss and accuracy are summed over the ranks, leaving out the
//      samples that DistributedSampler repeats to pad the last ranks;
//   6. metrics as JSON lines, a checkpoint after every epoch, and --resume from the newest.
//
// The global batch is fixed (32), so 1 process and 2 workers train the same model: their final
// weights agree to float rounding (run_checks.cmake requires 1e-6), and a run stopped after
// epoch 2 and resumed ends with the same bytes as one that never stopped.
//
// Files under --out (default custom_loop_out): metrics.jsonl, checkpoints/, weights.npz.
// A helper mode compares two weight files: custom_loop --compare A.npz B.npz [--rtol R].
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

namespace {

constexpr std::int64_t kSignal = 16, kMeta = 4, kClasses = 4, kGlobalBatch = 32;

// ---- 1. The model: a deep branch over the signal and a wide (linear) branch over the metadata,
// added before the classifier. Several inputs: it has its own forward(signal, meta); the
// one-input forward of nn::Module is left as it is (calling it says to use this one).
class WideAndDeep : public nn::Module {
 public:
  explicit WideAndDeep(Generator* g) {
    deep1_ = register_module("deep1", std::make_shared<nn::Linear>(kSignal, 32, true, g));
    deep2_ = register_module("deep2", std::make_shared<nn::Linear>(32, 32, true, g));
    wide_ = register_module("wide", std::make_shared<nn::Linear>(kMeta, 32, true, g));
    head_ = register_module("head", std::make_shared<nn::Linear>(32, kClasses, true, g));
  }
  Tensor forward(const Tensor& signal, const Tensor& meta) {
    Tensor deep = relu(deep2_->forward(relu(deep1_->forward(signal))));
    return head_->forward(relu(deep + wide_->forward(meta)));
  }

 private:
  std::shared_ptr<nn::Linear> deep1_, deep2_, wide_, head_;
};

// ---- 2. The data, one sample at a time: sample i is made from i alone (a real dataset would
// read a file here). x packs the two inputs [signal (16) | meta (4)]; the label depends on
// both, so both branches have something to learn.
class SyntheticDataset : public samplers::MapDataset {
 public:
  SyntheticDataset(std::int64_t n, std::uint64_t seed) : n_(n), seed_(seed) {}
  std::int64_t size() const override { return n_; }
  samplers::Example get(std::int64_t i) const override {
    Generator g(seed_ * 1000003u + static_cast<std::uint64_t>(i));
    Tensor x = randn({kSignal + kMeta}, &g);
    const float* v = x.data<float>();
    float energy = 0;
    for (std::int64_t k = 0; k < kSignal; ++k) energy += v[k] * (k % 2 ? 1.f : -1.f);
    const std::int64_t label = (energy > 0 ? 1 : 0) + (v[kSignal] + v[kSignal + 1] > 0 ? 2 : 0);
    return {x, scalar_int64(label)};
  }

 private:
  static Tensor scalar_int64(std::int64_t v) {
    Tensor t = Tensor::empty({}, DType::Int64);
    *t.data<std::int64_t>() = v;
    return t;
  }
  std::int64_t n_;
  std::uint64_t seed_;
};

struct Args {
  int epochs = 4, stop_after = -1;
  std::string out = "custom_loop_out";
  bool resume = false;
};

// The two inputs of a packed batch, as PyTorch's x[:, :16] and x[:, 16:].
Tensor signal_of(const Tensor& x) { return narrow(x, 1, 0, kSignal); }
Tensor meta_of(const Tensor& x) { return narrow(x, 1, kSignal, kMeta); }

// ---- 5. Validation: summed loss, correct and counted samples over every rank. The sampler pads
// the last ranks by repeating the first samples; rank r's k-th sample sits at position r + k*W
// of the order, so only its first ceil((N - r) / W) samples are real.
struct Validation {
  double loss = 0, accuracy = 0;
};

Validation validate(parallel::DDP& model, samplers::DataLoader& loader, std::int64_t n, int rank, int world) {
  const timeline::Span span("validation", "train");
  model.eval();
  NoGradGuard no_grad;
  std::int64_t real_left = std::max<std::int64_t>(0, (n - rank + world - 1) / world);
  double loss_sum = 0;
  std::int64_t correct = 0, counted = 0;
  for (samplers::Batch& b : loader) {
    const std::int64_t m = std::min<std::int64_t>(real_left, b.y.numel());
    real_left -= m;
    if (m == 0) continue;
    // the module itself, not DDP's forward: no gradients, nothing to reduce
    auto& net = model.module<WideAndDeep>();
    const Tensor logits = narrow(net.forward(signal_of(b.x), meta_of(b.x)), 0, 0, m);
    const Tensor y = narrow(b.y, 0, 0, m);
    loss_sum += cross_entropy(logits, y, Reduction::Sum).item();
    const Tensor predicted = argmax(logits, 1);
    const auto* k = predicted.data<std::int64_t>();
    const auto* t = y.data<std::int64_t>();
    for (std::int64_t i = 0; i < m; ++i) correct += k[i] == t[i];
    counted += m;
  }
  model.train();
  // Sums over the ranks: the loss as a float, the counts exactly as integers.
  const double loss_total = parallel::all_reduce_scalar(loss_sum, ReduceOp::Sum);
  const std::int64_t correct_total = parallel::all_reduce_scalar(correct, ReduceOp::Sum);
  const std::int64_t counted_total = parallel::all_reduce_scalar(counted, ReduceOp::Sum);
  return {loss_total / static_cast<double>(counted_total),
          static_cast<double>(correct_total) / static_cast<double>(counted_total)};
}

int train(const Args& args) {
  set_num_threads(1);
  auto pg = parallel::init_process_group();  // the launcher's environment, or a world of one
  const int rank = pg->rank(), world = pg->size();
  if (kGlobalBatch % world != 0)
    throw ConfigError("the global batch 32 needs a world size that divides it; got " + std::to_string(world));

  auto train_set = std::make_shared<SyntheticDataset>(2048, 1);
  auto val_set = std::make_shared<SyntheticDataset>(500, 2);

  // ---- 3. Sharding: every rank sees its own 1/W of each epoch; the global batch stays 32.
  auto sampler = std::make_shared<samplers::DistributedSampler>(
      train_set->size(), samplers::DistributedSamplerOptions().seed(7));
  samplers::DataLoader loader(train_set, samplers::DataLoaderOptions(kGlobalBatch / world).drop_last(true), sampler);
  auto val_sampler = std::make_shared<samplers::DistributedSampler>(
      val_set->size(), samplers::DistributedSamplerOptions().shuffle(false));
  samplers::DataLoader val_loader(val_set, samplers::DataLoaderOptions(100), val_sampler);

  Generator init(42);
  auto model = std::make_shared<parallel::DDP>(std::make_shared<WideAndDeep>(&init), pg);
  if (rank == 0) std::printf("%s\n", model->str().c_str());

  // ---- 4. AdamW, 10 warmup steps from a tenth of the rate, then cosine down to zero.
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  const std::int64_t steps_per_epoch = loader.num_batches(), total = args.epochs * steps_per_epoch;
  auto warmup = std::make_shared<optim::LinearLR>(opt, 0.1, 1.0, 10);
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(opt, total - 10);
  optim::SequentialLR schedule(opt, {warmup, cosine}, {10});

  // ---- 6. Checkpoints: rank 0 writes one after every epoch; every rank reads the newest on resume.
  const std::string ckpt_dir = args.out + "/checkpoints";
  std::unique_ptr<parallel::CheckpointDir> dir;
  if (rank == 0) {
    dir = std::make_unique<parallel::CheckpointDir>(ckpt_dir, 2);
    dir->lock();
  }
  pg->barrier()->wait();  // the folder exists before the others look into it
  int first_epoch = 0;
  std::int64_t step = 0;
  if (args.resume) {
    parallel::CheckpointDir reader(ckpt_dir, 2);
    const TensorMap model_state = model->state_dict(), opt_state = opt.state_dict();
    parallel::CheckpointExpect expect;
    expect.global_batch = kGlobalBatch;
    expect.model = &model_state;
    expect.optimizer = &opt_state;
    std::vector<parallel::SkippedCheckpoint> skipped;
    if (auto found = reader.load_newest(expect, &skipped)) {
      const auto& s = found->second.state;
      model->load_state_dict(s.model);
      opt.load_state_dict(s.optimizer);
      schedule.load_state_dict(s.scheduler);
      first_epoch = static_cast<int>(s.epoch);
      step = s.step;
      if (rank == 0) std::printf("resumed from %s (epoch %d, step %lld)\n", found->first.c_str(), first_epoch,
                                 static_cast<long long>(step));
    } else if (rank == 0) {
      std::printf("no checkpoint in %s: starting fresh\n", ckpt_dir.c_str());
    }
  }

  FILE* metrics = nullptr;
  if (rank == 0) {
    metrics = std::fopen((args.out + "/metrics.jsonl").c_str(), args.resume ? "a" : "w");
    if (!metrics) throw IoError("cannot write " + args.out + "/metrics.jsonl");
  }

  // ---- THE TRAINING LOOP ----
  for (int epoch = first_epoch; epoch < args.epochs; ++epoch) {
    sampler->set_epoch(epoch);  // a new shuffle each epoch, the same on every rank
    double loss_sum = 0;
    for (samplers::Batch& b : loader) {
      opt.zero_grad();
      Tensor logits = model->forward<WideAndDeep>(signal_of(b.x), meta_of(b.x));
      Tensor loss = cross_entropy(logits, b.y);
      loss.backward();  // DDP averages the gradients over the ranks here
      nn::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      schedule.step();
      loss_sum += loss.item();
      ++step;
    }
    const double train_loss = parallel::all_reduce_scalar(loss_sum / steps_per_epoch, ReduceOp::Avg);
    const Validation v = validate(*model, val_loader, val_set->size(), rank, world);
    if (rank == 0) {
      std::printf("epoch %d: train loss %.4f, validation loss %.4f, accuracy %.4f, lr %.6f\n", epoch + 1, train_loss,
                  v.loss, v.accuracy, schedule.get_last_lr()[0]);
      std::fprintf(metrics,
                   "{\"epoch\":%d,\"step\":%lld,\"train_loss\":%.6f,\"val_loss\":%.6f,\"val_accuracy\":%.6f,"
                   "\"lr\":%.8f,\"world_size\":%d}\n",
                   epoch + 1, static_cast<long long>(step), train_loss, v.loss, v.accuracy,
                   schedule.get_last_lr()[0], world);
      std::fflush(metrics);
      parallel::CheckpointState s;
      s.model = model->state_dict();
      s.optimizer = opt.state_dict();
      s.scheduler = schedule.state_dict();
      s.step = step;
      s.epoch = epoch + 1;  // the epoch to run next
      s.global_batch = kGlobalBatch;
      dir->save(s);
    }
    if (epoch + 1 == args.stop_after) {
      if (rank == 0) std::printf("stopped after epoch %d as asked: rerun with --resume\n", epoch + 1);
      if (metrics) std::fclose(metrics);
      parallel::destroy_process_group();
      return 0;
    }
  }
  // ---- END OF THE TRAINING LOOP ----

  if (rank == 0) {
    std::fclose(metrics);
    save_npz(args.out + "/weights.npz", model->state_dict());
    std::printf("saved %s/weights.npz\n", args.out.c_str());
  }
  parallel::destroy_process_group();
  return 0;
}

// custom_loop --compare A.npz B.npz [--rtol R]: every tensor of A within R (relative to the
// largest magnitude of that tensor) of B's, and the same names.
int compare(const std::string& a, const std::string& b, double rtol) {
  const TensorMap x = load_npz(a), y = load_npz(b);
  double worst = 0;
  for (const auto& [name, t] : x) {
    if (!y.contains(name)) throw ValueError(b + " has no tensor " + name);
    const auto u = t.to_vector<float>(), v = y.at(name).to_vector<float>();
    if (u.size() != v.size()) throw ValueError(name + " differs in size between the files");
    double scale = 1e-30, diff = 0;
    for (std::size_t i = 0; i < u.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(u[i])));
      diff = std::max(diff, static_cast<double>(std::fabs(u[i] - v[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  if (x.size() != y.size()) throw ValueError(a + " and " + b + " hold different numbers of tensors");
  std::printf("largest relative difference %.3g (allowed %.3g): %s\n", worst, rtol, worst <= rtol ? "ok" : "TOO LARGE");
  return worst <= rtol ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool more = i + 1 < argc;
      if (a == "--epochs" && more) args.epochs = std::atoi(argv[++i]);
      else if (a == "--stop-after-epoch" && more) args.stop_after = std::atoi(argv[++i]);
      else if (a == "--out" && more) args.out = argv[++i];
      else if (a == "--resume") args.resume = true;
      else if (a == "--compare" && i + 2 < argc) {
        const double rtol = i + 4 < argc && std::string(argv[i + 3]) == "--rtol" ? std::atof(argv[i + 4]) : 1e-6;
        return compare(argv[i + 1], argv[i + 2], rtol);
      } else {
        std::fprintf(stderr,
                     "usage: custom_loop [--epochs N] [--out DIR] [--resume] [--stop-after-epoch K]\n"
                     "       custom_loop --compare A.npz B.npz [--rtol R]\n");
        return 2;
      }
    }
    if (args.epochs < 1) throw ConfigError("--epochs must be at least 1");
    return train(args);
  } catch (const std::exception& e) {  // one line, never an abort
    std::fprintf(stderr, "custom_loop: %s\n", e.what());
    return 1;
  }
}
