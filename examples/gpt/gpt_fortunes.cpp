// A small GPT learns English from Debian's fortune cookies, on 2 workers, then writes some.
//
//   phalanx-run --nproc-per-node 2 build/examples/gpt_fortunes [--epochs N] [--max-steps N]
//       [--plot loss.svg] [--save gpt.npz] [--sample-chars 200]   (--epochs: 1 by default)
//
// nanoGPT's GPT (4 layers, 4 heads, width 128, context 128: 0.8 M parameters) over bytes: the
// fortune files concatenated are the tokens, the first 90 % train and the last 10 % validate
// (samplers::TextDataset). Each step every worker takes 8 windows of 128 bytes (a global batch
// of 16 x 128 tokens); AdamW with nanoGPT's groups (no decay on biases, LayerNorms and the
// embeddings), 100 warm-up steps, then a cosine to 0, gradients clipped at norm 1. Every 250
// steps (--eval-every) and at each epoch's end the validation loss (every worker its shard of
// the windows); rank 0 then draws a sample. The walk-through with the loss curve and a real run's output: examples/gpt/README.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <phalanx/core/nn/gpt.hpp>
#include <phalanx/phalanx.hpp>

#include "svg_chart.hpp"

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

constexpr std::int64_t kContext = 128, kGlobalBatch = 16;

// Mean loss per token over the validation windows, each worker its shard, summed over them.
double validation_loss(parallel::DDP& model, const std::shared_ptr<TextDataset>& val, ProcessGroup& pg) {
  NoGradGuard no_grad;
  model.eval();
  // drop_last: no window counted twice (at most world - 1 windows are left out).
  auto sampler = std::make_shared<DistributedSampler>(val->size(), DistributedSamplerOptions().shuffle(false).drop_last(true));
  DataLoader loader(val, DataLoaderOptions(kGlobalBatch), sampler);
  Tensor sums = zeros({2});
  for (Batch& b : loader) {
    const Tensor logits = model.forward(b.x);  // [B, T, 256]
    const std::int64_t n = b.y.numel();
    sums.data<float>()[0] += cross_entropy(reshape(logits, {n, 256}), reshape(b.y, {n}), Reduction::Sum).item();
    sums.data<float>()[1] += static_cast<float>(n);
  }
  pg.allreduce(sums)->wait();
  model.train();
  return sums.data<float>()[0] / sums.data<float>()[1];
}

}  // namespace

