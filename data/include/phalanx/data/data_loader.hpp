#pragma once
// DataLoader: batches from a dataset in a sampler's order, collated into contiguous tensors
// (one allocation per batch tensor, none per sample). With prefetch > 0 a background
// thread prepares up to `prefetch` batches ahead; the order stays the sampler's. The thread
// is started once and sleeps (on a condition variable, never spinning) between epochs and
// whenever `prefetch` batches are waiting.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "phalanx/core/arg.hpp"
#include "phalanx/data/dataset.hpp"
#include "phalanx/samplers/sampler.hpp"

namespace phalanx::samplers {

struct Batch {
  Tensor x, y;
};

/// Chainable, as libtorch's: `DataLoaderOptions(64).drop_last(true)`.
struct DataLoaderOptions {
  /* implicit */ DataLoaderOptions(std::int64_t batch_size = 1) : batch_size_(batch_size) {}
  PHALANX_ARG(std::int64_t, batch_size);
  PHALANX_ARG(bool, drop_last) = false;
  /// Batches prepared ahead on a background thread (0: none). Worth it only when a batch
  /// costs more to gather than to hand over between threads (tens of microseconds: data
  /// decoded or read per batch); for data in memory or mapped, 0 is faster, and the thread
  /// competes with the workers when there are no spare cores (docs/benchmarks.md).
  PHALANX_ARG(int, prefetch) = 0;
};

class DataLoader {
 public:
  /// `sampler` defaults to a SequentialSampler over the dataset.
  DataLoader(DatasetPtr dataset, const DataLoaderOptions& options, SamplerPtr sampler = nullptr);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Batches per epoch.
  std::int64_t num_batches() const;
  Sampler& sampler() { return *sampler_; }
  void set_epoch(std::int64_t epoch) { sampler_->set_epoch(epoch); }

  /// Starts an epoch (sampler order of its current epoch); then next() until it is false.
  void start_epoch();
  bool next(Batch& out);

  /// Range-for over one epoch: `for (Batch& b : loader) ...` calls start_epoch().
  class Iterator {
   public:
    Iterator(DataLoader* loader) : loader_(loader) { advance(); }
    Batch& operator*() { return batch_; }
    Iterator& operator++() {
      advance();
      return *this;
    }
    bool operator!=(const Iterator& other) const { return loader_ != other.loader_; }

   private:
    friend class DataLoader;
    Iterator() = default;
    void advance() {
      if (loader_ && !loader_->next(batch_)) loader_ = nullptr;
    }
    DataLoader* loader_ = nullptr;
    Batch batch_;
  };
  Iterator begin() {
    start_epoch();
    return Iterator(this);
  }
  Iterator end() { return Iterator(); }

 private:
  Batch collate(std::int64_t b) const;
  void worker_loop();

  DatasetPtr dataset_;
  DataLoaderOptions options_;
  SamplerPtr sampler_;
  std::vector<std::int64_t> order_;
  std::int64_t batches_ = 0, cursor_ = 0;
  std::int64_t pass_epoch_ = 0;  // the sampler's epoch when this pass started

  // prefetching: the worker serves epoch `generation_`, which changes (under mu_) only once
  // the new order is in place; start_epoch pauses it and waits until it is not collating
  // (busy_ false) before changing order_ and batches_.
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  std::uint64_t generation_ = 0;
  bool busy_ = false, pause_ = false, quit_ = false;
  std::exception_ptr error_;
};

}  // namespace phalanx::samplers
