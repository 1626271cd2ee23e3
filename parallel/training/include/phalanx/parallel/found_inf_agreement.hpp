#pragma once
// optim::GradScaler's agreement over a process group: the found-inf flag of every rank's
// unscale_ is reduced with one allreduce(MAX) of a single float, so every rank skips the same
// steps and backs off to the same scale, and the replicas never diverge.
//
//   auto pg = parallel::init_process_group();
//   parallel::DDP ddp(model, pg);
//   optim::GradScaler scaler({}, parallel::found_inf_agreement(pg));
//
// DDP's averaging spreads an inf to every rank, but a comm hook that does not reduce every
// gradient, or gradients that are not reduced at all, can leave one rank alone with it (and
// under ZeRO, whose step is collective, ranks that disagree would hang). One small
// collective per step settles it. Every rank of the group must call the
// scaler's unscale_/step at the same point of its step (they are collectives then). The
// flag's tensor is allocated here, once, on `device`.
//
// Uneven inputs (parallel::Join): a rank that has joined must shadow these allreduces too,
// or the ranks still training meet Join's "still training" count with them and hang. Make
// the agreement an object and give it to the Join after the DDP:
//
//   auto agree = std::make_shared<parallel::ScalerAgreement>(pg);
//   optim::GradScaler scaler({}, parallel::found_inf_agreement(agree));
//   parallel::Join join({&ddp, agree.get()});
#include <memory>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/tensor.hpp"
#include "phalanx/optim/grad_scaler.hpp"
#include "phalanx/parallel/join.hpp"

namespace phalanx::parallel {

/// The found-inf agreement as a Joinable. `optimizers`: how many optimizers the scaler
/// unscales per step (one allreduce each), which a joined rank shadows per iteration.
class ScalerAgreement final : public Joinable {
 public:
  /// Over `pg` (nullptr: the default group), the flag on local_device() (CUDA for NCCL).
  explicit ScalerAgreement(ProcessGroupPtr pg = nullptr, int optimizers = 1);
  ScalerAgreement(ProcessGroupPtr pg, Device device, int optimizers = 1);

  /// Collective: true when any rank's `found_inf` is true. Throws ValueError when it is
  /// the first joinable of a Join (it has no forward to say "still training": list the
  /// DDP first).
  bool operator()(bool found_inf);

  /// A joined rank: one allreduce of 0 per optimizer.
  void join_main_hook() override;
  Device join_device() const override { return device_; }
  ProcessGroup& join_process_group() override { return *pg_; }

 private:
  ProcessGroupPtr pg_;
  Device device_;
  int optimizers_;
  Tensor flag_;  // one tensor for the agreement's lifetime: a step fills, reduces and reads it
};

/// Over `pg` (nullptr: the default group), the flag on local_device() (CUDA for NCCL).
optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg = nullptr);
optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg, Device device);
/// The scaler's view of `agreement` (which it keeps alive); the same object goes to a Join.
optim::FoundInfAgreement found_inf_agreement(std::shared_ptr<ScalerAgreement> agreement);

}  // namespace phalanx::parallel
