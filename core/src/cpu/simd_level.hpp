#pragma once
// Which x86 vector level a CPU kernel family runs at, picked at run time: the best this CPU
// has, capped by an environment variable the tests use to compare the paths bit for bit.
namespace phalanx::cpu {

/// 2: AVX-512F (and AVX-512DQ when `needs_dq`), 1: AVX2, 0: baseline, each with FMA when
/// `needs_fma` (a family whose code is compiled with target("...,fma")); capped by `env_name`
/// (scalar | avx2 | avx512; anything else is a ConfigError naming it). The variable is read
/// at each call (a few per step: the tests switch it between calls).
int simd_level(const char* env_name, bool needs_dq = false, bool needs_fma = false);

}  // namespace phalanx::cpu
