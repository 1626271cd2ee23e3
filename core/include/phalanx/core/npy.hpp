#pragma once
// NumPy .npy and .npz files. Reads float32/float64 (as float32) and int64/int32/uint8
// (as int64), C order; writes float32 and int64. .npz archives are NumPy's zip (stored or
// deflated), so `np.savez("w.npz", **{k: v.numpy() for k, v in sd.items()})` loads here.
#include <string>

#include "phalanx/core/tensor.hpp"
#include "phalanx/core/tensor_map.hpp"

namespace phalanx {

Tensor load_npy(const std::string& path);
void save_npy(const std::string& path, const Tensor& t);
/// Decodes an in-memory .npy image; `what` names it in errors.
Tensor parse_npy(const void* bytes, std::size_t size, const std::string& what);
std::string serialize_npy(const Tensor& t);

TensorMap load_npz(const std::string& path);
/// Writes atomically (a temporary file renamed into place).
void save_npz(const std::string& path, const TensorMap& tensors);

}  // namespace phalanx
