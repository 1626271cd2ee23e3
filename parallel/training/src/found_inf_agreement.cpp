#include "phalanx/parallel/found_inf_agreement.hpp"

#include <memory>

#include "phalanx/core/creation.hpp"
#include "phalanx/core/timeline.hpp"
#include "phalanx/parallel/init.hpp"

namespace phalanx::parallel {

optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg) {
  return found_inf_agreement(std::move(pg), local_device());
}

optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg, Device device) {
  if (!pg) pg = default_process_group();
  // One tensor for the scaler's lifetime: a step fills it, reduces it and reads it back.
  auto flag = std::make_shared<Tensor>(zeros({1}, DType::Float32, device));
  return [pg = std::move(pg), flag](bool found_inf) {
    if (pg->size() == 1) return found_inf;
    const timeline::Span span("grad scaler found-inf allreduce", "comm");
    flag->fill_(found_inf ? 1.0 : 0.0);
    pg->allreduce(*flag, ReduceOp::Max)->wait();
    return flag->item() != 0.f;
  };
}

}  // namespace phalanx::parallel
