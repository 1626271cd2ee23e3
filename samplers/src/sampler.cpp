#include "phalanx/samplers/sampler.hpp"

#include "phalanx/core/error.hpp"
#include "phalanx/core/generator.hpp"
#include "phalanx/samplers/shuffle.hpp"

namespace phalanx::samplers {

std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[i] = i;
  Generator g(seed + static_cast<std::uint64_t>(epoch));
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(i + 1)));
    std::swap(order[i], order[j]);
  }
  return order;
}

namespace {
void check_size(std::int64_t n, const char* who) {
  if (n <= 0)
    throw ValueError(detail::concat(who, ": the dataset is empty (", n,
                                    " samples); check the data files or the filter that built it"));
}
}  // namespace

SequentialSampler::SequentialSampler(std::int64_t n) : n_(n) { check_size(n, "SequentialSampler"); }

std::vector<std::int64_t> SequentialSampler::indices() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n_));
  for (std::int64_t i = 0; i < n_; ++i) out[i] = i;
  return out;
}

RandomSampler::RandomSampler(std::int64_t n, std::uint64_t seed) : n_(n), seed_(seed) {
  check_size(n, "RandomSampler");
}

std::vector<std::int64_t> RandomSampler::indices() const { return shuffled_order(n_, seed_, epoch_); }

}  // namespace phalanx::samplers
