#include "phalanx/samplers/sampler.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <string>
#include <typeinfo>

#include "phalanx/core/error.hpp"
#include "phalanx/core/warning.hpp"
#include "phalanx/core/generator.hpp"
#include "phalanx/samplers/shuffle.hpp"

namespace phalanx::samplers {

namespace {

// "phalanx::samplers::DistributedSampler" -> "DistributedSampler": the class a user wrote.
std::string class_name(const std::type_info& t) {
  int status = 0;
  char* d = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && d ? d : t.name();
  std::free(d);
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace

void Sampler::pass_started() {
  if (!shuffles() || passes_.complete_epoch.load(std::memory_order_relaxed) != epoch_) return;
  if (passes_.warned.exchange(true)) return;  // once per sampler
  warn(class_name(typeid(*this)) + " starts a second pass at epoch " + std::to_string(epoch_) +
       " with the same order: call sampler->set_epoch(epoch) (or loader.set_epoch(epoch)) before each epoch");
}

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
