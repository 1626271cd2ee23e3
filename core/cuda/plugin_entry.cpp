// The CUDA device plugin's entry point: a probe (is there a device and a driver?) and a
// create() that registers the kernel table for DeviceType::CUDA.
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_kernels.hpp"
#include "phalanx/core/plugin_abi.h"

namespace {

int probe(char* reason, size_t len) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::snprintf(reason, len, "no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    return 0;
  }
  if (count == 0) {
    std::snprintf(reason, len, "no CUDA device (the driver sees none)");
    return 0;
  }
  return 1;
}

void* create(const void*, char* error, size_t len) {
  try {
    phalanx::register_device_kernels(phalanx::DeviceType::CUDA, &phalanx::cuda::table());
    return &phalanx::cuda::table();
  } catch (const std::exception& e) {
    std::snprintf(error, len, "%s", e.what());
    return nullptr;
  }
}

const phalanx_plugin_descriptor kDescriptor = {
    PHALANX_PLUGIN_ABI_VERSION, "cuda", "device", "CUDA tensors: caching allocator, kernels, cuBLAS", &probe, &create,
    nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const phalanx_plugin_descriptor* phalanx_plugin_entry(void) {
  return &kDescriptor;
}
