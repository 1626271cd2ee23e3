#pragma once
// Samplers yield the dataset indices of one epoch. Each is deterministic given its
// configuration and epoch, so every rank can compute any rank's indices without
// communication.
#include <atomic>
#include <cstdint>
#include <limits>
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
  /// Selects the epoch (the shuffle of shuffling samplers depends on it). An override must
  /// call this one.
  virtual void set_epoch(std::int64_t epoch) {
    epoch_ = epoch;
    passes_.complete_epoch.store(PassTracker::kNone, std::memory_order_relaxed);
  }
  std::int64_t epoch() const { return epoch_; }
  /// Whether the order depends on the epoch (a shuffle): each epoch then needs set_epoch().
  virtual bool shuffles() const { return false; }

  /// Called by DataLoader as a pass over this epoch's order starts and when it has handed out
  /// every batch. A shuffling sampler whose new pass starts at the epoch of its last complete
  /// pass, with no set_epoch() in between (the forgotten set_epoch: every epoch would see the
  /// same order), prints one warning on stderr, once per sampler. Two passes read at the same
  /// time (two live loaders) are not warned about: neither had completed when the other began.
  void pass_started();
  void pass_completed(std::int64_t epoch) { passes_.complete_epoch.store(epoch, std::memory_order_relaxed); }

 protected:
  std::int64_t epoch_ = 0;

 private:
  // Copies start afresh (a sampler stays copyable).
  struct PassTracker {
    static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();
    std::atomic<std::int64_t> complete_epoch{kNone};  ///< the last complete pass's epoch since set_epoch
    std::atomic<bool> warned{false};
    PassTracker() = default;
    PassTracker(const PassTracker&) {}
    PassTracker& operator=(const PassTracker&) { return *this; }
  };
  PassTracker passes_;
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
  bool shuffles() const override { return true; }

 private:
  std::int64_t n_;
  std::uint64_t seed_;
};

}  // namespace phalanx::samplers
