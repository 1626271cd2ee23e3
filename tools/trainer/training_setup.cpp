// phalanx-train's set-up, before any training (training_setup.hpp).
#include "training_setup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <phalanx/core/half.hpp>
#include <phalanx/core/nn/gpt.hpp>

#include "precision.hpp"
#include "text_format.hpp"

namespace phalanx::trainer {

namespace {

Schedule make_schedule(const TrainConfig& c, optim::Optimizer& opt, double scale, std::int64_t total_steps) {
  Schedule s;
  std::shared_ptr<optim::LRScheduler> warmup, main;
  if (c.warmup_steps > 0) warmup = std::make_shared<optim::LinearLR>(opt, 1.0 / std::max(2.0, scale), 1.0, c.warmup_steps);
  if (c.lr_schedule == "cosine") {
    main = std::make_shared<optim::CosineAnnealingLR>(opt, std::max<std::int64_t>(1, total_steps - c.warmup_steps));
  } else if (c.lr_schedule == "step") {
    if (c.lr_step_size < 1) throw ValueError("--lr-schedule step needs --lr-step-size N (N >= 1 steps)");
    main = std::make_shared<optim::StepLR>(opt, c.lr_step_size, c.lr_gamma);
  } else if (c.lr_schedule == "multistep") {
    if (c.lr_milestones.empty()) throw ValueError("--lr-schedule multistep needs --lr-milestones S1,S2,...");
    // Milestones are global step numbers; after a warmup the schedule counts from its end.
    std::vector<std::int64_t> at;
    for (auto m : c.lr_milestones) at.push_back(std::max<std::int64_t>(0, m - c.warmup_steps));
    main = std::make_shared<optim::MultiStepLR>(opt, at, c.lr_gamma);
  } else if (c.lr_schedule != "constant") {
    throw ValueError("--lr-schedule '" + c.lr_schedule + "' is unknown (constant, cosine, step or multistep)");
  }
  if (warmup && main)
    s.sequence = std::make_unique<optim::SequentialLR>(opt, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, main},
                                                       std::vector<std::int64_t>{c.warmup_steps});
  else
    s.single = warmup ? warmup : main;
  return s;
}

// The settings a resume must keep: a change would silently train another trajectory. Those
// that may change are left out (docs/checkpoints.md): --epochs (unless the cosine schedule's
// length depends on it), output paths, --checkpoint-every, --keep-checkpoints, --init.
std::map<std::string, std::string> resume_settings(const TrainConfig& c, double lr, const std::string& model) {
  std::map<std::string, std::string> m{
      {"model", model},
      {"activation", c.activation},
      {"optimizer", c.optimizer},
      {"lr", fmt_exact(lr)},
      {"momentum", fmt_exact(c.momentum)},
      {"weight-decay", fmt_exact(c.weight_decay)},
      {"nesterov", c.nesterov ? "on" : "off"},
      {"lr-schedule", c.lr_schedule},
      {"warmup-steps", std::to_string(c.warmup_steps)},
      {"lr-step-size", std::to_string(c.lr_step_size)},
      {"lr-milestones", c.lr_milestones.empty() ? "none" : widths_str(c.lr_milestones)},
      {"lr-gamma", fmt_exact(c.lr_gamma)},
      {"seed", std::to_string(c.seed)},
      {"shuffle", c.shuffle ? "on" : "off"},
      {"drop-last", c.drop_last ? "on" : "off"},
  };
  if (c.lr_schedule == "cosine") m["epochs"] = std::to_string(c.epochs);  // the cosine's length
  // Absent at their defaults: checkpoints of older runs still match.
  if (c.is_gpt()) {
    m["stride"] = std::to_string(c.stride);
    m["dropout"] = fmt_exact(c.dropout);
  }
  if (c.clip_grad_norm > 0) m["clip-grad-norm"] = fmt_exact(c.clip_grad_norm);
  if (c.beta1 != 0.9 || c.beta2 != 0.999) m["betas"] = fmt_exact(c.beta1) + "," + fmt_exact(c.beta2);
  if (c.sync_bn) m["sync-bn"] = "on";  // absent when off: checkpoints of older runs still match
  return m;
}

// --save/--plot are written after training: their folder must take a file before it starts.
void check_writable(const char* option, const std::string& path) {
  if (path.empty() || ::access(path.c_str(), W_OK) == 0) return;
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw IoError(std::string(option) + " " + path + ": the folder " + dir + " does not exist; create it first");
  if (::access(dir.c_str(), W_OK) != 0)
    throw IoError(std::string(option) + " " + path + ": the folder " + dir + " is not writable");
  if (::access(path.c_str(), F_OK) == 0)
    throw IoError(std::string(option) + " " + path + ": the file exists and is not writable");
}

nn::GPTConfig gpt_config(const GptSpec& g, double dropout) {
  return nn::GPTConfig()
      .n_layer(g.layers)
      .n_head(g.heads)
      .n_embd(g.width)
      .block_size(g.context)
      .vocab_size(256)
      .dropout(static_cast<float>(dropout))
      .bias(true);
}

// --init: a GPT's weights by nanoGPT's names. Its position table must cover the context
// (a checkpoint of a model with a shorter one cannot run windows of this length).
void load_init(nn::Module& net, const TrainConfig& c) {
  TensorMap m = load_npz(c.init);
  if (!c.is_gpt()) return net.load_state_dict(m);
  m = nanogpt_weights(m, net.state_dict());
  if (c.is_gpt())
    if (const Tensor* wpe = m.find("transformer.wpe.weight"); wpe && wpe->dim() == 2 && wpe->shape()[0] < c.gpt_context)
      throw DataUsageError(detail::concat("--init ", c.init, ": transformer.wpe.weight has ", wpe->shape()[0],
                                          " positions, fewer than --model ", c.model_text, "'s context ",
                                          c.gpt_context, "; use a context of at most ", wpe->shape()[0]));
  try {
    net.load_state_dict(m);
  } catch (const Error& e) {
    throw DataUsageError("--init " + c.init + ": " + e.what());
  }
}

// The sampler and the loader of the training data.
void set_up_loader(TrainingSetup& s) {
  // The step plan's split: each rank a shard of every global batch, or (exact mode) its
  // micro-batches of every global batch; the loader yields one pass's batch at a time.
  s.sampler = s.step->make_sampler(s.n);
  samplers::DataLoaderOptions lo = s.step->loader_options();
  // No prefetch thread: the data is in memory (or mapped), and a batch's gather is a few
  // row copies, cheaper than handing it over between threads. A thread per worker would also
  // compete with the workers for the cores (with 2 workers on 2 cores it cost ~40 us a step:
  // docs/benchmarks.md).
  lo.prefetch(0);
  s.loader = std::make_unique<samplers::DataLoader>(s.data.training(), lo, s.sampler);
  s.steps_per_epoch = s.step->steps_per_epoch(*s.loader);
}

// --precision on the training device, checked before the data is loaded (a usage error, exit
// 2): fp16 is refused on the CPU (PyTorch 1.13's CPU autocast is bfloat16 only), the sim device
// has no autocast, and on another device one tiny product under autocast shows whether its kernels take the dtype
// (the CUDA plugin has no 16-bit GEMM yet: refused here in one line, not at the first step).
void check_precision(const TrainConfig& c, Device dev) {
  if (c.precision == "fp32") return;
  if (c.precision == "fp16" && dev.is_cpu()) throw DataUsageError(kFp16OnCpu);
  if (dev.type == DeviceType::Sim)
    throw DataUsageError("--precision " + c.precision + " needs " +
                         (c.precision == "fp16" ? "--device cuda" : "--device cpu or cuda") + ": autocast has no " +
                         dev.str() + " device");
  if (dev.is_cpu()) {
    // bf16 on the CPU: the bf16 GEMM (or its float32 fallback) always runs, but a
    // PHALANX_BF16_GEMM this CPU cannot honour is refused here, not at the first step.
    try {
      (void)bf16_gemm_info();
    } catch (const Error& e) {
      throw DataUsageError(e.what());
    }
    return;
  }
  try {
    PrecisionScope scope(precision_dtype(c.precision), dev);
    NoGradGuard no_grad;
    const Tensor a = ones({2, 2}).to(dev);
    (void)linear(a, a, Tensor());
  } catch (const Error& e) {
    throw DataUsageError("--precision " + c.precision + " cannot run on " + dev.str() + " (" + e.what() +
                         "): use --precision fp32 there, or --precision bf16 with --device cpu");
  }
}

// What the ranks must agree on about the precision. Exact mode under bf16 keeps its bits only
// when every rank's bf16 GEMM sums in the same order (docs/mixed_precision.md): the path
// (amx, avx512bf16, fallback) is compared too, so a mixed job is refused before it trains.
std::string precision_consistency(const TrainConfig& c, Device dev) {
  if (!(c.exact && c.precision == "bf16" && dev.is_cpu())) return c.precision;
  const std::string info = bf16_gemm_info();
  return c.precision + " with the bf16 GEMM path " + info.substr(0, info.find_first_of(" :")) +
         " (exact mode: set PHALANX_BF16_GEMM to one path on every rank)";
}

}  // namespace

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const std::vector<Tensor>& ps, double lr,
                                                 const std::vector<Tensor>* no_decay) {
  if (c.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(
        ps, optim::SGDOptions(lr).momentum(c.momentum).weight_decay(c.weight_decay).nesterov(c.nesterov));
  }
  if (c.optimizer == "adam")
    return std::make_unique<optim::Adam>(
        ps, optim::AdamOptions(lr).weight_decay(c.weight_decay).betas(c.beta1, c.beta2));
  const auto options = optim::AdamWOptions(lr).weight_decay(c.weight_decay).betas(c.beta1, c.beta2);
  if (!no_decay) return std::make_unique<optim::AdamW>(ps, options);
  const auto groups = decay_param_groups(ps, *no_decay);
  auto opt = std::make_unique<optim::AdamW>(groups.front().params, options);
  for (const auto& [k, v] : groups.front().overrides) opt->param_groups()[0].options[k] = v;
  for (std::size_t g = 1; g < groups.size(); ++g) opt->add_param_group(groups[g].params, groups[g].overrides);
  return opt;
}

