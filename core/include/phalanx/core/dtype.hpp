#pragma once
#include <cstddef>
#include <cstdint>

namespace phalanx {

/// Element types. float32 for values and gradients, int64 for labels and indices.
/// Float16 and BFloat16 are storage types (gradient compression for communication):
/// they can be created, converted (half.hpp), copied and all-reduced, not computed with.
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
