#include "label_check.hpp"

#include <algorithm>
#include <utility>

#include "cuda_check.hpp"

namespace phalanx::cuda {

namespace {

__global__ void label_flag_k(const long long* t, std::int64_t n, long long classes, int* flag) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)
    if (t[i] < 0 || t[i] >= classes) *flag = 1;  // every writer stores the same value
}

__global__ void label_flag_value_k(const long long* t, std::int64_t n, long long classes, float* flag, float value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)
    if (t[i] < 0 || t[i] >= classes) *flag = value;  // every writer stores the same value
}

int blocks_for_labels(std::int64_t n, int threads) {
  return static_cast<int>(std::min<std::int64_t>((n + threads - 1) / threads, 65535));
}

/// Checks chained into one slot before the host reads it (a bound on what they keep alive).
constexpr std::size_t kMaxChained = 8;

/// This thread's checks that have not been read yet: one slot, whose flag any of them raises.
struct Pending {
  LabelCheck* owner = nullptr;
  LabelCheck::Slot* slot = nullptr;
  std::vector<std::pair<Tensor, std::int64_t>> checks;  // target, classes; in launch order
  ~Pending() {
    if (slot) owner->release(slot);  // no CUDA call at thread exit; acquire() waits for its event
  }
};
thread_local Pending pending;

}  // namespace

LabelCheck::Slot* LabelCheck::acquire(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if ((*it)->device == device) {
        Slot* s = *it;
        free_.erase(it);
        // A slot released at a thread's exit may still have its kernel running.
        PHALANX_CUDA_CHECK(cudaEventSynchronize(s->done));
        return s;
      }
  }
  auto* s = new Slot;
  s->device = device;
  PHALANX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s->host), sizeof(int),
                                   cudaHostAllocMapped | cudaHostAllocPortable));
  PHALANX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s->mapped), s->host, 0));
  PHALANX_CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));  // on `device` (current)
  return s;
}

void LabelCheck::release(Slot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
}

void LabelCheck::launch(const Tensor& target, std::int64_t classes) {
  // No host wait per step: while this thread's previous check still runs, this one is chained
  // into its slot (the flag only ever goes 0 -> 1, the event is recorded again after this
  // kernel, in stream order) instead of waiting for it. A finished previous check is read now
  // (a host load, no wait); a full chain, or another device, is waited for.
  const int device = target.device().index;
  Slot* s = pending.slot;
  if (s) {
    const cudaError_t q = cudaEventQuery(s->done);
    if (q != cudaErrorNotReady || s->device != device || pending.checks.size() >= kMaxChained) {
      if (q != cudaSuccess && q != cudaErrorNotReady) (void)cudaGetLastError();  // resolve() reports it
      resolve();
      s = nullptr;
    }
  }
  const bool fresh = s == nullptr;
  if (fresh) {
    s = acquire(device);
    *static_cast<volatile int*>(s->host) = 0;  // the slot's last kernel has finished (resolve/acquire)
  }
  const std::int64_t n = target.numel();
  const int threads = 256;
  const int blocks = blocks_for_labels(n, threads);
  label_flag_k<<<blocks, threads>>>(static_cast<const long long*>(target.raw_data()), n, classes, s->mapped);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaEventRecord(s->done, 0);
  if (e != cudaSuccess) {
    if (fresh) release(s);
    throw_cuda("label check kernel", e, __FILE__, __LINE__);
  }
  pending.owner = this;
  pending.slot = s;
  pending.checks.emplace_back(target, classes);
}

void LabelCheck::flag_into(const Tensor& target, std::int64_t classes, const Tensor& flag, float value) {
  const std::int64_t n = target.numel();
  const int threads = 256;
  label_flag_value_k<<<blocks_for_labels(n, threads), threads>>>(static_cast<const long long*>(target.raw_data()), n,
                                                                 classes, static_cast<float*>(flag.raw_data()), value);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda("label check kernel (step flag)", e, __FILE__, __LINE__);
}

void LabelCheck::resolve() {
  if (!pending.slot) return;
  Slot* s = std::exchange(pending.slot, nullptr);
  const auto checks = std::move(pending.checks);
  pending.checks.clear();
  const cudaError_t e = cudaEventSynchronize(s->done);
  const bool bad = *static_cast<volatile int*>(s->host) != 0;
  release(s);
  if (e != cudaSuccess) throw_cuda("cudaEventSynchronize (label check)", e, __FILE__, __LINE__);
  if (!bad) return;
  // The error path: find the first bad label, of the first check that has one, as the CPU
  // check does.
  for (const auto& [target, classes] : checks) {
    std::vector<long long> labels(static_cast<std::size_t>(target.numel()));
    PHALANX_CUDA_CHECK(cudaSetDevice(target.device().index));
    PHALANX_CUDA_CHECK(cudaMemcpy(labels.data(), target.raw_data(), labels.size() * sizeof(long long),
                                  cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < labels.size(); ++i)
      if (labels[i] < 0 || labels[i] >= classes)
        throw ValueError(detail::concat("cross_entropy: target[", i, "] = ", labels[i],
                                        " is not a class index in [0, ", classes, ") (found on ",
                                        target.device().str(), " by the label check; reported at the next read to the host)"));
  }
  throw ValueError(detail::concat("cross_entropy: a target on ", checks.front().first.device().str(),
                                  " held a label outside [0, ", checks.front().second, ") (changed since the check)"));
}

}  // namespace phalanx::cuda
