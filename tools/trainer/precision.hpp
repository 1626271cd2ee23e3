#pragma once
// --precision (docs/trainer.md, *Precision*): fp32, bf16 (the forward and the loss under
// autocast bfloat16) or fp16 (autocast float16 with a GradScaler). The weights, their
// gradients and the optimizer stay float32 in every case (autocast's float32 masters).
#include <optional>
#include <string>

#include <phalanx/core/autocast.hpp>
#include <phalanx/core/device.hpp>
#include <phalanx/core/dtype.hpp>

namespace phalanx::trainer {

/// fp16 on the CPU, refused as PyTorch 1.13 refuses torch.autocast("cpu", dtype=torch.float16).
constexpr const char* kFp16OnCpu =
    "--precision fp16 needs a GPU: the CPU autocasts to bfloat16 only (as PyTorch 1.13's torch.autocast(\"cpu\")); "
    "use --precision bf16 on the CPU, or --device cuda";

/// The dtype --precision autocasts to (Float32: none).
inline DType precision_dtype(const std::string& precision) {
  return precision == "bf16" ? DType::BFloat16 : precision == "fp16" ? DType::Float16 : DType::Float32;
}

/// The autocast region of one forward (and its loss) or one evaluation, on the training
/// device: nothing under fp32. Leaving it empties the cast cache, so the next forward casts
/// the weights the optimizer has just stepped.
class PrecisionScope {
 public:
  PrecisionScope(DType dtype, Device dev) {
    if (dtype != DType::Float32) guard_.emplace(dev.type, dtype);
  }

 private:
  std::optional<autocast> guard_;
};

}  // namespace phalanx::trainer
