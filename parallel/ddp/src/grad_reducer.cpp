#include "grad_reducer.hpp"

#include "exact_reducer.hpp"
#include "phalanx/core/env.hpp"
#include "reducer.hpp"

namespace phalanx::parallel {

void GradReducer::detach_grad_hooks() noexcept {
  for (std::size_t p = 0; p < hook_ids_.size(); ++p) {
    hooked_[p].remove_grad_accumulated_hook(hook_ids_[p]);
    hooked_[p].set_grad_destination(Tensor());
  }
  hook_ids_.clear();
  hooked_.clear();
}

BucketLayout bucket_layout(const std::vector<Tensor>& params, const DDPOptions& o) {
  const auto cap_bytes = [&](std::size_t bucket) {
    return static_cast<std::int64_t>((bucket == 0 ? o.first_bucket_mb() : o.bucket_cap_mb()) * 1024 * 1024);
  };
  BucketLayout layout(1);
  std::int64_t bytes = 0;
  for (std::size_t p = params.size(); p-- > 0;) {
    layout.back().push_back(p);
    bytes += params[p].numel() * 4;
    if (bytes >= cap_bytes(layout.size() - 1) && p > 0) {
      layout.emplace_back();
      bytes = 0;
    }
  }
  if (layout.back().empty()) layout.pop_back();
  return layout;
}

std::unique_ptr<GradReducer> make_grad_reducer(const nn::Module& module, const ProcessGroupPtr& pg,
                                               const DDPOptions& o, const std::function<void(bool)>& share) {
  if (o.exact().enabled) {
    // Exact mode on every world size, one included: the fixed-point sum is what makes the
    // bits independent of the world size.
    for (auto& [n, b] : module.named_buffers())
      throw ConfigError("DDP exact mode: the model has buffer '" + n +
                        "', which exact mode cannot make identical across world sizes; use a model "
                        "without buffers or turn exact mode off");
    if (pg->size() > 1) share(false);
    return std::make_unique<ExactReducer>(module.named_parameters(), pg, o);
  }
  // A world of one: no reducer, no hooks, no copies. PHALANX_TEST_REDUCER_AT_ONE=1 (tests
  // only) builds the bucketed reducer anyway, so one GPU can run buckets, the step flag and
  // the comm hooks over NCCL (scripts/gpu-check.sh, "nccl reducer").
  if (pg->size() == 1 && !env::flag("PHALANX_TEST_REDUCER_AT_ONE", false)) return nullptr;
  if (pg->size() > 1) share(true);
  return std::make_unique<Reducer>(module.named_parameters(), pg, o);
}

}  // namespace phalanx::parallel
