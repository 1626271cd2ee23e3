#pragma once
// Host staging for backends that read and write host memory (Gloo, MPI, shared memory): a
// CPU tensor is used in place (zero-copy); a tensor of another device (CUDA, sim) is staged
// through a host buffer — copied in before the operation, copied back after it — as
// PyTorch's Gloo backend does for CUDA tensors.
#include <cstring>

#include "phalanx/core/kernels.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx::staging {

/// `t` itself when it is on the CPU; else a host buffer like it, holding t's values when
/// `copy_in` (an input), uninitialised otherwise (an output only).
inline Tensor host_of(const Tensor& t, bool copy_in = true) {
  if (t.device().is_cpu()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  if (copy_in) kernels_for(t.device()).copy_to_host(h.raw_data(), t.raw_data(), t.nbytes());
  return h;
}

/// Copies `nbytes` of host memory at `src` into `dst` at byte `offset`, whatever dst's device.
inline void write_back(const Tensor& dst, std::size_t offset, const void* src, std::size_t nbytes) {
  char* d = static_cast<char*>(dst.raw_data()) + offset;
  if (dst.device().is_cpu())
    std::memcpy(d, src, nbytes);
  else
    kernels_for(dst.device()).copy_from_host(d, src, nbytes);
}

/// Copies the first `nbytes` of `src` (any device) into host memory at `dst`.
inline void read_into(void* dst, const Tensor& src, std::size_t nbytes) {
  if (src.device().is_cpu())
    std::memcpy(dst, src.raw_data(), nbytes);
  else
    kernels_for(src.device()).copy_to_host(dst, src.raw_data(), nbytes);
}

/// The staged result back into `t` (nothing to do when `host` is t itself).
inline void copy_back(const Tensor& host, const Tensor& t) {
  if (!host.is_same(t)) write_back(t, 0, host.raw_data(), t.nbytes());
}

}  // namespace phalanx::staging
