// The timeline recorder (timeline.hpp, docs/timeline.md): per-thread event buffers, one
// Chrome-trace part per rank, merged into one file by the rank that completes the set.
#include "phalanx/core/timeline.hpp"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/file_safety.hpp"
#include "phalanx/core/world.hpp"

namespace phalanx::timeline {

namespace detail {
std::atomic<bool> g_recording{false};
}

namespace {

struct Event {
  const char* name;
  const char* category;
  std::int64_t ts;   // steady ns
  std::int64_t dur;  // ns ("X")
  std::uint64_t id;  // "b" / "e"
  Arg a, b;
  int index;
  char phase;  // 'X', 'b', 'e'
};

// A deque, not a vector: memory grows in small blocks with the events (no doubling to twice
// the budget, no copy of the whole buffer under the lock while training).
using Events = std::deque<Event>;

struct ThreadLog {
  std::mutex mu;
  Events events;
  int tid = 0;
  const char* name = nullptr;
};

struct State {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadLog>> logs;
  std::string path;
  std::int64_t wall_minus_steady = 0;  // ns: wall clock = steady + this
  std::int64_t start_wall = 0;         // ns since the epoch, when recording started
  int next_tid = 1;
  bool started = false, finished = false, exit_hook = false;
};

State& state() {
  static State* s = new State;  // never destroyed: finish() runs from atexit
  return *s;
}

thread_local std::shared_ptr<ThreadLog> t_log;

// The budget (PHALANX_TIMELINE_MAX_EVENTS): every append takes a ticket; tickets at or past
// the budget are dropped, and the one equal to it turns recording off, so every event site
// is back on the off path (one load, one branch). At most `g_budget` events are kept.
constexpr std::uint64_t kDefaultMaxEvents = 1'000'000;
std::atomic<std::uint64_t> g_tickets{0};
std::atomic<std::uint64_t> g_budget{kDefaultMaxEvents};
std::atomic<std::int64_t> g_truncated_ns{0};  // steady ns when the budget ran out; 0: it did not

int env_int(const char* name, int fallback);

/// This process's rank and world size: the default world's, else RANK / WORLD_SIZE, else 0 of 1.
std::pair<int, int> rank_and_world(const WorldInfo& w) {
  const int rank = w.initialized ? w.rank : env_int("RANK", 0);
  int world = w.initialized ? w.size : env_int("WORLD_SIZE", 1);
  if (rank >= world) world = rank + 1;
  return {rank, world};
}

/// The budget ran out on this thread (once per process): recording stops.
void truncate_now() noexcept {
  g_truncated_ns.store(now_ns(), std::memory_order_relaxed);
  detail::g_recording.store(false, std::memory_order_release);
  try {
    const int rank = rank_and_world(default_world()).first;
    std::fprintf(stderr,
                 "phalanx timeline: %llu events recorded on rank %d, the budget; later events are not recorded "
                 "(raise PHALANX_TIMELINE_MAX_EVENTS for a longer trace)\n",
                 static_cast<unsigned long long>(g_budget.load(std::memory_order_relaxed)), rank);
  } catch (...) {
  }
}

ThreadLog& this_log() {
  if (!t_log) {
    auto log = std::make_shared<ThreadLog>();
    if (static_cast<pid_t>(::syscall(SYS_gettid)) == ::getpid()) log->name = "main";
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    log->tid = s.next_tid++;
    s.logs.push_back(log);
    t_log = std::move(log);
  }
  return *t_log;
}

void append(const Event& e) noexcept {
  const std::uint64_t ticket = g_tickets.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t budget = g_budget.load(std::memory_order_relaxed);
  if (ticket >= budget) {
    if (ticket == budget) truncate_now();
    return;
  }
  try {
    ThreadLog& log = this_log();
    std::lock_guard<std::mutex> lock(log.mu);
    log.events.push_back(e);
  } catch (...) {
    // out of memory while tracing: the event is lost, the program goes on
  }
}

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void write_string(std::string& out, const char* s) {
  out += '"';
  for (const char* p = s ? s : ""; *p; ++p) {
    if (*p == '"' || *p == '\\') out += '\\';
    if (static_cast<unsigned char>(*p) >= 0x20) out += *p;
  }
  out += '"';
}

/// Nanoseconds as microseconds with three decimals, exactly.
void write_us(std::string& out, std::int64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%lld.%03lld", ns < 0 ? "-" : "", static_cast<long long>(std::llabs(ns) / 1000),
                static_cast<long long>(std::llabs(ns) % 1000));
  out += buf;
}

void write_args(std::string& out, const Arg& a, const Arg& b) {
  if (!a.key && !b.key) return;
  out += ",\"args\":{";
  bool first = true;
  for (const Arg* arg : {&a, &b}) {
    if (!arg->key) continue;
    if (!first) out += ',';
    first = false;
    write_string(out, arg->key);
    out += ':' + std::to_string(arg->value);
  }
  out += '}';
}

std::string event_name(const Event& e) {
  return e.index >= 0 ? std::string(e.name) + " " + std::to_string(e.index) : std::string(e.name);
}

std::string metadata(int rank, int tid, const char* what, const std::string& key, const std::string& value) {
  std::string out = "{\"name\":\"" + std::string(what) + "\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
                    ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"" + key + "\":" + value + "}}";
  return out;
}

/// A Chrome-trace document written line by line into a temporary file that commit()
/// renames to `path`: `path` is never partial, and the text is never held whole in memory
/// (a rank's part or the merged file of many ranks can be hundreds of megabytes).
class TraceWriter {
 public:
  TraceWriter(const std::string& path, const std::string& other) : path_(path) {
    int fd = -1;
    try {  // a new name, never a planted file or link
      fd = files::create_temp(path, 0666, tmp_);
    } catch (const IoError& e) {
      tmp_.clear();
      open_error_ = e.what();
      return;
    }
    // Through the descriptor just created, not the name: another user who can write the
    // folder could swap the name for a link in between.
    f_.open(files::fd_path(fd), std::ios::binary | std::ios::trunc);
    ::close(fd);
    f_ << "{\"displayTimeUnit\":\"ns\",\"otherData\":{" << other << "},\"traceEvents\":[\n";
  }
  ~TraceWriter() {
    if (!committed_ && !tmp_.empty()) std::remove(tmp_.c_str());
  }
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  /// One event line (no separator: the writer puts ",\n" between lines).
  void line(const std::string& l) {
    if (!first_) f_ << ",\n";
    first_ = false;
    f_ << l;
  }

