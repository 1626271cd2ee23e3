#include "phalanx/samplers/data_loader.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx::samplers {

DataLoader::DataLoader(DatasetPtr dataset, const DataLoaderOptions& options, SamplerPtr sampler)
    : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {
  if (!dataset_) throw ValueError("DataLoader: dataset is null");
  if (options_.batch_size < 1)
    throw ValueError(detail::concat("DataLoader: batch size must be >= 1, got ", options_.batch_size));
  if (options_.prefetch < 0) throw ValueError("DataLoader: prefetch must be >= 0");
  if (!sampler_) sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
}

DataLoader::~DataLoader() { stop_worker(); }

std::int64_t DataLoader::num_batches() const {
  const std::int64_t n = sampler_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

Batch DataLoader::collate(std::int64_t b) const {
  const std::int64_t begin = b * options_.batch_size;
  const std::int64_t count = std::min<std::int64_t>(options_.batch_size,
                                                    static_cast<std::int64_t>(order_.size()) - begin);
  Shape xs = dataset_->feature_shape(), ys = dataset_->label_shape();
  xs.insert(xs.begin(), count);
  ys.insert(ys.begin(), count);
  Batch out{Tensor::empty(xs), Tensor::empty(ys, dataset_->label_dtype())};
  dataset_->gather(order_.data() + begin, count, out.x, out.y);
  return out;
}

void DataLoader::stop_worker() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void DataLoader::worker_loop() {
  for (std::int64_t b = 0; b < batches_; ++b) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(ready_.size()) < options_.prefetch; });
      if (stop_) return;
    }
    Batch batch;
    try {
      batch = collate(b);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(batch));
      ++produced_;
    }
    cv_.notify_all();
  }
}

void DataLoader::start_epoch() {
  stop_worker();
  order_ = sampler_->indices();
  batches_ = num_batches();
  cursor_ = 0;
  ready_.clear();
  produced_ = 0;
  stop_ = false;
  error_ = nullptr;
  if (options_.prefetch > 0) worker_ = std::thread([this] { worker_loop(); });
}

bool DataLoader::next(Batch& out) {
  if (cursor_ >= batches_) return false;
  if (options_.prefetch == 0) {
    out = collate(cursor_++);
    return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  out = std::move(ready_.front());
  ready_.pop_front();
  ++cursor_;
  lock.unlock();
  cv_.notify_all();
  return true;
}

}  // namespace phalanx::samplers
