#pragma once
// float32 <-> float16 array conversions for the CPU table's convert() (the fp16 comm hook, to_dtype).
// Two paths with the same bits for every input: the scalar rules of phalanx/core/half.hpp
// (float_to_fp16, fp16_to_float) and an F16C one (vcvtps2ph / vcvtph2ps, 8 lanes) whose NaN
// lanes are rewritten to what the scalar rules give. Picked at each call: F16C when the CPU has
// AVX2 + F16C, capped by PHALANX_FP16_SIMD (scalar | avx2 | avx512, the last meaning avx2: no
// AVX-512 variant); the tests compare the two.
#include <cstdint>

namespace phalanx::cpu {

/// d[i] = float_to_fp16(s[i]) for i < n.
void floats_to_fp16(const float* s, std::uint16_t* d, std::int64_t n);
/// d[i] = fp16_to_float(s[i]) for i < n.
void fp16_to_floats(const std::uint16_t* s, float* d, std::int64_t n);

}  // namespace phalanx::cpu
