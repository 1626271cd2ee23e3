#pragma once
// Whether a float32 buffer holds only finite values, in one pass of integer operations
// (exponent bits all ones: inf or NaN) that the compiler vectorises, with no allocation.
#include <cstdint>
#include <cstring>

namespace phalanx {

inline bool all_finite(const float* p, std::int64_t n) {
  std::uint32_t bad = 0;  // an integer OR: vectorised (a float sum may not be reordered)
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, p + i, 4);
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace phalanx
