#pragma once
// Elementwise sums of 16-bit float arrays: the reductions of the collectives (the shm, Gloo and
// MPI plugins) when float16 or bfloat16 travels on the wire. Each element is widened to float32,
// the sources added in their order (((s0 + s1) + s2) + ...) in float32 and the sum rounded once
// to nearest even by half.hpp's float_to_fp16 / float_to_bf16 (NaN: sign | 0x7E00 / 0x7FC0;
// float16 overflow: inf). A NaN source makes the running sum that NaN (the later NaN wins: the
// sign a float16 NaN result keeps), as the plugins' old loops did. AVX2 + F16C code where the
// CPU has both, the scalar rules otherwise; PHALANX_FP16_SIMD / PHALANX_BF16_SIMD = scalar (read
// at each call) forces the scalar code. The two give the same bits for every input
// (tests/core/test_half_sum.cpp).
#include <cstddef>
#include <cstdint>

namespace phalanx {

/// dst, dst2 and each src[q] point to n 16-bit patterns (any alignment). For i < n:
///   dst[i] = float_to_fp16(fp16_to_float(src[0][i]) + ... + fp16_to_float(src[nsrc-1][i])),
/// and the same into dst2 when it is not null (dst may be null too). A destination may be one of
/// the sources (the same pointer); other overlaps are not allowed. nsrc >= 1 (a ValueError else).
void fp16_sum(void* dst, void* dst2, const void* const* src, int nsrc, std::size_t n);

/// fp16_sum's bfloat16 twin: bf16_to_float, float32 adds in source order, float_to_bf16.
void bf16_sum(void* dst, void* dst2, const void* const* src, int nsrc, std::size_t n);

}  // namespace phalanx
