#include "cpu/simd_level.hpp"

#include <algorithm>
#include <string>

#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"

namespace phalanx::cpu {

int simd_level(const char* env_name, bool needs_dq, bool needs_fma) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2"), avx512f = __builtin_cpu_supports("avx512f"),
                    avx512dq = __builtin_cpu_supports("avx512dq"), fma = __builtin_cpu_supports("fma");
  // Code built with target("...,fma") on a CPU without FMA is an illegal instruction, not a
  // slower path: such a family asks for it (the optimizer and fixed-point ones do not use it).
  const bool fma_ok = fma || !needs_fma;
  const int best = avx512f && (avx512dq || !needs_dq) && fma_ok ? 2 : avx2 && fma_ok ? 1 : 0;
#else
  const int best = 0;
#endif
  int cap = 2;
  const std::string e = env::choice(env_name, "avx512", {"scalar", "avx2", "avx512"});
  if (e == "scalar") cap = 0;
  else if (e == "avx2") cap = 1;
  return std::min(best, cap);
}

}  // namespace phalanx::cpu
