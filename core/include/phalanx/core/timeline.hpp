#pragma once
// The timeline (docs/timeline.md): PHALANX_TIMELINE=FILE makes every rank record forward,
// backward, each gradient bucket's launch and completion, the optimizer step, gradient
// clipping, the DataLoader's batches (load, wait) and every collective with its size, and the job writes ONE Chrome-trace JSON to FILE (ranks as rows,
// "pid" = rank; threads as sub-rows, "tid"), which Perfetto and chrome://tracing open.
//
// Off by default, and free then: every event site costs one relaxed atomic load and one
// branch (Span's destructor tests a member it set itself; its few members are zeroed on the
// stack), no allocation, no lock, no clock read. On, an event is one steady-clock read at each end and an append to this thread's
// own buffer (its own mutex, uncontended but for the final write), after one relaxed
// fetch_add on the process's event counter.
//
// Bounded: a rank keeps at most PHALANX_TIMELINE_MAX_EVENTS events (default 1,000,000, about
// 80 bytes each). The event that would exceed it turns recording off (every site is back on
// the off path) and the trace ends with an instant event "timeline truncated after N events
// on rank R; raise PHALANX_TIMELINE_MAX_EVENTS".
//
// Names, categories and argument keys must be string literals (or otherwise outlive the
// process): events keep the pointers.
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

namespace phalanx::timeline {

namespace detail {
extern std::atomic<bool> g_recording;
}

/// Whether events are being recorded (PHALANX_TIMELINE was set, or start() was called, and
/// finish() has not run yet, and the event budget has not run out).
inline bool enabled() noexcept { return detail::g_recording.load(std::memory_order_relaxed); }

/// An integer argument shown in the event's details ("bytes", "bucket", ...).
struct Arg {
  const char* key = nullptr;
  std::int64_t value = 0;
};

/// Steady-clock nanoseconds (the clock every event uses).
std::int64_t now_ns() noexcept;

/// A complete event [begin_ns, end_ns) on this thread's row. `index` >= 0 is appended to
/// the name ("bucket 3").
void record(const char* name, const char* category, std::int64_t begin_ns, std::int64_t end_ns, Arg a = {},
            Arg b = {}, int index = -1) noexcept;

/// An asynchronous span (Chrome's "b"/"e" events), for intervals that overlap others on the
/// same thread without nesting (a gradient bucket from launch to completion). Begin and end
/// must use the same name, category, index and id.
void async_begin(const char* name, const char* category, std::uint64_t id, int index = -1, Arg a = {},
                 Arg b = {}) noexcept;
void async_end(const char* name, const char* category, std::uint64_t id, int index = -1) noexcept;

/// Names this thread's row ("process group worker"); the main thread is "main", the others
/// "thread N" until named. No effect while off.
void name_this_thread(const char* name) noexcept;

/// RAII: records [construction, destruction) as a complete event on this thread.
class Span {
 public:
  Span(const char* name, const char* category, Arg a = {}, Arg b = {}, int index = -1) noexcept {
    if (enabled()) {
      name_ = name;
      category_ = category;
      a_ = a;
      b_ = b;
      index_ = index;
      begin_ = now_ns();
    }
  }
  /// As above, with the first argument's value computed only while recording (a size):
  /// `value()` is not called while off.
  template <class F, class = decltype(static_cast<std::int64_t>(std::declval<F&>()()))>
  Span(const char* name, const char* category, const char* key, F&& value, Arg b = {}) noexcept {
    if (enabled()) {
      name_ = name;
      category_ = category;
      a_.key = key;
      try {
        a_.value = static_cast<std::int64_t>(value());
      } catch (...) {
        a_.value = -1;
      }
      b_ = b;
      begin_ = now_ns();
    }
  }
  ~Span() {
    if (name_) record(name_, category_, begin_, now_ns(), a_, b_, index_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_ = nullptr;  // null: off when constructed, nothing to record
  const char* category_ = nullptr;
  Arg a_, b_;
  int index_ = -1;
  std::int64_t begin_ = 0;
};

/// Starts recording into `path` (what PHALANX_TIMELINE=path does when the library loads;
/// for programs and tests that choose the file themselves). Reads the event budget from
/// PHALANX_TIMELINE_MAX_EVENTS. Throws ConfigError when the file's folder does not exist or
/// is not writable, when the budget is not a positive whole number, or when the timeline
/// already finished in this process. Idempotent for the same path.
void start(const std::string& path);

/// The file the timeline writes, or "" when it is off.
std::string path();

/// Stops recording and writes this rank's events to "<path>.rank<r>.part" (a complete
/// Chrome trace on its own); the rank whose part completes the set merges them all into
/// <path> (written to a temporary file and renamed, so <path> is either absent or whole)
/// and removes the parts. The rank and world size are the default world's
/// (parallel::init_process_group), else RANK / WORLD_SIZE, else 0 of 1.
/// parallel::destroy_process_group() and process exit call it; it runs once per process
/// (events after it are not recorded). No effect while off. Never throws: a write error is
/// one line on stderr.
void finish() noexcept;

}  // namespace phalanx::timeline
