#include "progress_bar.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <phalanx/core/env.hpp>

namespace phalanx::trainer {

namespace {
std::string fmt_time(double secs) {
  const int t = static_cast<int>(secs + 0.5);
  char b[32];
  std::snprintf(b, sizeof b, "%d:%02d", t / 60, t % 60);
  return b;
}
}  // namespace

ProgressBar::ProgressBar(bool enabled, int epochs, std::int64_t steps_per_epoch, std::int64_t global_batch)
    : enabled_(enabled), epochs_(epochs), steps_(steps_per_epoch), global_batch_(global_batch) {}

void ProgressBar::start_epoch(std::int64_t epoch, std::int64_t skipped) {
  epoch_ = epoch;
  skipped_ = skipped;
  epoch_start_ = std::chrono::steady_clock::now();
  drawn_ = false;
}

bool ProgressBar::wanted(int rank) {
  if (rank != 0) return false;
  return env::flag("PHALANX_PROGRESS", ::isatty(1) != 0);
}

void ProgressBar::update(std::int64_t done, double loss) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  // At most 10 redraws a second; an epoch's last step is always drawn.
  if (drawn_ && done < steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  drawn_ = true;
  last_draw_ = now;
  const double es = std::chrono::duration<double>(now - epoch_start_).count();
  const int bar = static_cast<int>(30.0 * done / steps_);
  const double rate = (done - skipped_) * global_batch_ / std::max(es, 1e-9);
  const double eta = (steps_ - done + (epochs_ - epoch_ - 1) * steps_) * global_batch_ / std::max(rate, 1e-9);
  std::printf("\repoch %lld/%d [%s%s] step %lld/%lld loss %.4f %.0f samples/s ETA %s ",
              static_cast<long long>(epoch_ + 1), epochs_, std::string(bar, '#').c_str(),
              std::string(30 - bar, '.').c_str(), static_cast<long long>(done), static_cast<long long>(steps_), loss,
              rate, fmt_time(eta).c_str());
  std::fflush(stdout);
}

void ProgressBar::end_epoch() {
  if (enabled_) std::printf("\n");
}

}  // namespace phalanx::trainer
