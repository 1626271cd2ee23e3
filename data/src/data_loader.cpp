#include "phalanx/data/data_loader.hpp"

#include "phalanx/core/error.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx::samplers {

DataLoader::DataLoader(DatasetPtr dataset, const DataLoaderOptions& options, SamplerPtr sampler)
    : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {
  if (!dataset_) throw ValueError("DataLoader: dataset is null");
  if (options_.batch_size() < 1)
    throw ValueError(detail::concat("DataLoader: batch size must be >= 1, got ", options_.batch_size()));
  if (options_.prefetch() < 0) throw ValueError("DataLoader: prefetch must be >= 0");
  if (!sampler_) sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
}

DataLoader::~DataLoader() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

std::int64_t DataLoader::num_batches() const {
  const std::int64_t n = sampler_->size(), b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

Batch DataLoader::collate(std::int64_t b) const {
  timeline::Span span("load batch", "data", timeline::Arg{"batch", b});
  const std::int64_t begin = b * options_.batch_size();
  const std::int64_t count = std::min<std::int64_t>(options_.batch_size(),
                                                    static_cast<std::int64_t>(order_.size()) - begin);
  Shape xs = dataset_->feature_shape(), ys = dataset_->label_shape();
  xs.insert(xs.begin(), count);
  ys.insert(ys.begin(), count);
  Batch out{Tensor::empty(xs, dataset_->feature_dtype()), Tensor::empty(ys, dataset_->label_dtype())};
  dataset_->gather(order_.data() + begin, count, out.x, out.y);
  return out;
}

void DataLoader::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::uint64_t served = 0;
  for (;;) {
    cv_.wait(lock, [&] { return quit_ || generation_ != served; });
    if (quit_) return;
    served = generation_;
    timeline::name_this_thread("data loader prefetch");  // each epoch: the timeline may start later
    for (std::int64_t b = 0; b < batches_; ++b) {
      cv_.wait(lock, [&] {
        return quit_ || generation_ != served || (!pause_ && static_cast<int>(ready_.size()) < options_.prefetch());
      });
      if (quit_) return;
      if (generation_ != served) break;  // a new epoch started: this one is dropped
      busy_ = true;
      lock.unlock();
      Batch batch;
      std::exception_ptr error;
      try {
        batch = collate(b);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      cv_.notify_all();  // the reader, or start_epoch waiting for the order to be free
      if (quit_) return;
      if (generation_ != served) break;
      if (error) {
        error_ = error;  // next() rethrows it once the batches before it are taken
        break;
      }
      ready_.push_back(std::move(batch));
    }
  }
}

void DataLoader::start_epoch() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    pause_ = true;  // the worker starts no batch of the old epoch ...
    cv_.wait(lock, [&] { return !busy_; });  // ... and finishes the one it is collating
    sampler_->pass_started();  // a forgotten set_epoch warns here, once
    pass_epoch_ = sampler_->epoch();
    order_ = sampler_->indices();
    batches_ = num_batches();
    cursor_ = 0;
    ready_.clear();
    error_ = nullptr;
    ++generation_;  // the new epoch, its order in place
    pause_ = false;
  }
  if (options_.prefetch() > 0 && !worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  cv_.notify_all();
}

bool DataLoader::next(Batch& out) {
  if (cursor_ >= batches_) return false;
  if (options_.prefetch() == 0) {
    out = collate(cursor_++);
    if (cursor_ == batches_) sampler_->pass_completed(pass_epoch_);
    return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (ready_.empty() && !error_) {  // only a real wait is an event
    timeline::Span span("wait for batch", "data", timeline::Arg{"batch", cursor_});
    cv_.wait(lock, [&] { return !ready_.empty() || error_; });
  }
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  out = std::move(ready_.front());
  ready_.pop_front();
  ++cursor_;
  lock.unlock();
  if (cursor_ == batches_) sampler_->pass_completed(pass_epoch_);
  cv_.notify_all();
  return true;
}

}  // namespace phalanx::samplers
