#pragma once
// The CPU's bfloat16 GEMM (DeviceKernels::gemm_bf16) and its vectorised conversions.
// Three paths, picked at each call (see bf16_gemm_info() in phalanx/core/half.hpp):
//  - amx: tdpbf16ps on 32 x 32 blocks of four 16 x 16 float32 tiles, A and B packed once
//    per call (A row-major padded to 32, B in 16-column slabs of bf16 pairs);
//  - avx512bf16: vdpbf16ps over 8 x 32 register blocks (16 zmm accumulators) on packed
//    bf16 pairs: B in 32-column slabs, A in 8-row panels, both packed once per call, as
//    small_gemm packs its float32 slabs;
//  - fallback (no AVX512_BF16, or PHALANX_BF16_GEMM=fallback): convert A and B to float32,
//    run the float32 GEMM (OpenBLAS or small_gemm, as gemm() picks), round at the store.
// auto takes the first this CPU has. PHALANX_BF16_GEMM=auto|amx|avx512bf16|fallback forces
// one (strict: anything else is a ConfigError; a path the CPU lacks is one too).
#include <cstdint>

namespace phalanx::cpu {

/// Whether this CPU (and OS) runs AVX-512F and AVX512_BF16 code.
bool has_avx512_bf16();

/// Whether this CPU has AMX-BF16 and Linux gave this process its tiles (asked once).
bool has_amx_bf16();

enum class Bf16Path { Amx, Avx512Bf16, Fallback };
/// The path the next bf16 GEMM takes (reads PHALANX_BF16_GEMM; may warn once: fallback).
Bf16Path bf16_gemm_path();

void bf16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta,
               void* c, std::int64_t ldc, bool c_bf16);

/// d[i] = PyTorch's tensor conversion of s[i] (half.hpp's float_to_bf16_convert), vectorised.
void floats_to_bf16(const float* s, std::uint16_t* d, std::int64_t n);
/// d[i] = s[i] widened (exact), vectorised.
void bf16_to_floats(const std::uint16_t* s, float* d, std::int64_t n);

}  // namespace phalanx::cpu
