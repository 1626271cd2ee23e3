// phalanx-train's training run. The loop is in one place, between the markers.
#include "trainer.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include <phalanx/core/kernels.hpp>
#include <phalanx/phalanx.hpp>

#include "evaluation.hpp"
#include "progress_bar.hpp"
#include "svg_chart.hpp"
#include "trainer_data.hpp"

namespace phalanx::trainer {

namespace {

using Clock = std::chrono::steady_clock;
using samplers::Batch;
using samplers::DataLoader;
using samplers::DistributedSampler;
using samplers::TensorDataset;

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const std::vector<Tensor>& ps, double lr) {
  if (c.optimizer == "sgd") {
    optim::SGDOptions o{lr, c.momentum, 0.0, c.weight_decay, c.nesterov};
    return std::make_unique<optim::SGD>(ps, o);
  }
  optim::AdamOptions o;
  o.lr = lr;
  o.weight_decay = c.weight_decay;
  if (c.optimizer == "adam") return std::make_unique<optim::Adam>(ps, o);
  return std::make_unique<optim::AdamW>(ps, o);
}

}  // namespace

int run_training(const TrainConfig& c) {
  // ---- set-up: every check happens before training starts ----
  // --device cuda: each worker on GPU LOCAL_RANK (checked before anything else starts).
  Device dev = Device::parse(c.device);
  if (!dev.is_cpu()) {
    const char* lr = std::getenv("LOCAL_RANK");
    if (c.device == "cuda" && lr) dev = Device::cuda(std::atoi(lr));
    kernels_for(dev);  // loads the CUDA plugin, or says why it cannot
  }
  parallel::InitOptions io;
  io.backend = c.backend;
  io.device = c.device;
  auto pg = parallel::init_process_group(io);
  const int world = pg->size(), rank = pg->rank();
  const Datasets data = load_data(c);
  const std::int64_t n = data.train->size();

  optim::ScalingOptions so;
  so.global_batch = c.global_batch;
  so.world_size = world;
  so.base_lr = c.base_lr.value_or(*c.lr);
  so.base_batch = c.base_batch.value_or(c.global_batch);
  const optim::ScalingPlan plan = optim::linear_scaling(so);  // throws when W does not divide B
  if (c.drop_last && n < c.global_batch)
    throw ValueError(detail::concat("--drop-last with a global batch of ", c.global_batch, " and only ", n,
                                    " samples leaves no step to take"));

  Generator gen(c.seed);
  auto net = nn::mlp(c.model, c.activation, &gen);
  if (!c.init.empty()) net->load_state_dict(load_npz(c.init));
  net->to(dev);
  auto model = std::make_shared<parallel::DDP>(net, pg);
  auto opt = make_optimizer(c, model->parameters(), plan.lr);
  samplers::DistributedSamplerOptions dso;
  dso.shuffle = c.shuffle;
  dso.seed = c.seed;
  dso.drop_last = c.drop_last;
  auto sampler = std::make_shared<DistributedSampler>(n, dso);
  samplers::DataLoaderOptions lo{plan.per_rank_batch};
  lo.drop_last = c.drop_last;
  lo.prefetch = 2;
  DataLoader loader(data.train, lo, sampler);
  const std::int64_t steps_per_epoch = loader.num_batches();
  std::unique_ptr<optim::LinearLR> warmup;
  if (c.warmup_steps > 0) warmup = std::make_unique<optim::LinearLR>(*opt, 1.0 / std::max(2.0, plan.scale), 1.0, c.warmup_steps);

  // ---- resume ----
  std::int64_t step = 0, start_epoch = 0, skip_batches = 0;
  const std::string ckpt = c.checkpoint_dir.empty() ? "" : c.checkpoint_dir + "/checkpoint.npz";
  if (!c.checkpoint_dir.empty() && rank == 0) ::mkdir(c.checkpoint_dir.c_str(), 0755);
  if (c.resume) {
    if (::access(ckpt.c_str(), R_OK) != 0) throw IoError("--resume: no checkpoint at " + ckpt);
    const TensorMap state = load_npz(ckpt);
    TensorMap model_state, opt_state;
    for (const auto& [k, v] : state) {
      if (k.rfind("model.", 0) == 0) model_state.set(k.substr(6), v);
      if (k.rfind("optim.", 0) == 0) opt_state.set(k.substr(6), v);
    }
    net->load_state_dict(model_state);
    step = state.at("meta.step").item_int();
    start_epoch = step / steps_per_epoch;
    skip_batches = step % steps_per_epoch;
    if (state.at("meta.world_size").item_int() != world || state.at("meta.global_batch").item_int() != c.global_batch)
      throw ConfigError("--resume: the checkpoint was written with another world size or global batch; resume with the same ones");
    for (std::int64_t i = 0; i < step && warmup; ++i) warmup->step();  // the schedule is deterministic
    opt->load_state_dict(opt_state);  // after the schedule: the saved rate wins
  }
  auto save_checkpoint = [&] {
    if (rank != 0 || ckpt.empty()) return;
    TensorMap s;
    for (const auto& [k, v] : net->state_dict()) s.set("model." + k, v);
    for (const auto& [k, v] : opt->state_dict()) s.set("optim." + k, v);
    s.set("meta.step", tensor(std::vector<std::int64_t>{step}, {}));
    s.set("meta.world_size", tensor(std::vector<std::int64_t>{world}, {}));
    s.set("meta.global_batch", tensor(std::vector<std::int64_t>{c.global_batch}, {}));
    save_npz(ckpt, s);  // atomic: a temporary file renamed into place
  };

  std::ofstream metrics;
  if (rank == 0 && !c.metrics.empty()) {
    metrics.open(c.metrics, c.resume ? std::ios::app : std::ios::trunc);
    if (!metrics) throw IoError("--metrics " + c.metrics + ": cannot write");
  }
  ProgressBar progress(rank == 0 && ::isatty(1), c.epochs, steps_per_epoch, c.global_batch);
  if (rank == 0)
    std::printf("phalanx-train: %lld samples, model %s, %s, %d worker(s) on %s; %s\n", static_cast<long long>(n),
                [&] { std::string s; for (auto w : c.model) s += (s.empty() ? "" : "-") + std::to_string(w); return s; }().c_str(),
                c.optimizer.c_str(), world, pg->backend_name().c_str(), plan.describe().c_str());

  tools::Series train_curve{"train loss", {}, {}}, test_curve{"test loss", {}, {}};
  const auto t0 = Clock::now();
  double last_epoch_loss = std::nan("");
  double test_acc = -1;

  // ---- TRAINING LOOP ----
  for (std::int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    sampler->set_epoch(epoch);
    model->train();
    Tensor stats = zeros({2});
    std::int64_t batch_index = 0;
    progress.start_epoch(epoch, skip_batches);
    for (Batch& b : loader) {
      if (batch_index++ < skip_batches) continue;  // resuming mid-epoch: already trained on these
      opt->zero_grad();
      Tensor loss = cross_entropy(model->forward(b.x.to(dev)), b.y.to(dev));
      loss.backward();
      opt->step();
      if (warmup) warmup->step();
      ++step;
      const float l = loss.item();
      stats.data<float>()[0] += l;
      stats.data<float>()[1] += 1;
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      if (metrics.is_open())
        metrics << nlohmann::json{{"step", step}, {"epoch", epoch}, {"loss", l},
                                  {"lr", opt->param_groups()[0].lr()}, {"seconds", secs}}.dump() << "\n";
      progress.update(batch_index, l);
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0) save_checkpoint();
    }
    skip_batches = 0;
    stats = sum_over_ranks(stats, *pg, dev);
    last_epoch_loss = stats.data<float>()[0] / std::max(1.f, stats.data<float>()[1]);
    nlohmann::json rec{{"epoch", epoch}, {"train_loss", last_epoch_loss}};
    train_curve.x.push_back(static_cast<double>(epoch + 1));
    train_curve.y.push_back(last_epoch_loss);
    if (data.test) {
      model->eval();
      const auto [tl, ta] = evaluate(*model, data.test, *pg);
      rec["test_loss"] = tl;
      rec["test_acc"] = ta;
      test_acc = ta;
      test_curve.x.push_back(static_cast<double>(epoch + 1));
      test_curve.y.push_back(tl);
    }
    if (metrics.is_open()) metrics << rec.dump() << "\n";
    if (rank == 0) {
      progress.end_epoch();
      std::printf("epoch %lld: train loss %.4f", static_cast<long long>(epoch + 1), last_epoch_loss);
      if (data.test) std::printf(", test loss %.4f, test accuracy %.4f", rec["test_loss"].get<double>(), test_acc);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (c.checkpoint_every == 0) save_checkpoint();
  }
  // ---- END TRAINING LOOP ----
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  double final_loss = last_epoch_loss;
  if (c.eval_train) {
    model->eval();
    final_loss = evaluate(*model, data.train, *pg).first;
    if (rank == 0) std::printf("final mean loss over the training set: %.6f\n", final_loss);
    if (metrics.is_open()) metrics << nlohmann::json{{"eval_train_loss", final_loss}}.dump() << "\n";
  }
  if (rank == 0 && !c.save.empty()) save_npz(c.save, net->state_dict());
  if (rank == 0 && !c.plot.empty()) {
    std::vector<tools::Series> series{train_curve};
    if (!test_curve.x.empty()) series.push_back(test_curve);
    tools::ChartOptions co;
    co.title = "phalanx-train";
    tools::write_svg(c.plot, series, co);
  }
  if (rank == 0) {
    nlohmann::json summary{{"final_train_loss", final_loss}, {"steps", step}, {"seconds", seconds},
                           {"world_size", world}, {"backend", pg->backend_name()}};
    if (test_acc >= 0) summary["test_acc"] = test_acc;
    std::printf("%s\n", summary.dump().c_str());
  }
  parallel::destroy_process_group();
  return 0;
}

}  // namespace phalanx::trainer
