#pragma once
// The CPU's bfloat16 GEMM (DeviceKernels::gemm_bf16) and its vectorised conversions.
// Two paths, picked at each call (see bf16_gemm_info() in phalanx/core/half.hpp):
//  - avx512bf16: vdpbf16ps over 8 x 32 register blocks (16 zmm accumulators) on packed
//    bf16 pairs: B in 32-column slabs, A in 8-row panels, both packed once per call, as
//    small_gemm packs its float32 slabs;
//  - fallback (no AVX512_BF16, or PHALANX_BF16_GEMM=fallback): convert A and B to float32,
//    run the float32 GEMM (OpenBLAS or small_gemm, as gemm() picks), round at the store.
// PHALANX_BF16_GEMM=auto|avx512bf16|fallback forces one (strict: anything else is a
// ConfigError; avx512bf16 on a CPU without it is one too).
#include <cstdint>

namespace phalanx::cpu {

/// Whether this CPU (and OS) runs AVX-512F and AVX512_BF16 code.
bool has_avx512_bf16();

/// True when the next bf16 GEMM takes the vdpbf16ps path (reads PHALANX_BF16_GEMM).
bool bf16_gemm_uses_avx512();

void bf16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta,
               void* c, std::int64_t ldc, bool c_bf16);

/// d[i] = PyTorch's tensor conversion of s[i] (half.hpp's float_to_bf16_convert), vectorised.
void floats_to_bf16(const float* s, std::uint16_t* d, std::int64_t n);
/// d[i] = s[i] widened (exact), vectorised.
void bf16_to_floats(const std::uint16_t* s, float* d, std::int64_t n);

}  // namespace phalanx::cpu
