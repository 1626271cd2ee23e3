#pragma once
// A random generator that gives the same numbers on every platform and compiler:
// PCG32 (XSH-RR, O'Neill 2014) seeded through SplitMix64. Uniform floats take the top 24
// bits; normals use Box-Muller computed in double. Integer draws in [0, n) use rejection,
// so they are exact (the samplers' shuffle relies on this).
#include <cstdint>
#include <mutex>

namespace phalanx {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(std::uint64_t seed);
  /// PCG's reference seeding (pcg32_srandom_r): state and stream chosen directly.
  void seed_pcg(std::uint64_t init_state, std::uint64_t stream);

  std::uint32_t next_u32();
  std::uint64_t next_u64();
  /// Uniform in [0, 1) with 24 random bits.
  float uniform();
  /// Uniform integer in [0, n), unbiased. n must be > 0.
  std::uint64_t below(std::uint64_t n);
  /// Standard normal (Box-Muller; the second value of each pair is cached).
  float normal();

  struct State {
    std::uint64_t state, inc;
    bool has_spare;
    float spare;
  };
  State get_state() const { return {state_, inc_, has_spare_, spare_}; }
  void set_state(const State& s) {
    state_ = s.state; inc_ = s.inc; has_spare_ = s.has_spare; spare_ = s.spare;
  }

 private:
  std::uint64_t state_ = 0, inc_ = 1;
  bool has_spare_ = false;
  float spare_ = 0.f;
};

/// The process-wide default generator (used when no generator is passed). Other threads
/// may draw from it at the same time: draw through a GeneratorGuard, which holds its lock.
Generator& default_generator();
/// Seeds the default generator (under its lock).
void manual_seed(std::uint64_t seed);

/// `gen`, or the default generator with its lock held for the guard's lifetime:
///   GeneratorGuard guard(gen); Generator& g = guard.get();
/// A caller-owned generator is not locked (it is the caller's to share).
class GeneratorGuard {
 public:
  explicit GeneratorGuard(Generator* gen);
  Generator& get() { return *gen_; }

 private:
  std::unique_lock<std::mutex> lock_;
  Generator* gen_;
};

}  // namespace phalanx