std::vector<parallel::ZeroGroup> decay_param_groups(const std::vector<Tensor>& ps, const std::vector<Tensor>& no_decay) {
  // nanoGPT's configure_optimizers: group 0 decays (the Linear weights), group 1 does not
  // (biases, LayerNorms, embeddings), in the order of `ps`; one group when either is empty.
  std::vector<Tensor> decay, keep;
  for (const Tensor& p : ps) {
    const bool exempt = std::any_of(no_decay.begin(), no_decay.end(), [&](const Tensor& t) { return t.is_same(p); });
    (exempt ? keep : decay).push_back(p);
  }
  std::vector<parallel::ZeroGroup> groups;
  if (!decay.empty()) groups.push_back({std::move(decay), {}});
  if (!keep.empty()) groups.push_back({std::move(keep), {{"weight_decay", 0.0}}});
  return groups;
}

TrainingSetup set_up_training(const TrainConfig& c) {
  TrainingSetup s;
  s.seed = c.seed;
  // The device is decided by init (--device; "cuda" = each worker on GPU LOCAL_RANK), which
  // loads its plugin, or says why it cannot, before the rendezvous.
  parallel::InitOptions io;
  io.backend = c.backend;
  io.device = c.device;
  s.pg = parallel::init_process_group(io);
  auto& pg = s.pg;
  s.dev = parallel::local_device();
  s.world = pg->size();
  s.rank = pg->rank();
  const int world = s.world, rank = s.rank;
  check_precision(c, s.dev);
  s.data = load_data(c);
  const Datasets& data = s.data;
  // The model as text: the MLP's widths, the CNN's spec with its classes ("cnn:32-64:10"),
  // or the GPT's ("gpt:4-4-128:128").
  const CnnSpec cnn_spec{c.cnn_channels, data.classes};
  const GptSpec gpt_spec{c.gpt_layers, c.gpt_heads, c.gpt_width, c.gpt_context};
  s.model_desc = c.is_gpt()   ? gpt_spec_str(gpt_spec)
                 : c.is_cnn() ? cnn_spec_str(cnn_spec, data.classes)
                              : widths_str(c.model);
  const std::string& model_desc = s.model_desc;
  if (c.is_cnn()) cnn_feature_shape(cnn_spec, data.input, c.model_text);  // the images survive the pooling
  s.n = data.training()->size();
  const std::int64_t n = s.n;
  // How a step runs; exact mode's check (the world size divides the micro-batches of a step)
  // comes before the linear scaling's, W dividing B, which follows from it.
  s.step = make_step_plan(c, world);

  optim::ScalingOptions so;
  so.global_batch = c.global_batch;
  so.world_size = world;
  so.base_lr = c.base_lr.value_or(*c.lr);
  so.base_batch = c.base_batch.value_or(c.global_batch);
  s.plan = optim::linear_scaling(so);  // throws when W does not divide B
  const optim::ScalingPlan& plan = s.plan;
  if (!(std::isfinite(plan.lr) && plan.lr > 0))
    throw ValueError("--base-lr " + fmt_exact(so.base_lr) + " scaled by --global-batch " + std::to_string(c.global_batch) +
                     " / --base-batch " + std::to_string(so.base_batch) + " gives the rate " + fmt_exact(plan.lr) +
                     ", which is not a finite number > 0: lower --base-lr");
  if (rank == 0) {
    check_writable("--save", c.save);
    check_writable("--plot", c.plot);
  }
  if (c.drop_last && n < c.global_batch)
    throw ValueError(detail::concat("--drop-last with a global batch of ", c.global_batch, " and only ", n,
                                    " samples leaves no step to take"));

  // Settings that must agree across ranks, compared before the model is built
  // and broadcast (a different --model would otherwise fail there, or hang).
  parallel::check_consistent({{"global batch", std::to_string(c.global_batch)},
                              {"model", model_desc + " " + c.activation + (c.sync_bn ? " sync-bn" : "") + (c.zero ? " zero" : "") +
                                            (c.init.empty() ? "" : " init " + c.init) +
                                            (c.is_gpt() ? " stride " + std::to_string(c.stride) + " dropout " + fmt_g(c.dropout)
                                                        : std::string()) +
                                            (c.clip_grad_norm > 0 ? " clip " + fmt_g(c.clip_grad_norm) : std::string())},
                              {"optimizer", c.optimizer + " lr " + fmt_g(plan.lr) + " betas " + fmt_g(c.beta1) + "," +
                                                fmt_g(c.beta2) + " momentum " + fmt_g(c.momentum) +
                                                " weight decay " + fmt_g(c.weight_decay) + (c.nesterov ? " nesterov" : "")},
                              {"lr schedule", c.lr_schedule + " warmup " + std::to_string(c.warmup_steps) + " step size " +
                                                  std::to_string(c.lr_step_size) + " milestones " + widths_str(c.lr_milestones) +
                                                  " gamma " + fmt_g(c.lr_gamma)},
                              {"epochs", std::to_string(c.epochs)},
                              {"seed", std::to_string(c.seed)},
                              {"shuffle", c.shuffle ? "on" : "off"},
                              {"drop last", c.drop_last ? "on" : "off"},
                              {"precision", precision_consistency(c, s.dev)},
                              {"exact", c.exact ? "micro-batch " + std::to_string(c.micro_batch) : "off"},
                              {"checkpoint every", std::to_string(c.checkpoint_every)},
                              // Every rank with a folder (each node its own path) or none: the
                              // resume's checkpoint sharing is a collective of the ranks that have one.
                              {"checkpoint dir", c.checkpoint_dir.empty() ? "none" : "given"},
                              {"resume", c.resume_from.empty() ? (c.resume ? "latest" : "no") : c.resume_from}},
                             pg);

  Generator gen(c.seed);
  std::shared_ptr<nn::Module>& net = s.net;
  if (c.is_gpt()) {
    // Each rank its own dropout masks, reproducible from the seed and the rank: PCG stream
    // `rank` of state `seed` (docs/gpt.md); a resumed run re-derives it (resume.cpp).
    s.dropout_gen = std::make_unique<Generator>();
    s.dropout_gen->seed_pcg(c.seed, static_cast<std::uint64_t>(rank));
    auto gpt = std::make_shared<nn::GPT>(gpt_config(gpt_spec, c.dropout), &gen, s.dropout_gen.get());
    if (c.optimizer == "adamw") s.no_decay = nn::decay_groups(*gpt).no_decay;
    net = gpt;
  } else if (c.is_cnn()) {
    net = build_cnn(cnn_spec, data.input, data.classes, c.activation, &gen);
  } else {
    net = nn::mlp(c.model, c.activation, &gen);
  }
  if (!c.init.empty()) load_init(*net, c);
  // --sync-bn: every BatchNorm becomes a SyncBatchNorm over the group (the same names, weights
  // and buffers), whose training statistics are those of the global batch.
  if (c.sync_bn) net = parallel::convert_sync_batchnorm(net, pg);
  net->to(s.dev);
  s.model = std::make_shared<parallel::DDP>(net, pg, s.step->ddp_options());
  auto& model = s.model;
  // --zero: each rank keeps the optimizer state of its shard of the parameters only
  // (ZeroRedundancyOptimizer over the same optimizer); the weights stay replicated.
  const std::vector<Tensor>* no_decay = s.no_decay.empty() ? nullptr : &s.no_decay;
  if (c.zero) {
    // A GPT under adamw: nanoGPT's two groups, partitioned group by group as PyTorch's ZeRO.
    auto groups = no_decay ? decay_param_groups(model->parameters(), *no_decay)
                           : std::vector<parallel::ZeroGroup>{{model->parameters(), {}}};
    auto z = std::make_unique<parallel::ZeroRedundancyOptimizer>(
        std::move(groups), [&](std::vector<Tensor> shard) { return make_optimizer(c, shard, plan.lr); }, pg);
    s.zero = z.get();
    s.opt = std::move(z);
  } else {
    s.opt = make_optimizer(c, model->parameters(), plan.lr, no_decay);
  }
  // fp16: dynamic loss scaling with PyTorch's defaults, one skip decision for every rank.
  if (c.precision == "fp16")
    s.scaler =
        std::make_unique<optim::GradScaler>(optim::GradScalerOptions(), parallel::found_inf_agreement(pg, s.dev));
  set_up_loader(s);
  s.schedule = make_schedule(c, *s.opt, plan.scale, s.steps_per_epoch * c.epochs);
  s.settings = resume_settings(c, plan.lr, model_desc);
  return s;
}

}  // namespace phalanx::trainer
