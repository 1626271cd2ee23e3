#include "cuda_allocator.hpp"

#include <algorithm>

#include "cuda_check.hpp"

namespace phalanx::cuda {

void* CachingAllocator::allocate(std::size_t nbytes, int device) {
  const std::size_t r = round(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find({device, r});
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_ -= r;
      return p;
    }
  }
  PHALANX_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, r);
  if (e == cudaErrorMemoryAllocation) {  // give the cache back and try once more
    (void)cudaGetLastError();
    release_all();  // restores the current device
    PHALANX_CUDA_CHECK(cudaSetDevice(device));
    e = cudaMalloc(&p, r);
    if (e != cudaSuccess) (void)cudaGetLastError();  // reported below, not by a later launch check
  }
  if (e != cudaSuccess)
    throw CudaError(detail::concat("cudaMalloc of ", r, " bytes on cuda:", device, " failed: ", cudaGetErrorName(e),
                                   " (", cudaGetErrorString(e), "); ", cached_bytes(), " bytes cached"));
  return p;
}

void CachingAllocator::deallocate(void* p, std::size_t nbytes, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[{device, round(nbytes)}].push_back(p);
  cached_ += round(nbytes);
}

void CachingAllocator::release_all() {
  std::lock_guard<std::mutex> lock(mu_);
  int current = -1;
  const bool known = cudaGetDevice(&current) == cudaSuccess;
  for (auto& [key, blocks] : free_) {
    if (!blocks.empty()) cudaSetDevice(key.first);  // cudaFree needs no particular device, but be safe
    for (void* p : blocks) cudaFree(p);
  }
  free_.clear();
  cached_ = 0;
  if (known) cudaSetDevice(current);  // the caller (allocate's retry) allocates on its device
  (void)cudaGetLastError();            // a failed free is not the caller's error
}

std::size_t CachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace phalanx::cuda
