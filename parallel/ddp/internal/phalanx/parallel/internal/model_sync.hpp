#pragma once
// DDP's construction-time checks and broadcasts. Everything here runs on the model's
// device: the collectives carry tensors of that device (NCCL takes CUDA tensors only), and
// the host reads nothing but what it copies back on purpose.
#include <string>
#include <utility>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// The one device that holds every parameter and buffer (cpu for an empty model). A model
/// that spans devices throws ConfigError naming two tensors and their devices.
Device model_device(const NamedTensors& params, const NamedTensors& buffers);

/// Every rank's `mine`, by two allgathers of int64 tensors on `device` (the lengths, then
/// the bytes padded to whole words); the same list, in rank order, on every rank.
std::vector<std::string> allgather_bytes(ProcessGroup& pg, const std::string& mine, Device device);

/// Every rank's parameter names and shapes must equal rank 0's. On a mismatch every rank
/// (rank 0 included) throws the same ConfigError naming the first difference and the ranks.
/// The descriptions travel as int64 tensors on `device` (the model's).
void verify_same_model(ProcessGroup& pg, const NamedTensors& named, Device device);

/// Broadcasts the tensors (all on one device) from `root`, packed into one buffer per dtype
/// on their device (one collective per dtype; device copies in and out, no host copies).
void broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root = 0);

}  // namespace phalanx::parallel