int run(int argc, char** argv) {
  int epochs = 1;  // 4 min 20 s on this 2-core machine at load 2-3 (examples/gpt/README.md)
  std::int64_t max_steps = 0, sample_chars = 200, eval_every = 250;
  std::string plot, save;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--epochs" && i + 1 < argc) epochs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--max-steps" && i + 1 < argc) max_steps = std::atoll(argv[++i]);
    else if (a == "--eval-every" && i + 1 < argc) eval_every = std::max<std::int64_t>(1, std::atoll(argv[++i]));
    else if (a == "--plot" && i + 1 < argc) plot = argv[++i];
    else if (a == "--save" && i + 1 < argc) save = argv[++i];
    else if (a == "--sample-chars" && i + 1 < argc) sample_chars = std::max<std::int64_t>(1, std::atoll(argv[++i]));
    else {
      std::fprintf(stderr, "usage: gpt_fortunes [--epochs N] [--max-steps N] [--eval-every N] [--plot F.svg] "
                           "[--save F.npz] [--sample-chars N]\n");
      return 2;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  set_num_threads(1);  // one thread a worker: the workers are the parallelism
  auto pg = parallel::init_process_group();
  const int rank = pg->rank(), world = pg->size();

  // [1] The data: the fortune files' bytes, 90 % to train, 10 % to validate.
  const TextCorpus corpus = load_text_corpus(fortune_files());
  auto train = std::make_shared<TextDataset>(corpus, TextSplit::Train, kContext);
  auto val = std::make_shared<TextDataset>(corpus, TextSplit::Validation, kContext);

  // [2] The model, the same on every worker (seeded), under DDP.
  Generator init(0);
  auto gpt = std::make_shared<nn::GPT>(
      nn::GPTConfig().n_layer(4).n_head(4).n_embd(128).block_size(kContext).vocab_size(256).bias(true), &init);
  auto model = std::make_shared<parallel::DDP>(gpt, pg);

  // [3] Each worker its share of every global batch, a new order each epoch.
  auto sampler = std::make_shared<DistributedSampler>(train->size(), DistributedSamplerOptions().seed(0).drop_last(true));
  DataLoader loader(train, DataLoaderOptions(kGlobalBatch / world).drop_last(true), sampler);
  std::int64_t total = epochs * loader.num_batches();
  if (max_steps > 0) total = std::min(total, max_steps);

  // [4] AdamW with nanoGPT's two groups; warm-up then cosine.
  const nn::DecayGroups groups = nn::decay_groups(*gpt);
  optim::AdamW opt(groups.decay, optim::AdamWOptions(2e-3).weight_decay(0.1).betas(0.9, 0.99));
  opt.add_param_group(groups.no_decay, {{"weight_decay", 0.0}});
  const std::int64_t warmup = std::min<std::int64_t>(100, total / 2);
  auto warm = std::make_shared<optim::LinearLR>(opt, 0.5, 1.0, std::max<std::int64_t>(1, warmup));
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(opt, std::max<std::int64_t>(1, total - warmup));
  optim::SequentialLR schedule(opt, {warm, cosine}, {warmup});
  if (rank == 0)
    std::printf("gpt_fortunes: %lld training windows of %lld bytes (%lld validation), %lld parameters, %d worker(s), "
                "%lld steps of %lld x %lld tokens\n",
                static_cast<long long>(train->size()), static_cast<long long>(kContext),
                static_cast<long long>(val->size()), static_cast<long long>(gpt->num_params(false)), world,
                static_cast<long long>(total), static_cast<long long>(kGlobalBatch), static_cast<long long>(kContext));

  tools::Series train_curve{"training loss (rank 0, mean of 50 steps)", {}, {}}, val_curve{"validation loss", {}, {}};
  std::int64_t step = 0;
  double window_sum = 0;
  int window_n = 0;
  // ---- TRAINING LOOP ----
  for (int epoch = 0; epoch < epochs && step < total; ++epoch) {
    sampler->set_epoch(epoch);
    for (Batch& b : loader) {  // x, y: int64 [8, 128], the targets one byte ahead
      opt.zero_grad();
      const Tensor logits = model->forward(b.x);  // [8, 128, 256]
      const std::int64_t n = b.y.numel();
      Tensor loss = cross_entropy(reshape(logits, {n, 256}), reshape(b.y, {n}));
      loss.backward();  // DDP averages the gradients over the workers
      nn::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      schedule.step();
      window_sum += loss.item();
      if (++window_n == 50) {
        train_curve.x.push_back(static_cast<double>(step + 1));
        train_curve.y.push_back(window_sum / window_n);
        window_sum = 0, window_n = 0;
      }
      if (++step == total) break;
      if (step % eval_every == 0) {
        const double v = validation_loss(*model, val, *pg);
        val_curve.x.push_back(static_cast<double>(step));
        val_curve.y.push_back(v);
        if (rank == 0) std::printf("step %lld: loss %.4f, validation loss %.4f\n", static_cast<long long>(step), loss.item(), v);
      }
    }
    const double v = validation_loss(*model, val, *pg);  // every epoch's end
    val_curve.x.push_back(static_cast<double>(step));
    val_curve.y.push_back(v);
    if (rank == 0) std::printf("epoch %d (step %lld): validation loss %.4f\n", epoch + 1, static_cast<long long>(step), v);
  }
  // ---- END TRAINING LOOP ----

  if (rank == 0) {
    if (!save.empty()) save_npz(save, gpt->state_dict());
    if (!plot.empty()) {
      tools::ChartOptions co;
      co.title = "gpt:4-4-128:128 on fortunes, 2 workers";
      co.x_label = "step";
      co.y_label = "loss (nats per byte)";
      tools::write_svg(plot, {train_curve, val_curve}, co);
    }
    // [5] A sample: a newline as the prompt, then bytes drawn from softmax(logits / 0.8).
    Tensor prompt = full({1, 1}, 10.0, DType::Int64);
    Generator g(7);
    const Tensor out = gpt->generate(prompt, sample_chars, 0.8f, 0, &g);
    std::string text;
    for (std::int64_t i = 1; i < out.numel(); ++i) text.push_back(static_cast<char>(out.data<std::int64_t>()[i]));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("---- sample (%lld bytes, temperature 0.8) ----\n%s\n---- end of sample ----\n",
                static_cast<long long>(sample_chars), text.c_str());
    std::printf("gpt_fortunes: %lld steps in %.0f s, final validation loss %.4f\n", static_cast<long long>(step), secs,
                val_curve.y.empty() ? std::nan("") : val_curve.y.back());
  }
  parallel::destroy_process_group();
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a clear one-line error, never an abort
    std::fprintf(stderr, "gpt_fortunes: %s\n", e.what());
    return 1;
  }
}
