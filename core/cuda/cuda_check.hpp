#pragma once
// Every CUDA runtime and cuBLAS call's status is checked; a failure becomes a CudaError
// naming the call, the file:line and CUDA's own message.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "phalanx/core/error.hpp"

namespace phalanx::cuda {

class CudaError : public Error {
  using Error::Error;
};

[[noreturn]] inline void throw_cuda(const char* call, cudaError_t e, const char* file, int line) {
  (void)cudaGetLastError();  // reported here: a later launch check on this thread must not see it again
  throw CudaError(detail::concat(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(e), " (",
                                 cudaGetErrorString(e), ")"));
}
[[noreturn]] inline void throw_cublas(const char* call, cublasStatus_t s, const char* file, int line) {
  throw CudaError(detail::concat(call, " failed at ", file, ":", line, ": cuBLAS status ", static_cast<int>(s)));
}

}  // namespace phalanx::cuda

#define PHALANX_CUDA_CHECK(call)                                                   \
  do {                                                                             \
    const cudaError_t phx_e_ = (call);                                             \
    if (phx_e_ != cudaSuccess) ::phalanx::cuda::throw_cuda(#call, phx_e_, __FILE__, __LINE__); \
  } while (0)

#define PHALANX_CUBLAS_CHECK(call)                                                 \
  do {                                                                             \
    const cublasStatus_t phx_s_ = (call);                                          \
    if (phx_s_ != CUBLAS_STATUS_SUCCESS) ::phalanx::cuda::throw_cublas(#call, phx_s_, __FILE__, __LINE__); \
  } while (0)
