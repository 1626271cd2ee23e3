#include "output_relay.hpp"

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

}  // namespace phalanx::launcher
