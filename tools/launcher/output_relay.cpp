#include "output_relay.hpp"

#include <unistd.h>

#include <cerrno>

namespace phalanx::launcher {

void LineSplitter::feed(const char* data, std::size_t n, std::vector<Event>& out) {
  for (std::size_t i = 0; i < n; ++i) {
    const char c = data[i];
    if (c == '\n') {
      out.push_back({false, !partial_.empty() || last_progress_.empty() ? partial_ : last_progress_});
      partial_.clear();
      last_progress_.clear();
      in_redraws_ = false;
    } else if (c == '\r') {
      if (i + 1 < n && data[i + 1] == '\n') continue;  // CRLF: a line end, not a redraw
      if (!partial_.empty()) {
        if (partial_ != last_progress_) out.push_back({true, partial_});
        last_progress_.swap(partial_);
        partial_.clear();
      }
      in_redraws_ = true;
    } else {
      partial_ += c;
      if (partial_.size() >= kMaxLine) {  // a line this long is cut: memory stays bounded
        out.push_back({false, partial_});
        partial_.clear();
        last_progress_.clear();
        in_redraws_ = false;
      }
    }
  }
  // A bar that writes "\r<bar>" and flushes: what has come is the current redraw.
  if (in_redraws_ && !partial_.empty() && partial_ != last_progress_) {
    out.push_back({true, partial_});
    last_progress_ = partial_;
  }
}

void LineSplitter::finish(std::vector<Event>& out) {
  if (!partial_.empty() || !last_progress_.empty())
    out.push_back({false, !partial_.empty() ? partial_ : last_progress_});
  partial_.clear();
  last_progress_.clear();
  in_redraws_ = false;
}

ProgressRelay::ProgressRelay(std::function<void(const std::string&)> write, std::chrono::milliseconds min_interval)
    : write_(std::move(write)), min_interval_(min_interval) {}

void ProgressRelay::draw(Clock::time_point now) {
  write_("\r[0] " + text_ + "\033[K");
  shown_ = true;
  cleared_ = false;
  pending_ = false;
  last_draw_ = now;
  ++draws_;
}

void ProgressRelay::update(const std::string& text, Clock::time_point now) {
  text_ = text;
  pending_ = true;
  if (draws_ == 0 || now - last_draw_ >= min_interval_) draw(now);
}

void ProgressRelay::before_line() {
  if (!shown_) return;
  write_("\r\033[K");
  shown_ = false;
  cleared_ = true;
}

void ProgressRelay::end_bar() {
  text_.clear();
  pending_ = false;
  cleared_ = false;
}

void ProgressRelay::flush(Clock::time_point now) {
  if (text_.empty()) return;
  if (pending_ && now - last_draw_ >= min_interval_) {
    draw(now);
  } else if (cleared_ && !pending_) {
    // The same text again (not an update: the rate limit is about the bar's updates).
    write_("\r[0] " + text_ + "\033[K");
    shown_ = true;
    cleared_ = false;
  }
}

ProgressRelay::Clock::time_point ProgressRelay::next_due() const {
  return pending_ ? last_draw_ + min_interval_ : Clock::time_point::max();
}

OutputWriter::OutputWriter(int fd, std::size_t max_queued) : fd_(fd), max_queued_(max_queued) {
  thread_ = std::thread([this] { loop(); });
}

OutputWriter::~OutputWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (flush(std::chrono::milliseconds(0)))
    thread_.join();
  else
    thread_.detach();  // stuck in write(): the process exit ends it
}

void OutputWriter::write(std::string text) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_ + text.size() > max_queued_) {
      ++dropped_;
      ++dropped_unreported_;
      return;
    }
    queued_ += text.size();
    queue_.push_back(std::move(text));
  }
  cv_.notify_one();
}

bool OutputWriter::flush(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  return done_cv_.wait_for(lock, limit, [this] { return queue_.empty() && !writing_; });
}

std::uint64_t OutputWriter::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void OutputWriter::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return quit_ || !queue_.empty(); });
    if (queue_.empty()) return;  // quit_ and nothing left
    std::string text = std::move(queue_.front());
    queue_.pop_front();
    queued_ -= text.size();
    if (dropped_unreported_ > 0 && queue_.empty()) {
      // The reader caught up: say what it missed, after the text that was kept.
      text += "phalanx-run: " + std::to_string(dropped_unreported_) +
              " write(s) of output dropped: the reader of this stream was too slow\n";
      dropped_unreported_ = 0;
    }
    writing_ = true;
    lock.unlock();
    std::size_t off = 0;
    while (off < text.size()) {
      const ssize_t n = ::write(fd_, text.data() + off, text.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // closed or broken: the text is lost, as it would be anyway
      off += static_cast<std::size_t>(n);
    }
    lock.lock();
    writing_ = false;
    if (queue_.empty()) done_cv_.notify_all();
  }
}

}  // namespace phalanx::launcher
