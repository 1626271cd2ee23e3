#pragma once
// optim::GradScaler's agreement over a process group: the found-inf flag of every rank's
// unscale_ is reduced with one allreduce(MAX) of a single float, so every rank skips the same
// steps and backs off to the same scale, and the replicas never diverge.
//
//   auto pg = parallel::init_process_group();
//   parallel::DDP ddp(model, pg);
//   optim::GradScaler scaler({}, parallel::found_inf_agreement(pg));
//
// DDP's averaging usually spreads an inf to every rank, but not always: exact mode's
// fixed-point sums, compression hooks, ZeRO-sharded optimizers and gradients that are not
// reduced can leave one rank alone with it. One small collective per step settles it.
// Every rank of the group must call the scaler's unscale_/step at the same point of its step
// (they are collectives then). The flag's tensor is allocated here, once, on `device`.
#include "phalanx/backends/process_group.hpp"
#include "phalanx/optim/grad_scaler.hpp"

namespace phalanx::parallel {

/// Over `pg` (nullptr: the default group), the flag on local_device() (CUDA for NCCL).
optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg = nullptr);
optim::FoundInfAgreement found_inf_agreement(ProcessGroupPtr pg, Device device);

}  // namespace phalanx::parallel
