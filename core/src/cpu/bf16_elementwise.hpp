#pragma once
// bfloat16 kernels for the memory-bound parts of a bf16 step (docs/mixed_precision.md, "How the
// bf16 ops compute"): they read and write bf16 directly instead of going through float32
// temporaries, and give the bits of the float32 kernel on the widened values rounded once to
// nearest even (NaN written as 0xFFFF, as the float32 -> bf16 conversion writes it).
// Each is compiled for AVX2 and baseline x86-64 (no AVX-512 variant: an AVX-512 CPU runs the
// AVX2 one) and picked at each call by cpu::simd_level("PHALANX_BF16_SIMD") (scalar | avx2 |
// avx512, the last meaning avx2 here): the tests compare the two.
#include <cstdint>

namespace phalanx::cpu {

/// o = relu(x): x where x > 0, +0 where x <= 0 (-0 too), 0xFFFF for a NaN. o may be x.
void relu_bf16(const std::uint16_t* x, std::uint16_t* o, std::int64_t n);
/// o = y <= 0 ? +0 : g (a NaN y passes g), a NaN g written as 0xFFFF; o may be g or y.
void relu_backward_bf16(const std::uint16_t* g, const std::uint16_t* y, std::uint16_t* o, std::int64_t n);
/// o = gelu(x) (PyTorch's exact erf GELU): the float32 kernel's value on the widened x, rounded
/// once to nearest even (a NaN written as 0xFFFF). o may be x.
void gelu_bf16(const std::uint16_t* x, std::uint16_t* o, std::int64_t n);
/// o = g * gelu'(x), in float32 on the widened g and x, rounded once (a NaN as 0xFFFF).
/// o may be g or x.
void gelu_backward_bf16(const std::uint16_t* g, const std::uint16_t* x, std::uint16_t* o, std::int64_t n);
/// o = a + b (float32 a, bf16 b widened), in float32: the residual add of a bf16 branch
/// (promoted to float32) without a float32 copy of b; the same bits. o may be a.
void add_f32_bf16(const float* a, const std::uint16_t* b, float* o, std::int64_t n);
/// o[j] = sum over rows r of x[r * p + j] in float32, added row by row (the float32
/// column_sums' order, so the same bits as summing the widened values).
void column_sums_bf16(const std::uint16_t* x, std::int64_t rows, std::int64_t p, float* o);

}  // namespace phalanx::cpu
