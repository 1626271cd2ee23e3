#include "phalanx/parallel/found_inf_agreement.hpp"

#include <memory>

#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/timeline.hpp"
#include "phalanx/parallel/init.hpp"

namespace phalanx::parallel {

ScalerAgreement::ScalerAgreement(ProcessGroupPtr pg, int optimizers)
    : ScalerAgreement(std::move(pg), local_device(), optimizers) {}

ScalerAgreement::ScalerAgreement(ProcessGroupPtr pg, Device device, int optimizers)
    : pg_(pg ? std::move(pg) : default_process_group()),
      device_(device),
      optimizers_(optimizers),
      flag_(zeros({1}, DType::Float32, device)) {
  if (optimizers < 1)
    throw ValueError(detail::concat("ScalerAgreement: optimizers must be >= 1 (one allreduce per unscale_), got ",
                                    optimizers));
}

bool ScalerAgreement::operator()(bool found_inf) {
  if (pg_->size() == 1) return found_inf;
  if (join_config().enable && join_config().is_first_joinable)
    throw ValueError("ScalerAgreement is the first joinable of a Join: it cannot carry the \"still training\" "
                     "flag; list the DDP first: Join({&ddp, agreement.get()})");
  const timeline::Span span("grad scaler found-inf allreduce", "comm");
  flag_.fill_(found_inf ? 1.0 : 0.0);
  pg_->allreduce(flag_, ReduceOp::Max)->synchronize();  // read on the host: its failure too
  return flag_.item() != 0.f;
}

void ScalerAgreement::join_main_hook() {
  for (int i = 0; i < optimizers_; ++i) {
    flag_.zero_();
    pg_->allreduce(flag_, ReduceOp::Max)->wait();
  }
}

optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg) {
  return found_inf_agreement(std::move(pg), local_device());
}

optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg, Device device) {
  return found_inf_agreement(std::make_shared<ScalerAgreement>(std::move(pg), device));
}

optim::FoundInfAgreement found_inf_agreement(std::shared_ptr<ScalerAgreement> agreement) {
  if (!agreement) throw ValueError("found_inf_agreement: the agreement is null; make one with std::make_shared<ScalerAgreement>(pg)");
  return [a = std::move(agreement)](bool found_inf) { return (*a)(found_inf); };
}

}  // namespace phalanx::parallel
