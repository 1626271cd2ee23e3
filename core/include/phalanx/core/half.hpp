#pragma once
// 16-bit floating-point storage: IEEE binary16 (float16) and bfloat16, with conversions
// from float32 that round to nearest even (as PyTorch's .half() and .bfloat16()).
#include <cstdint>
#include <cstring>
#include <string>

#include "phalanx/core/tensor.hpp"

namespace phalanx {

/// PyTorch's c10::BFloat16 round_to_nearest_even: what its bf16 arithmetic (mm, add, fill)
/// stores. Every NaN becomes the canonical quiet NaN 0x7FC0 (the payload is dropped).
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(u >> 16);
}

/// What PyTorch 1.13's tensor conversion (`t.bfloat16()`, `t.to(torch.bfloat16)`) stores: the
/// same rounding, but its vectorised copy writes every NaN as 0xFFFF. The CPU table's
/// convert() uses this one, so whole-tensor conversions are bit-identical to PyTorch's.
inline std::uint16_t float_to_bf16_convert(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0xffffu : r);
}

inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_fp16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal half (or zero)
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // rounds to zero
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    const std::uint32_t half = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1);
    const std::uint32_t rounded = half + ((rem > mid || (rem == mid && (half & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | rounded);
  }
  // normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits
  std::uint32_t h = ((abs >> 23) - 112u) << 10 | ((abs >> 13) & 0x3ffu);
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      std::uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while (!(m & 0x400u));
      u = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (m & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 112u) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// The CPU's bfloat16 GEMM as the next product will run it, for logs: "amx (tdpbf16ps
/// tiles)", "avx512bf16 (vdpbf16ps)" or "fallback: float32 GEMM on converted operands
/// (...why...)". Reads PHALANX_BF16_GEMM (auto | amx | avx512bf16 | fallback; anything else
/// is a ConfigError).
std::string bf16_gemm_info();
/// Whether this CPU runs AVX512_BF16 code (the vdpbf16ps path is available).
bool cpu_has_avx512_bf16();
/// Whether this CPU has AMX-BF16 and the OS gave this process its tiles (the amx path).
bool cpu_has_amx_bf16();

/// Converts between float32 and float16/bfloat16 (either direction); same device.
Tensor to_dtype(const Tensor& t, DType dtype);
/// Converts `src` into the preallocated `dst` (same numel; float32 <-> 16-bit).
void convert_into(const Tensor& src, Tensor& dst);

}  // namespace phalanx
