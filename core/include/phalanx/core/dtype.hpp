#pragma once
#include <cstddef>
#include <cstdint>

namespace phalanx {

/// Element types. float32 for values and gradients, int64 for labels and indices.
/// Float16 and BFloat16: the ops of ops.hpp take them (not the raw batch_norm_* pieces) (computing in float32 and rounding the result
/// once to nearest even; mixed with float32 they promote to float32), autograd carries them,
/// and autocast (autocast.hpp) produces them; they are also gradient compression's wire types.
/// Bool (one byte, 0 or 1) holds masks (masked_fill, attention): created with zeros/ones/full,
/// tril/triu, permuted, concatenated, saved (npy '|b1'), broadcast and gathered; not reduced.
enum class DType : std::uint8_t { Float32, Int64, Float16, BFloat16, Bool };

constexpr std::size_t element_size(DType t) {
  return t == DType::Float32 ? 4 : t == DType::Int64 ? 8 : t == DType::Bool ? 1 : 2;
}
const char* dtype_name(DType t);

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };

}  // namespace phalanx
