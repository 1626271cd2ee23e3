#include "phalanx/core/generator.hpp"

#include <cmath>

namespace phalanx {

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

void Generator::manual_seed(std::uint64_t seed) {
  std::uint64_t sm = seed;
  const std::uint64_t init_state = splitmix64(sm);
  seed_pcg(init_state, splitmix64(sm));
}

void Generator::seed_pcg(std::uint64_t init_state, std::uint64_t stream) {
  state_ = 0;
  inc_ = (stream << 1u) | 1u;
  next_u32();
  state_ += init_state;
  next_u32();
  has_spare_ = false;
  spare_ = 0.f;
}

std::uint32_t Generator::next_u32() {
  const std::uint64_t old = state_;
  state_ = old * 6364136223846793005ull + inc_;
  const auto xorshifted = static_cast<std::uint32_t>(((old >> 18u) ^ old) >> 27u);
  const auto rot = static_cast<std::uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

std::uint64_t Generator::next_u64() {
  const std::uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

float Generator::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

std::uint64_t Generator::below(std::uint64_t n) {
  // Rejection sampling on the largest multiple of n: exact on every platform.
  if (n <= 0xFFFFFFFFull) {
    const auto n32 = static_cast<std::uint32_t>(n);
    const std::uint32_t limit = static_cast<std::uint32_t>(-n32) % n32;  // 2^32 mod n
    for (;;) {
      const std::uint32_t r = next_u32();
      if (r >= limit) return r % n32;
    }
  }
  const std::uint64_t limit = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = next_u64();
    if (r >= limit) return r % n;
  }
}

float Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // u1 in (0, 1] so log(u1) is finite.
  const double u1 = (static_cast<double>(next_u32()) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(next_u32()) / 4294967296.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 6.283185307179586 * u2;
  spare_ = static_cast<float>(r * std::sin(theta));
  has_spare_ = true;
  return static_cast<float>(r * std::cos(theta));
}

namespace {
std::mutex& default_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(std::uint64_t seed) {
  std::lock_guard<std::mutex> lock(default_mutex());
  default_generator().manual_seed(seed);
}

GeneratorGuard::GeneratorGuard(Generator* gen) : gen_(gen) {
  if (!gen_) {
    lock_ = std::unique_lock<std::mutex>(default_mutex());
    gen_ = &default_generator();
  }
}

}  // namespace phalanx
