// The NCCL plugin's entry point. The probe says "unavailable" (with the reason) when there is
// no CUDA device or driver, so `auto` falls back to Gloo and an explicit `nccl` gets a clear
// BackendUnavailableError.
#include <cuda_runtime.h>

#include <cstdio>

#include "nccl_process_group.hpp"
#include "phalanx/backends/plugin_abi.h"

namespace {

int probe(char* reason, size_t len) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::snprintf(reason, len, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees none");
    return 0;
  }
  return 1;
}

void* create(const void* config, char*, size_t) {
  return static_cast<phalanx::Backend*>(
      new phalanx::nccl_backend::NcclBackend(*static_cast<const phalanx::BackendConfig*>(config)));
}
void destroy(void* backend) { delete static_cast<phalanx::Backend*>(backend); }

const phalanx_plugin_descriptor kDescriptor = {
    PHALANX_PLUGIN_ABI_VERSION, "nccl", "comm", "NCCL (CUDA tensors)", &probe, &create, &destroy};

}  // namespace

extern "C" __attribute__((visibility("default"))) const phalanx_plugin_descriptor* phalanx_plugin_entry(void) {
  return &kDescriptor;
}
