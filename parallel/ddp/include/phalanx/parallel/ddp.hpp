#pragma once
// DistributedDataParallel: the textbook's second change. Wrap the model; from then on
// backward leaves in every parameter's .grad() the mean gradient over all ranks, so every
// rank applies the same update.
//
//   auto pg = parallel::init_process_group();
//   auto model = std::make_shared<parallel::DistributedDataParallel>(nn::mlp({64, 32, 10}));
//   ... loss = cross_entropy((*model)(x), y); loss.backward(); opt.step(); ...
//
// Semantics are PyTorch's (docs/ddp.md): parameters are checked across ranks and broadcast
// from rank 0 at construction; gradients are bucketed in reverse registration order (first
// bucket 1 MiB, then bucket_cap_mb); each bucket's reduction starts from the autograd hook
// as soon as its last gradient is ready, except the last bucket, launched at the end of
// backward (it carries the pass flag that makes a pass abandoned on one rank fail on all);
// the end of backward waits for every bucket.
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/nn/module.hpp"
#include "phalanx/core/timeline.hpp"
#include "phalanx/core/type_name.hpp"
#include "phalanx/parallel/comm_hook.hpp"
#include "phalanx/parallel/ddp_options.hpp"
#include "phalanx/parallel/join.hpp"

namespace phalanx::parallel {

class GradReducer;

class DistributedDataParallel : public nn::Module, public Joinable {
 public:
  /// Throws ConfigError on every rank when the models differ across ranks.
  explicit DistributedDataParallel(nn::ModulePtr module, ProcessGroupPtr pg = nullptr, DDPOptions options = {});
  ~DistributedDataParallel() override;

  Tensor forward(const Tensor& x) override;
  /// Any argument list: the wrapped module's own forward(args...) (several inputs, say),
  /// with everything forward(const Tensor&) does around it (buffer broadcast, Join,
  /// find_unused_parameters, exact mode's checks). The wrapped module must be an M
  /// (ValueError naming both types otherwise):
  ///   Tensor out = ddp->forward<TwoTower>(image, text);
  /// Exact mode counts the samples of the first tensor argument. Under Join, a forward of
  /// several inputs cannot be shadowed with an empty batch: a model with forward collectives
  /// (SyncBatchNorm) then refuses on the joined rank (ConfigError). M::forward must return
  /// one Tensor (the output DDP walks for find_unused_parameters); a module with several
  /// outputs returns them through one tensor, or runs its heads outside DDP's forward.
  template <typename M, typename... Args>
  Tensor forward(Args&&... args) {
    static_assert(std::is_convertible_v<decltype(std::declval<M&>().forward(std::forward<Args>(args)...)), Tensor>,
                  "DDP::forward<M>(args...): M::forward(args...) must return a Tensor");
    M* m = dynamic_cast<M*>(module_.get());
    if (m == nullptr) wrong_module_type(short_type_name<M>());
    const timeline::Span span("forward", "ddp");  // the buffers' broadcast and Join's messages included
    const Tensor* first = first_tensor(args...);
    before_forward(first, sizeof...(Args) == 1 && first != nullptr);
    try {
      return after_forward(m->forward(std::forward<Args>(args)...));
    } catch (...) {
      abandon_forward();
      throw;
    }
  }
  std::string describe() const override { return "DistributedDataParallel"; }

  nn::Module& module() { return *module_; }
  const nn::Module& module() const { return *module_; }
  /// The wrapped module as the M it is (ValueError naming both types otherwise), e.g. to call
  /// its own forward outside DDP in a validation pass: ddp->module<TwoTower>().forward(a, b).
  template <typename M>
  M& module() {
    M* m = dynamic_cast<M*>(module_.get());
    if (m == nullptr) wrong_module_type(short_type_name<M>());
    return *m;
  }  const nn::ModulePtr& module_ptr() const { return module_; }
  ProcessGroup& process_group() { return *pg_; }
  const ProcessGroup& process_group() const { return *pg_; }
  const DDPOptions& options() const { return options_; }

  /// Replaces the communication hook (before the first backward).
  void register_comm_hook(CommHookPtr hook);

  /// RAII: backward passes inside accumulate gradients locally without communication;
  /// the first backward after it reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  NoSync no_sync() { return NoSync(*this); }

  /// Exact mode: micro-batches this rank runs per optimizer step (global/micro/world);
  /// 0 when exact mode is off.
  std::int64_t micro_batches_per_rank() const;

  /// Bucket layout, for inspection and tests: parameter indices per bucket.
  std::vector<std::vector<std::size_t>> bucket_layout() const;
  /// Seconds the end of the last backward spent waiting for communication, and the total
  /// communication time of that backward (launch to completion): their ratio tells how much
  /// of the communication was hidden behind backward.
  double last_wait_seconds() const;
  double last_comm_seconds() const;

  // Join (join.hpp, docs/ddp.md "Join"): a joined rank shadows each iteration of the others
  // (buffer broadcast, gradient buckets with zeros, and, when the model has modules with
  // collectives in forward such as SyncBatchNorm in training, a forward and backward on an
  // empty batch shaped like this rank's last input); the post hook broadcasts the model
  // from the last rank to join.
  void join_main_hook() override;
  void join_post_hook(bool is_last_joiner) override;
  Device join_device() const override { return device_; }
  ProcessGroup& join_process_group() override { return *pg_; }

 private:
  // The two halves of every forward, around the module's call. before_forward: whether the
  // reducer can take Join, Join's messages, the buffers' broadcast; `first` is the first
  // tensor argument (nullptr: none), `single` whether it is the only argument (Join's shadow
  // forward then runs on an empty batch shaped like it). after_forward: the reducer's check of
  // the forward (exact mode's micro-batch size), arms the reducer on `out`
  // (find_unused_parameters walks the graph from it), waits for Join's messages.
  void before_forward(const Tensor* first, bool single);
  Tensor after_forward(const Tensor& out);
  void abandon_forward();  // the module's forward threw: drop what before_forward started
  [[noreturn]] void wrong_module_type(const std::string& wanted) const;
  static const Tensor* first_tensor() { return nullptr; }
  template <typename A, typename... Rest>
  static const Tensor* first_tensor(const A& a, const Rest&... rest) {
    if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) return &a;
    else return first_tensor(rest...);
  }
  bool forward_collectives() const;
  nn::ModulePtr module_;
  ProcessGroupPtr pg_;
  DDPOptions options_;
  std::vector<Tensor> buffers_;  // the module's buffers, listed once (broadcast each forward)
  // The bucketed reducer, or exact mode's (docs/exact.md); none in a world of one without
  // exact mode (a pass-through).
  std::unique_ptr<GradReducer> reducer_;
  Device device_;                           // the model's (one device)
  std::vector<nn::Module*> forward_collective_modules_;  // ForwardCollectives in the tree
  Shape last_input_shape_;                  // under Join: the joined rank's empty batch
  DType last_input_dtype_ = DType::Float32;
  bool has_input_ = false;
  bool several_inputs_ = false;             // under Join: the last forward took several (no shadow shape)
  // Between before_forward and after_forward.
  WorkPtr notified_, flags_work_;
  std::int64_t forward_samples_ = -1;       // the first tensor argument's size(0), -1: none
};

using DDP = DistributedDataParallel;

}  // namespace phalanx::parallel
