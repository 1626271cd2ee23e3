#include "phalanx/parallel/ddp.hpp"

#include "phalanx/parallel/internal/model_sync.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/ops.hpp"
#include "phalanx/core/timeline.hpp"
#include "phalanx/core/world.hpp"
#include "phalanx/parallel/init.hpp"
#include "grad_reducer.hpp"

namespace phalanx::parallel {

DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module, ProcessGroupPtr pg, DDPOptions options)
    : module_(std::move(module)),
      pg_(pg ? std::move(pg) : (require_world_initialized("DDP"), default_process_group())),
      options_(options) {
  if (!module_) throw ValueError("DDP: the module is null");
  if (!(options_.bucket_cap_mb() > 0) || !(options_.first_bucket_mb() > 0))
    throw ValueError("DDP: bucket sizes must be positive");
  register_module("", module_);  // same parameter names and state_dict as the plain model
  // One device for the whole model (any world size, so the error does not depend on it);
  // the model check, the broadcasts and the buckets all live there.
  const Device device = model_device(module_->named_parameters(), module_->named_buffers());
  device_ = device;
  {  // modules whose forward issues collectives (SyncBatchNorm): a joined rank shadows them
    std::vector<nn::Module*> stack{module_.get()};
    while (!stack.empty()) {
      nn::Module* m = stack.back();
      stack.pop_back();
      if (dynamic_cast<ForwardCollectives*>(m)) forward_collective_modules_.push_back(m);
      for (auto& [n, c] : m->named_children()) stack.push_back(c.get());
    }
  }
  reducer_ = make_grad_reducer(*module_, pg_, options_, [&](bool with_buffers) {
    const auto named = module_->named_parameters();
    verify_same_model(*pg_, named, device);
    std::vector<Tensor> state;
    for (auto& [n, p] : named) state.push_back(p);
    if (with_buffers)
      for (auto& [n, b] : module_->named_buffers()) buffers_.push_back(b);
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    broadcast_coalesced(*pg_, state, 0);
  });
}

DistributedDataParallel::~DistributedDataParallel() = default;

Tensor DistributedDataParallel::forward(const Tensor& x) { return forward<nn::Module>(x); }

void DistributedDataParallel::wrong_module_type(const std::string& wanted) const {
  const nn::Module& wrapped = *module_;  // typeid of a plain reference: no side effect to warn about
  const std::string have = short_type_name(typeid(wrapped));
  throw ValueError("DDP forward<" + wanted + "> / module<" + wanted + ">: the wrapped module is " + have +
                   ", not " + wanted + "; use forward<" + have + ">(...) and module<" + have + ">(), or wrap a " +
                   wanted);
}

void DistributedDataParallel::abandon_forward() {
  notified_.reset();
  flags_work_.reset();
}

void DistributedDataParallel::before_forward(const Tensor* first, bool single) {
  notified_.reset();
  flags_work_.reset();
  forward_samples_ = first != nullptr && first->defined() && first->dim() >= 1 ? first->size(0) : -1;
  if (reducer_ && grad_mode_enabled()) reducer_->before_forward();
  const bool join = join_config().enable;
  if (join && reducer_) reducer_->check_join();
  if (!reducer_ && !join) return;
  if (join) {
    // As PyTorch's forward under Join: "still training" (Join's count), the buffers from the
    // highest rank still training, then what the joined ranks must shadow in this iteration.
    several_inputs_ = !single;
    if (single) {
      last_input_shape_ = first->shape();
      last_input_dtype_ = first->dtype();
    }
    has_input_ = single && first->dim() >= 1;
    notified_ = Join::notify_join_context(*this);
  }
  if (reducer_ && options_.broadcast_buffers() && !buffers_.empty())
    broadcast_coalesced(*pg_, buffers_, join ? find_common_rank(*pg_, device_, true) : 0);
  if (join) {
    const bool grad = grad_mode_enabled();
    flags_work_ = pg_->allreduce(
        tensor(std::vector<float>{grad && (!reducer_ || reducer_->sync()) ? 1.f : 0.f, grad ? 1.f : 0.f,
                                  forward_collectives() ? 1.f : 0.f},
               {3})
            .to(device_),
        ReduceOp::Sum);
  }
}

