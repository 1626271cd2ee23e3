#pragma once
// Relaying worker output: a stream is split into lines and '\r' progress redraws, and rank
// 0's redraws are shown in place on the launcher's terminal at most 10 times a second.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace phalanx::launcher {

/// Splits one worker stream into finished lines and progress segments. A progress segment
/// is text ended by '\r' (or, while a line holds a '\r', the text read so far: bars that
/// write "\r<bar>" and flush). A line that held redraws finishes as its last text, so
/// CRLF endings and a bar closed by '\n' give one clean line. Lines are cut at kMaxLine.
class LineSplitter {
 public:
  /// A line longer than this is relayed in pieces of this size (each its own line).
  static constexpr std::size_t kMaxLine = 64 * 1024;
  struct Event {
    bool progress;  ///< true: a redraw; false: a finished line (without '\n')
    std::string text;
  };
  void feed(const char* data, std::size_t n, std::vector<Event>& out);
  /// End of stream: the unfinished line, or the last redraw, as a line.
  void finish(std::vector<Event>& out);

 private:
  std::string partial_;        ///< text after the last '\n' or '\r'
  std::string last_progress_;  ///< the last redraw of the current line
  bool in_redraws_ = false;    ///< a '\r' was seen since the last '\n'
};

/// Shows rank 0's progress redraws in place ("\r[0] text") through `write`, at most once
/// per `min_interval` (the newest text wins; a pending one is drawn when due). Other lines
/// clear the bar first and it is drawn again after them, so no line is split by it.
class ProgressRelay {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressRelay(std::function<void(const std::string&)> write,
                std::chrono::milliseconds min_interval = std::chrono::milliseconds(100));
  void update(const std::string& text, Clock::time_point now);
  /// A line is about to be written to the terminal: take the bar off the screen.
  void before_line();
  /// The bar's own line finished: forget it (the line itself is written as a line).
  void end_bar();
  /// Draws a pending redraw when due, and the bar again if a line took it off the screen.
  void flush(Clock::time_point now);
  /// When a pending redraw is due (Clock::time_point::max() when none is).
  Clock::time_point next_due() const;
  int draws() const { return draws_; }

 private:
  void draw(Clock::time_point now);
  std::function<void(const std::string&)> write_;
  std::chrono::milliseconds min_interval_;
  std::string text_;
  bool pending_ = false;  ///< text_ is newer than what is on the screen
  bool shown_ = false;    ///< the bar is on the screen
  bool cleared_ = false;  ///< a line took the bar off the screen: draw it again
  Clock::time_point last_draw_{};
  int draws_ = 0;
};

/// Writes to one fd (the launcher's stdout or stderr) from a thread of its own, so a slow
/// or stuck reader never holds up the launcher's loop (worker failures, signals). Text is
/// queued up to `max_queued` bytes; beyond that whole writes are dropped, counted, and a
/// note saying how many is written once the reader catches up.
class OutputWriter {
 public:
  explicit OutputWriter(int fd, std::size_t max_queued = 8u << 20);
  /// Detaches the thread when it is stuck in a write (see flush); joins it otherwise.
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;
  /// Never blocks on the fd.
  void write(std::string text);
  /// Waits until everything queued is written, at most `limit`; false when it was not.
  bool flush(std::chrono::milliseconds limit);
  std::uint64_t dropped() const;

 private:
  void loop();
  int fd_;
  std::size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::string> queue_;
  std::size_t queued_ = 0;
  bool writing_ = false;
  bool quit_ = false;
  std::uint64_t dropped_ = 0, dropped_unreported_ = 0;
  std::thread thread_;
};

}  // namespace phalanx::launcher
