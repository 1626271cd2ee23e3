#pragma once
// Whether a float32 buffer holds only finite values, in one pass of integer operations
// (exponent bits all ones: inf or NaN), with no allocation. Host memory only.
#include <cstdint>

namespace phalanx {

/// True when none of p[0..n) is an infinity or a NaN. Vectorised, with the widest of
/// AVX-512, AVX2 or baseline x86-64 that the CPU has, picked at load time
/// (core/src/cpu/finite.cpp).
bool all_finite(const float* p, std::int64_t n);

/// The largest |p[i]| as a float's bit pattern (0 for n <= 0): for non-negative floats the
/// order of the patterns is the order of the values and every NaN's is above +Inf's, so one
/// integer max finds both. Same dispatch as all_finite.
std::uint32_t max_abs_bits(const float* p, std::int64_t n);

/// Multiplies p[0..n) by `factor` in place and returns whether every value was finite before
/// (the check is on the input), in one pass: PyTorch's
/// _amp_foreach_non_finite_check_and_unscale_ on one buffer (GradScaler's unscale). A factor of
/// exactly 1 leaves the values alone, as PyTorch's kernel does. No allocation; same dispatch as
/// all_finite.
bool unscale_and_check_finite(float* p, std::int64_t n, float factor);

}  // namespace phalanx
