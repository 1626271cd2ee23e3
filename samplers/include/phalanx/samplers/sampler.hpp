#pragma once
// Samplers yield the dataset indices of one epoch. Each is deterministic given its
// configuration and epoch, so every rank can compute any rank's indices without
// communication.
#include <cstdint>
#include <memory>
#include <vector>

namespace phalanx::samplers {

class Sampler {
 public:
  virtual ~Sampler() = default;
  /// The indices of the current epoch, in order.
  virtual std::vector<std::int64_t> indices() const = 0;
  /// How many indices one epoch yields.
  virtual std::int64_t size() const = 0;
  /// Selects the epoch (the shuffle of shuffling samplers depends on it).
  virtual void set_epoch(std::int64_t epoch) { epoch_ = epoch; }
  std::int64_t epoch() const { return epoch_; }

 protected:
  std::int64_t epoch_ = 0;
};

using SamplerPtr = std::shared_ptr<Sampler>;

/// 0, 1, ..., n-1.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(std::int64_t n);
  std::vector<std::int64_t> indices() const override;
  std::int64_t size() const override { return n_; }

 private:
  std::int64_t n_;
};

/// A permutation of 0..n-1 from seed + epoch (see shuffle.hpp for the algorithm).
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(std::int64_t n, std::uint64_t seed = 0);
  std::vector<std::int64_t> indices() const override;
  std::int64_t size() const override { return n_; }

 private:
  std::int64_t n_;
  std::uint64_t seed_;
};

}  // namespace phalanx::samplers