  /// Closes the document and renames it into place; false (and `error`) when a write failed.
  bool commit(std::string* error) {
    if (!open_error_.empty()) {
      *error = open_error_;
      return false;
    }
    f_ << "\n]}\n";
    f_.flush();
    if (!f_) {
      *error = "cannot write " + tmp_ + ": " + std::strerror(errno);
      return false;
    }
    f_.close();
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      *error = "cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(errno);
      return false;
    }
    committed_ = true;
    return true;
  }

 private:
  std::string path_, tmp_, open_error_;
  std::ofstream f_;
  bool first_ = true, committed_ = false;
};

/// One line per event; "ts" in microseconds since the epoch (wall clock), so parts of
/// ranks on one host line up exactly and those of other hosts as well as their clocks agree.
void write_rank(TraceWriter& out, int rank, std::int64_t offset,
                const std::vector<std::pair<std::shared_ptr<ThreadLog>, Events>>& logs, std::int64_t truncated_ns,
                std::uint64_t budget) {
  out.line(metadata(rank, 0, "process_name", "name", "\"rank " + std::to_string(rank) + "\""));
  out.line(metadata(rank, 0, "process_sort_index", "sort_index", std::to_string(rank)));
  std::vector<std::pair<const Event*, int>> all;  // the event and its row
  for (const auto& [log, events] : logs) {
    if (events.empty()) continue;
    std::string name;
    write_string(name, log->name ? log->name : ("thread " + std::to_string(log->tid)).c_str());
    out.line(metadata(rank, log->tid, "thread_name", "name", name));
    // the main thread's row first, then the others in the order they first recorded
    const bool main = log->name && std::strcmp(log->name, "main") == 0;
    out.line(metadata(rank, log->tid, "thread_sort_index", "sort_index", std::to_string(main ? 0 : log->tid)));
    for (const Event& e : events) all.emplace_back(&e, log->tid);
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& x, const auto& y) { return x.first->ts < y.first->ts; });
  std::string line;
  for (const auto& [ev, tid] : all) {
    const Event& e = *ev;
    line = "{\"name\":";
    write_string(line, event_name(e).c_str());
    line += ",\"cat\":";
    write_string(line, e.category);
    line += ",\"ph\":\"";
    line += e.phase;
    line += "\",\"pid\":" + std::to_string(rank) + ",\"tid\":" + std::to_string(tid) + ",\"ts\":";
    write_us(line, e.ts + offset);
    if (e.phase == 'X') {
      line += ",\"dur\":";
      write_us(line, e.dur);
    } else {
      // chrome://tracing pairs a plain "id" across processes: every rank's "bucket 0" would
      // share one, so the rank goes into the high bits (unique in the merged file).
      line += ",\"id\":" + std::to_string((static_cast<std::uint64_t>(rank) << 32) | (e.id & 0xffffffffu));
    }
    write_args(line, e.a, e.b);
    line += '}';
    out.line(line);
  }
  if (truncated_ns != 0) {
    // An instant event on the rank's whole row, where the recording stopped; it starts
    // with "name" and has a "ts", like every event line, so the merge keeps and shifts it.
    line = "{\"name\":";
    write_string(line, ("timeline truncated after " + std::to_string(budget) + " events on rank " +
                        std::to_string(rank) + "; raise PHALANX_TIMELINE_MAX_EVENTS")
                           .c_str());
    line += ",\"cat\":\"timeline\",\"ph\":\"i\",\"s\":\"p\",\"pid\":" + std::to_string(rank) + ",\"tid\":0,\"ts\":";
    write_us(line, truncated_ns + offset);
    line += ",\"args\":{\"max_events\":" + std::to_string(budget) + "}}";
    out.line(line);
  }
}

