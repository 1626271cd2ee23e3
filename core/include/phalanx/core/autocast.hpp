#pragma once
// Automatic mixed precision with torch.autocast's meaning (docs/mixed_precision.md).
//
//   {
//     phalanx::autocast guard(DType::BFloat16);   // torch.autocast("cpu", dtype=torch.bfloat16)
//     Tensor loss = cross_entropy(model.forward(x), y);
//   }
//   loss.backward();  // parameters stay float32 and receive float32 gradients
//
// Inside the scope, ops on PyTorch's lower-precision list (linear, matmul, conv2d,
// scaled_dot_product_attention) cast their floating inputs to the scope's dtype and run in it;
// ops on PyTorch's fp32 list (on the CPU: cross_entropy, mse_loss) cast 16-bit inputs up to
// float32; every other op runs in its inputs' dtype with PyTorch's type promotion. A float32
// leaf that requires grad (a parameter) is cast once and the cast is reused until the
// outermost scope exits (PyTorch's cast cache). The casts are differentiable: gradients
// reach the float32 parameters as float32.
#include <cstddef>
#include <cstdint>

#include "phalanx/core/device.hpp"
#include "phalanx/core/dtype.hpp"

namespace phalanx {

/// RAII scope; thread-local and nestable (the inner scope wins until it exits, then the
/// outer one's settings return). `enabled = false` turns autocast off inside an enabled
/// scope, as `torch.autocast(..., enabled=False)`. CPU: BFloat16 only (as PyTorch 1.13);
/// CUDA: Float16 or BFloat16. Another dtype is a ValueError.
class autocast {
 public:
  explicit autocast(DType dtype = DType::BFloat16, bool enabled = true, DeviceType device = DeviceType::CPU,
                    bool cache_enabled = true);
  autocast(DeviceType device, DType dtype, bool enabled = true, bool cache_enabled = true);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

  /// Whether autocast is on for `device` on this thread.
  static bool is_enabled(DeviceType device = DeviceType::CPU);
  /// The lower-precision dtype for `device` (BFloat16 on the CPU, Float16 on CUDA by default).
  static DType dtype(DeviceType device = DeviceType::CPU);
  /// Weights held by this thread's cast cache (emptied when the outermost scope exits).
  static std::size_t cache_size();
  /// Casts autocast has made on this thread (cache hits are not casts): counts a weight
  /// cast once per forward.
  static std::uint64_t cast_count();
  /// Empties this thread's cast cache (torch.clear_autocast_cache).
  static void clear_cache();

 private:
  DeviceType device_;
  bool prev_enabled_, prev_cache_;
  DType prev_dtype_;
};

}  // namespace phalanx
