#include "phalanx/parallel/ddp.hpp"

#include "model_sync.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/world.hpp"
#include "phalanx/parallel/init.hpp"
#include "exact_reducer.hpp"
#include "reducer.hpp"

namespace phalanx::parallel {

DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module, ProcessGroupPtr pg, DDPOptions options)
    : module_(std::move(module)),
      pg_(pg ? std::move(pg) : (require_world_initialized("DDP"), default_process_group())),
      options_(options) {
  if (!module_) throw ValueError("DDP: the module is null");
  if (!(options_.bucket_cap_mb > 0) || !(options_.first_bucket_mb > 0))
    throw ValueError("DDP: bucket sizes must be positive");
  register_module("", module_);  // same parameter names and state_dict as the plain model
  // One device for the whole model (any world size, so the error does not depend on it);
  // the model check, the broadcasts and the buckets all live there.
  const Device device = model_device(module_->named_parameters(), module_->named_buffers());
  if (options_.exact.enabled) {
    // Exact mode on every world size, one included: the fixed-point sum is what makes the
    // bits independent of the world size.
    for (auto& [n, b] : module_->named_buffers())
      throw ConfigError("DDP exact mode: the model has buffer '" + n +
                        "', which exact mode cannot make identical across world sizes; use a model "
                        "without buffers or turn exact mode off");
    const auto named = module_->named_parameters();
    if (pg_->size() > 1) {
      verify_same_model(*pg_, named, device);
      std::vector<Tensor> state;
      for (auto& [n, p] : named) state.push_back(p);
      broadcast_coalesced(*pg_, state, 0);
    }
    exact_ = std::make_unique<ExactReducer>(named, pg_, options_);
    return;
  }
  if (pg_->size() == 1) return;  // a world of one: no reducer, no hooks, no copies
  const auto named = module_->named_parameters();
  verify_same_model(*pg_, named, device);
  std::vector<Tensor> state;
  for (auto& [n, p] : named) state.push_back(p);
  for (auto& [n, b] : module_->named_buffers()) buffers_.push_back(b);
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(*pg_, state, 0);
  reducer_ = std::make_unique<Reducer>(named, pg_, options_);
}

DistributedDataParallel::~DistributedDataParallel() = default;

Tensor DistributedDataParallel::forward(const Tensor& x) {
  if (exact_) {
    Tensor out = module_->forward(x);
    if (grad_mode_enabled() && out.requires_grad()) {
      // One forward and backward is one micro-batch; the mean of its loss weighs it 1/K.
      if (x.dim() < 1 || x.size(0) != options_.exact.micro_batch)
        throw ShapeError(detail::concat("DDP exact mode: the input has ", x.dim() < 1 ? 0 : x.size(0),
                                        " samples, the micro-batch is ", options_.exact.micro_batch,
                                        "; feed exactly one micro-batch per forward (pad or drop a short last batch)"));
      exact_->arm(out);
    }
    return out;
  }
  if (!reducer_) return module_->forward(x);
  if (options_.broadcast_buffers && !buffers_.empty()) broadcast_coalesced(*pg_, buffers_, 0);
  Tensor out = module_->forward(x);
  if (grad_mode_enabled() && out.requires_grad()) reducer_->arm(out);
  return out;
}

void DistributedDataParallel::register_comm_hook(CommHookPtr hook) {
  if (exact_)
    throw ConfigError("DDP: a comm hook (" + (hook ? hook->name() : std::string("null")) +
                      ") cannot be combined with exact mode, which reduces in 64-bit fixed point "
                      "itself; drop the hook or turn exact mode off");
  if (reducer_) reducer_->set_hook(std::move(hook));
}

std::int64_t DistributedDataParallel::micro_batches_per_rank() const {
  return exact_ ? exact_->micro_batches_per_rank() : 0;
}

std::vector<std::vector<std::size_t>> DistributedDataParallel::bucket_layout() const {
  if (exact_) return exact_->layout();
  return reducer_ ? reducer_->layout() : std::vector<std::vector<std::size_t>>{};
}

double DistributedDataParallel::last_wait_seconds() const { return reducer_ ? reducer_->last_wait_seconds() : 0; }
double DistributedDataParallel::last_comm_seconds() const { return reducer_ ? reducer_->last_comm_seconds() : 0; }

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), prev_(ddp.reducer_ ? ddp.reducer_->sync() : true) {
  if (ddp_.exact_)
    throw ConfigError("DDP: no_sync() has no meaning in exact mode: each backward is one micro-batch "
                      "and the last one of the step reduces; drop no_sync() or turn exact mode off");
  if (ddp_.reducer_) ddp_.reducer_->set_sync(false);
}

DistributedDataParallel::NoSync::~NoSync() {
  if (ddp_.reducer_) ddp_.reducer_->set_sync(prev_);
}

}  // namespace phalanx::parallel