std::string part_path(const std::string& path, int rank) { return path + ".rank" + std::to_string(rank) + ".part"; }

/// Calls fn(line) for each event line of a part (or of a claimed part): between the header
/// and the footer, without the separator. Line by line: the part is never held whole.
template <class F>
void for_each_part_event(const std::string& file, F&& fn) {
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("{\"name\":", 0) != 0) continue;
    if (!line.empty() && line.back() == ',') line.pop_back();
    fn(line);
  }
}

/// The "ts" of a line as (whole microseconds, the rest after them); false when it has none.
bool find_ts(const std::string& line, std::size_t* at, std::size_t* end, long long* whole) {
  const std::size_t k = line.find(",\"ts\":");
  if (k == std::string::npos) return false;
  *at = k + 6;
  *end = line.find_first_of(".,}", *at);
  if (*end == std::string::npos) return false;
  *whole = std::atoll(line.substr(*at, *end - *at).c_str());
  return true;
}

/// Merges every rank's part into `path` when all of them are in (and fresh: written after
/// this process started, give or take the file system's coarse clock). Exactly one rank
/// merges: the one whose rename claims rank 0's part.
void try_merge(const std::string& path, int world, int rank, std::int64_t start_wall) {
  for (int r = 0; r < world; ++r) {
    struct stat st{};
    if (::stat(part_path(path, r).c_str(), &st) != 0) return;
    const std::int64_t mtime = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (r != rank && mtime < start_wall - 50'000'000) return;  // a previous job's part
  }
  const std::string claimed = path + ".merging" + std::to_string(::getpid());
  if (std::rename(part_path(path, 0).c_str(), claimed.c_str()) != 0) return;  // another rank merges
  const auto part = [&](int r) { return r == 0 ? claimed : part_path(path, r); };
  // Two passes over the parts, line by line (memory stays small however long the parts):
  // the first finds the job's first event and the ranks whose budget ran out (their parts
  // end with the marker), the second writes the lines with their timestamps from that
  // first event on (small numbers, exact: text arithmetic).
  long long origin = -1;
  std::string truncated;
  for (int r = 0; r < world; ++r) {
    bool marked = false;
    for_each_part_event(part(r), [&](const std::string& l) {
      std::size_t at, end;
      long long whole;
      if (find_ts(l, &at, &end, &whole) && (origin < 0 || whole < origin)) origin = whole;
      if (l.find(",\"cat\":\"timeline\",\"ph\":\"i\"") != std::string::npos) marked = true;
    });
    if (marked) truncated += (truncated.empty() ? "" : ",") + std::to_string(r);
  }
  const std::string other = "\"phalanx_timeline\":1,\"world\":" + std::to_string(world) +
                            ",\"origin_unix_us\":" + std::to_string(origin < 0 ? 0 : origin) +
                            (truncated.empty() ? "" : ",\"truncated_ranks\":[" + truncated + "]");
  std::string error;
  bool ok;
  {
    TraceWriter out(path, other);
    for (int r = 0; r < world; ++r)
      for_each_part_event(part(r), [&](std::string& l) {
        std::size_t at, end;
        long long whole;
        if (origin >= 0 && find_ts(l, &at, &end, &whole)) l.replace(at, end - at, std::to_string(whole - origin));
        out.line(l);
      });
    ok = out.commit(&error);
  }
  if (!ok) {
    std::fprintf(stderr, "phalanx timeline: %s; the parts stay in %s.rank*.part\n", error.c_str(), path.c_str());
    std::rename(claimed.c_str(), part_path(path, 0).c_str());
    return;
  }
  std::remove(claimed.c_str());
  for (int r = 1; r < world; ++r) std::remove(part_path(path, r).c_str());
}

/// PHALANX_TIMELINE_MAX_EVENTS: a positive whole number (strict), else the default.
std::uint64_t max_events_from_env() {
  return static_cast<std::uint64_t>(env::integer("PHALANX_TIMELINE_MAX_EVENTS", kDefaultMaxEvents, 1,
                                                 std::int64_t(1) << 40, "a positive whole number of events per rank"));
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && n >= 0 && n < (1L << 30) ? static_cast<int>(n) : fallback;
}

void finish_at_exit() { finish(); }

