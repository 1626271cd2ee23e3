#pragma once
// What the NCCL cases on the GPU share (test_cuda_nccl.cpp, test_cuda_ddp.cpp): whether the
// nccl backend can run here, and a process group on it.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <phalanx/phalanx.hpp>
#include <phalanx/backends/memory_store.hpp>

namespace phalanx::test {

/// With a CUDA device, a build that has the nccl plugin must be able to run it.
inline bool nccl_usable() {
  std::string reason;
  if (backend_available("nccl", &reason)) return true;
#if PHALANX_TEST_HAVE_NCCL
  FAIL("a CUDA device exists, but the nccl backend cannot run: " << reason);
#else
  MESSAGE("SKIPPED: this build has no nccl plugin: " << reason);
#endif
  return false;
}

/// An nccl process group: `rank` of `world`, on GPU `device` of `local_world`.
inline ProcessGroupPtr nccl_group(int rank, int world, StorePtr store, std::chrono::milliseconds timeout,
                                  int device = 0, int local_world = 1) {
  BackendConfig c;
  c.rank = rank;
  c.size = world;
  c.store = std::move(store);
  c.timeout = timeout;
  c.local_rank = device;
  c.local_world_size = local_world;
  c.device = Device::cuda(device);
  return create_process_group("nccl", c);
}

/// A world of one on GPU 0, on a fresh in-memory store.
inline ProcessGroupPtr nccl_group_of_one(std::chrono::milliseconds timeout) {
  return nccl_group(0, 1, std::make_shared<MemoryStore>(std::chrono::seconds(30)), timeout);
}

}  // namespace phalanx::test
