#pragma once
// The specified shuffle every sampler uses, identical on every platform and compiler:
//   Generator g(seed + epoch)          PCG32 seeded through SplitMix64 (core/generator.hpp)
//   order = [0, 1, ..., n-1]
//   for i = n-1 down to 1:             Fisher-Yates (Durstenfeld)
//       j = g.below(i + 1)             unbiased, by rejection on 32-bit draws
//       swap(order[i], order[j])
// (std::shuffle is not used: its output differs between standard libraries.)
#include <cstdint>
#include <vector>

namespace phalanx::samplers {

std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace phalanx::samplers