struct EnvStart {
  EnvStart() {
    try {
      const auto v = env::path("PHALANX_TIMELINE");
      if (!v) return;
      start(*v);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phalanx: %s; the timeline is off\n", e.what());
    }
  }
} g_env_start;

}  // namespace

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(const char* name, const char* category, std::int64_t begin_ns, std::int64_t end_ns, Arg a, Arg b,
            int index) noexcept {
  if (!enabled()) return;
  append(Event{name, category, begin_ns, end_ns - begin_ns, 0, a, b, index, 'X'});
}

void async_begin(const char* name, const char* category, std::uint64_t id, int index, Arg a, Arg b) noexcept {
  if (!enabled()) return;
  append(Event{name, category, now_ns(), 0, id, a, b, index, 'b'});
}

void async_end(const char* name, const char* category, std::uint64_t id, int index) noexcept {
  if (!enabled()) return;
  append(Event{name, category, now_ns(), 0, id, {}, {}, index, 'e'});
}

void name_this_thread(const char* name) noexcept {
  if (!enabled()) return;
  try {
    ThreadLog& log = this_log();
    std::lock_guard<std::mutex> lock(log.mu);
    log.name = name;
  } catch (...) {
  }
}

void start(const std::string& file) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.started && s.path == file && !s.finished) return;
  if (s.finished)
    throw ConfigError("timeline: it already finished in this process (once per process, written at "
                      "destroy_process_group or exit); start it before training");
  if (s.started)
    throw ConfigError("timeline: already recording into '" + s.path + "', cannot switch to '" + file + "'");
  if (file.empty() || file.back() == '/')
    throw ConfigError("PHALANX_TIMELINE='" + file + "' names no file; give a file name such as /tmp/job.json");
  const std::string folder = folder_of(file);
  struct stat st{};
  if (::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || ::access(folder.c_str(), W_OK | X_OK) != 0)
    throw ConfigError("PHALANX_TIMELINE='" + file + "': the folder '" + folder +
                      "' does not exist or is not writable; create it or choose another file");
  const std::uint64_t budget = max_events_from_env();
  s.path = file;
  g_budget.store(budget, std::memory_order_relaxed);
  g_tickets.store(0, std::memory_order_relaxed);
  g_truncated_ns.store(0, std::memory_order_relaxed);
  const std::int64_t steady = now_ns();
  s.start_wall = wall_ns();
  s.wall_minus_steady = s.start_wall - steady;
  s.started = true;
  if (!s.exit_hook) {
    std::atexit(finish_at_exit);
    s.exit_hook = true;
  }
  detail::g_recording.store(true, std::memory_order_release);
}

std::string path() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.started && !s.finished ? s.path : std::string();
}

void finish() noexcept {
  try {
    State& s = state();
    std::vector<std::pair<std::shared_ptr<ThreadLog>, Events>> logs;
    std::string file;
    std::int64_t offset, start_wall;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.started || s.finished) return;
      s.finished = true;
      detail::g_recording.store(false, std::memory_order_release);
      file = s.path;
      offset = s.wall_minus_steady;
      start_wall = s.start_wall;
      for (const auto& log : s.logs) logs.emplace_back(log, Events{});
    }
    for (auto& [log, events] : logs) {
      std::lock_guard<std::mutex> lock(log->mu);
      events.swap(log->events);
    }
    const WorldInfo w = default_world();
    std::size_t count = 0;
    for (const auto& [log, events] : logs) count += events.size();
    // A process that recorded nothing and joined no world (the launcher, phalanx-run, loads
    // the library with its workers' environment) writes nothing: its "rank 0" is no rank.
    if (count == 0 && !w.initialized) return;
    const auto [rank, world] = rank_and_world(w);
    const std::int64_t truncated_ns = g_truncated_ns.load(std::memory_order_relaxed);
    const std::uint64_t budget = g_budget.load(std::memory_order_relaxed);
    std::string other = "\"phalanx_timeline\":1,\"rank\":" + std::to_string(rank) + ",\"world\":" + std::to_string(world) +
                        ",\"events\":" + std::to_string(count) + ",\"max_events\":" + std::to_string(budget);
    if (truncated_ns != 0) other += ",\"truncated\":true";
    std::string error;
    bool ok;
    {
      TraceWriter out(part_path(file, rank), other);
      write_rank(out, rank, offset, logs, truncated_ns, budget);
      logs.clear();  // the events are written: their memory goes before the merge reads the parts
      ok = out.commit(&error);
    }
    if (!ok) {
      std::fprintf(stderr, "phalanx timeline: %s; rank %d's events are lost\n", error.c_str(), rank);
      return;
    }
    try_merge(file, world, rank, start_wall);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phalanx timeline: %s\n", e.what());
  } catch (...) {
  }
}

}  // namespace phalanx::timeline