Tensor DistributedDataParallel::after_forward(const Tensor& out) {
  if (reducer_ && grad_mode_enabled() && out.requires_grad()) {
    reducer_->check_forward(forward_samples_);
    reducer_->arm(out);
  }
  WorkPtr notified = std::move(notified_), flags_work = std::move(flags_work_);
  if (notified) notified->wait();
  if (flags_work) flags_work->wait();
  return out;
}

bool DistributedDataParallel::forward_collectives() const {
  for (nn::Module* m : forward_collective_modules_)
    if (dynamic_cast<ForwardCollectives*>(m)->has_forward_collectives()) return true;
  return false;
}

void DistributedDataParallel::join_main_hook() {
  if (reducer_) reducer_->check_join();
  if (reducer_ && options_.broadcast_buffers() && !buffers_.empty())
    broadcast_coalesced(*pg_, buffers_, find_common_rank(*pg_, device_, false));
  Tensor flags = zeros({3}, DType::Float32, device_);
  pg_->allreduce(flags, ReduceOp::Sum)->synchronize();  // read on the host
  const std::vector<float> f = flags.to(Device::cpu()).to_vector<float>();
  const bool sync = f[0] > 0, grad = f[1] > 0, forward = f[2] > 0;
  if (forward) {
    // Collectives inside the forward (SyncBatchNorm) and its backward: run the model on an
    // empty batch, so they (and the gradient buckets, zeros) go out in the others' order.
    if (several_inputs_)
      throw ConfigError("DDP under Join: this rank's last forward took several inputs (forward<M>(...)), so it "
                        "cannot shadow the collectives in the others' forward (SyncBatchNorm) with an empty batch; "
                        "give every rank the same number of batches, or use a model without forward collectives");
    if (!has_input_)
      throw ConfigError("DDP under Join: this rank joined before its first forward, so it cannot shadow the "
                        "collectives in the others' forward (SyncBatchNorm); give every rank at least one batch");
    Shape s = last_input_shape_;
    s[0] = 0;
    const Tensor empty = Tensor::empty(s, last_input_dtype_, device_);
    const bool prev_grad = grad_mode_enabled();
    const bool prev_sync = reducer_ ? reducer_->sync() : true;
    set_grad_mode(grad);
    if (reducer_) reducer_->set_sync(sync);
    try {
      module_->zero_grad(true);  // this rank's gradients are zeros: nothing stale joins the sum
      Tensor out = module_->forward(empty);
      if (grad && out.requires_grad()) {
        if (reducer_ && sync) reducer_->arm(out);
        sum(out).backward();
      }
    } catch (...) {
      set_grad_mode(prev_grad);
      if (reducer_) reducer_->set_sync(prev_sync);
      throw;
    }
    set_grad_mode(prev_grad);
    if (reducer_) reducer_->set_sync(prev_sync);
  } else if (sync && reducer_) {
    reducer_->shadow_pass();
  }
}

void DistributedDataParallel::join_post_hook(bool is_last_joiner) {
  if (pg_->size() == 1) return;
  // Every rank ends with the model of the last rank to join (PyTorch's _sync_final_model).
  const int root = find_common_rank(*pg_, device_, is_last_joiner);
  std::vector<Tensor> state = module_->parameters();
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(*pg_, state, root);
}

void DistributedDataParallel::register_comm_hook(CommHookPtr hook) {
  if (!reducer_) return;
  reducer_->check_comm_hook(hook);
  reducer_->set_hook(std::move(hook));
}

std::int64_t DistributedDataParallel::micro_batches_per_rank() const {
  return reducer_ ? reducer_->micro_batches_per_rank() : 0;
}

std::vector<std::vector<std::size_t>> DistributedDataParallel::bucket_layout() const {
  return reducer_ ? reducer_->layout() : std::vector<std::vector<std::size_t>>{};
}

double DistributedDataParallel::last_wait_seconds() const { return reducer_ ? reducer_->last_wait_seconds() : 0; }
double DistributedDataParallel::last_comm_seconds() const { return reducer_ ? reducer_->last_comm_seconds() : 0; }

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), prev_(ddp.reducer_ ? ddp.reducer_->sync() : true) {
  if (!ddp_.reducer_) return;
  ddp_.reducer_->check_no_sync();
  ddp_.reducer_->set_sync(false);
}

DistributedDataParallel::NoSync::~NoSync() {
  if (ddp_.reducer_) ddp_.reducer_->set_sync(prev_);
}

}  // namespace phalanx::parallel
