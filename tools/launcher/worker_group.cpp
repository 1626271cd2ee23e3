#include "worker_group.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <thread>

#include <phalanx/core/error.hpp>
#include <phalanx/core/file_safety.hpp>

#include "failure_records.hpp"
#include "output_relay.hpp"

extern char** environ;

namespace phalanx::launcher {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kTailLines = 20;
constexpr std::size_t kTailLineBytes = 4096;  // a tail line longer than this is cut
constexpr auto kDrainLimit = std::chrono::milliseconds(1000);

int g_signal_pipe[2] = {-1, -1};
int g_child_pipe[2] = {-1, -1};
volatile sig_atomic_t g_last_signal = 0;
rlimit g_nofile_start{};                 // RLIMIT_NOFILE when the launcher started
bool g_nofile_raised = false;

void on_signal(int sig) {
  g_last_signal = sig;
  const char b = static_cast<char>(sig);
  if (::write(g_signal_pipe[1], &b, 1) < 0) {
  }
}

// Wakes the run loop the moment a worker exits, so the first failure is seen first (a
// worker that exits on purpose makes its peers fail moments later).
void on_child(int) {
  const char b = 1;
  if (::write(g_child_pipe[1], &b, 1) < 0) {
  }
}

/// The launcher's stdout and stderr for worker output: written from threads of their own,
/// so an unread terminal or pipe never holds up the loop (they live as long as the process).
OutputWriter& out_writer(int fd) {
  static OutputWriter* out = new OutputWriter(1);
  static OutputWriter* err = new OutputWriter(2);
  return fd == 1 ? *out : *err;
}

void write_all(int fd, std::string text) { out_writer(fd).write(std::move(text)); }

struct Stream {
  int fd = -1;
  int out_fd = 1;  // 1 or 2
  LineSplitter splitter;
};

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = 0;
  bool exited = false;
  unsigned sent_signals = 0;  // bit s: the launcher sent it signal s
  Stream out, err;
  std::deque<std::string> tail;
  FILE* log = nullptr;
};

std::string cut_line(const std::string& text) {
  return text.substr(0, kTailLineBytes) + " [... " + std::to_string(text.size() - kTailLineBytes) + " more bytes]";
}

/// Writes worker output: lines prefixed with the rank (one write() each, so lines of
/// different workers never interleave mid-line), rank 0's redraws through the relay.
class Relay {
 public:
  explicit Relay(bool passthrough)
      : progress_(passthrough ? std::make_unique<ProgressRelay>([](const std::string& s) { write_all(1, s); })
                              : nullptr) {}

  void events(Worker& w, Stream& s, const std::vector<LineSplitter::Event>& evs) {
    const bool bar_stream = progress_ && w.rank == 0 && s.out_fd == 1;
    for (const auto& e : evs) {
      if (e.progress) {
        if (bar_stream) progress_->update(e.text, Clock::now());
        continue;  // redraws never reach logs or the tail; the line they end in does
      }
      if (progress_) {
        progress_->before_line();
        if (bar_stream) progress_->end_bar();
      }
      line(w, s, e.text);
    }
  }
  void flush() {
    if (progress_) progress_->flush(Clock::now());
  }
  Clock::time_point next_due() const { return progress_ ? progress_->next_due() : Clock::time_point::max(); }

 private:
  static void line(Worker& w, Stream& s, const std::string& text) {
    write_all(s.out_fd, "[" + std::to_string(w.rank) + "] " + text + "\n");
    if (w.log) {
      std::fwrite(text.data(), 1, text.size(), w.log);
      std::fputc('\n', w.log);
      std::fflush(w.log);
    }
    w.tail.push_back(text.size() <= kTailLineBytes ? text : cut_line(text));
    if (w.tail.size() > kTailLines) w.tail.pop_front();
  }
  std::unique_ptr<ProgressRelay> progress_;
};

/// Reads what is available; returns false at end of stream.
bool pump(Relay& relay, Worker& w, Stream& s) {
  char buf[65536];
  const ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  std::vector<LineSplitter::Event> evs;
  if (n <= 0) {
    s.splitter.finish(evs);
    relay.events(w, s, evs);
    ::close(s.fd);
    s.fd = -1;
    return false;
  }
  s.splitter.feed(buf, static_cast<std::size_t>(n), evs);
  relay.events(w, s, evs);
  return true;
}

std::vector<std::string> worker_env(const LaunchOptions& o, const Worker& w, const Attempt& a) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  env["RANK"] = std::to_string(w.rank);
  env["LOCAL_RANK"] = std::to_string(w.local_rank);
  env["WORLD_SIZE"] = std::to_string(o.nnodes * o.nproc_per_node);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(o.node_rank);
  env["MASTER_ADDR"] = o.master_addr;
  env["MASTER_PORT"] = std::to_string(a.master_port);
  env["PHALANX_RESTART_COUNT"] = std::to_string(a.restart_count);
  if (o.elastic_job) env["PHALANX_ELASTIC"] = "1";  // the world size may change between rounds
  env["PHALANX_STORE_HOSTED"] = "1";
  // Live output: stdout line-buffered in Phalanx programs (and Python), so lines arrive as
  // they are written and a crashing worker's last lines are not lost.
  env["PHALANX_LINE_BUFFERED"] = "1";
  env["PYTHONUNBUFFERED"] = "1";
  if (a.progress_passthrough && w.rank == 0) env["PHALANX_PROGRESS"] = "1";
  if (!a.token.empty()) env["PHALANX_RDZV_TOKEN"] = a.token;
  if (!o.backend.empty()) env["PHALANX_BACKEND"] = o.backend;
  if (o.timeout > 0) env["PHALANX_TIMEOUT"] = std::to_string(o.timeout);
  // One compute thread per worker unless the user chose otherwise.
  env.emplace("OMP_NUM_THREADS", "1");
  env.emplace("OPENBLAS_NUM_THREADS", "1");
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

/// Signals every worker's process group, also of a worker that has exited (what it started
/// may still run there); a worker that has not exited, itself when its group is gone.
void signal_all(std::vector<Worker>& ws, int sig) {
  for (auto& w : ws) {
    if (w.pid <= 0) continue;
    if (w.exited) {
      ::kill(-w.pid, sig);
      continue;
    }
    w.sent_signals |= 1u << sig;
    if (::kill(-w.pid, sig) != 0) ::kill(w.pid, sig);
  }
}

/// The launcher's children that are not workers: descendants adopted by it (it is a child
/// subreaper) after their parent exited, e.g. a daemon a worker started with setsid.
std::vector<pid_t> adopted_children(const std::vector<Worker>& ws) {
  std::vector<pid_t> out;
  const pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE* f = std::fopen(path, "re");
    if (!f) continue;
    char buf[512];
    const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* close = std::strrchr(buf, ')');  // the name may hold spaces and ')'
    int ppid = 0;
    if (close && std::sscanf(close + 1, " %*c %d", &ppid) == 1 && ppid == self) {
      bool worker = false;
      for (const auto& w : ws) worker = worker || (w.pid == pid && !w.exited);
      if (!worker) out.push_back(static_cast<pid_t>(pid));
    }
  }
  ::closedir(d);
  return out;
}

/// The end of an attempt: nothing a worker started may outlive it. SIGKILL to every
/// worker's process group and to every adopted descendant, and reap them (bounded).
void kill_leftovers(std::vector<Worker>& ws) {
  signal_all(ws, SIGKILL);
  const auto deadline = Clock::now() + std::chrono::milliseconds(500);
  for (;;) {
    for (pid_t p : adopted_children(ws)) ::kill(p, SIGKILL);
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (adopted_children(ws).empty() || Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

void install_signal_handlers() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || ::pipe2(g_child_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::sigaction(sig, &sa, nullptr);
  struct sigaction sc {};
  sc.sa_handler = on_child;
  sigemptyset(&sc.sa_mask);
  sc.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sc, nullptr);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  // Workers inherit SIGPIPE ignored (as Python programs run it): Gloo writes to its sockets
  // without MSG_NOSIGNAL, so with the default a worker whose peer died would die of
  // SIGPIPE instead of reporting the peer's failure (and be blamed for it).
  ::sigaction(SIGPIPE, &ign, nullptr);
  // Descendants whose parent exits are adopted by the launcher, so that none outlives its
  // attempt (kill_leftovers); and the fds a large group needs (3 per worker, and the store's).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    g_nofile_start = nofile;
    nofile.rlim_cur = nofile.rlim_max;
    g_nofile_raised = ::setrlimit(RLIMIT_NOFILE, &nofile) == 0;
  }
}

int signal_fd() { return g_signal_pipe[0]; }

int take_signal() {
  char b[16];
  bool got = false;
  while (::read(g_signal_pipe[0], b, sizeof b) > 0) got = true;
  return got ? static_cast<int>(g_last_signal) : 0;
}

namespace {

/// One attempt's workers and what the launcher knows of them while it runs.
struct Group {
  Group(const LaunchOptions& o, const Attempt& a) : o(o), a(a), ws(o.nproc_per_node), relay(a.progress_passthrough) {}
  const LaunchOptions& o;
  const Attempt& a;
  std::vector<Worker> ws;
  Outcome result;
  std::vector<WorkerFailure> failures;  ///< every worker that ended otherwise than by exiting 0
  Relay relay;
  int alive = 0;          ///< workers started and not reaped yet
  bool stopping = false;  ///< the launcher began stopping the workers
  Clock::time_point kill_at{};

  bool store_ok() const { return a.store && !(a.store_lost && a.store_lost()); }
};

// ---- spawn ----------------------------------------------------------------------------

/// DIR/rank_<r>.log for --log-dir: written anew in round 0, appended to on a restart.
void open_log(const LaunchOptions& o, const Attempt& a, Worker& w) {
  const std::string path = o.log_dir + "/rank_" + std::to_string(w.rank) + ".log";
  try {  // never through a symbolic link (another user's, planted in a shared --log-dir); close-on-exec
    const int fd = files::open_output(path, a.restart_count != 0);
    w.log = ::fdopen(fd, a.restart_count == 0 ? "w" : "a");
    if (!w.log) {
      std::fprintf(stderr, "phalanx-run: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
      ::close(fd);
    }
  } catch (const IoError& e) {
    std::fprintf(stderr, "phalanx-run: cannot write %s\n", e.what());
  }
}

/// The child, between fork and exec: async-signal-safe calls only (the launcher has threads).
[[noreturn]] void exec_worker(const std::string& program, char** argv, char** envp, const sigset_t& old,
                              pid_t launcher, int out_fd, int err_fd) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction cur {};
    if (sig == SIGKILL || sig == SIGSTOP || ::sigaction(sig, nullptr, &cur) != 0) continue;
    if (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN) ::sigaction(sig, &dfl, nullptr);
  }
  if (g_nofile_raised) ::setrlimit(RLIMIT_NOFILE, &g_nofile_start);
  ::setpgid(0, 0);                       // its own group: stopping it stops its children
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);    // no orphans if the launcher itself is killed
  if (::getppid() != launcher) ::_exit(127);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);  // a signal sent meanwhile lands here now
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  ::execve(program.c_str(), argv, envp);
  const char msg[] = "phalanx-run: exec failed\n";
  if (::write(2, msg, sizeof msg - 1) < 0) {
  }
  ::_exit(127);
}

/// Forks and execs worker w with its output on pipes; false with `error` set (its fds closed).
bool start_worker(const LaunchOptions& o, const Attempt& a, const std::string& program, Worker& w,
                  std::string& error) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    error = "cannot start rank " + std::to_string(w.rank) + ": pipe: " + std::strerror(errno) +
            (errno == EMFILE || errno == ENFILE ? " (raise the open-files limit, ulimit -n)" : "");
    for (int fd : {out[0], out[1]})
      if (fd >= 0) ::close(fd);
    return false;
  }
  // Everything exec needs is prepared before fork: the launcher has threads (the store
  // server), so the child may only call async-signal-safe functions.
  const std::vector<std::string> env = worker_env(o, w, a);
  std::vector<char*> envp, argv;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  for (const auto& arg : o.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  // Signals are blocked across fork: until the child has put every handler back to the
  // default, a signal for it must not run the launcher's handlers (which write into the
  // launcher's pipes, shared with the child until exec).
  sigset_t all, old;
  sigfillset(&all);
  const pid_t launcher = ::getpid();
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) exec_worker(program, argv.data(), envp.data(), old, launcher, out[1], err[1]);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    error = "cannot start rank " + std::to_string(w.rank) + ": fork: " + std::strerror(fork_errno);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return false;
  }
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  w.pid = pid;
  w.exited = false;
  w.out.fd = out[0];
  w.out.out_fd = 1;
  w.err.fd = err[0];
  w.err.out_fd = 2;
  return true;
}

/// Starts the node's workers in local rank order; the first one that cannot start ends it
/// (result.launch_error), the ones already started run on until stopped.
void spawn_workers(Group& g) {
  const LaunchOptions& o = g.o;
  const std::string program = resolve_program(o.command[0]);
  for (int i = 0; i < o.nproc_per_node; ++i) {
    Worker& w = g.ws[i];
    w.local_rank = i;
    w.rank = o.node_rank * o.nproc_per_node + i;
    w.exited = true;  // until it runs
  }
  for (Worker& w : g.ws) {
    if (!o.log_dir.empty()) open_log(o, g.a, w);
    if (!start_worker(o, g.a, program, w, g.result.launch_error)) break;
    ++g.alive;
  }
}

// ---- watch ----------------------------------------------------------------------------

/// A failure here: SIGTERM and --grace-period. A stop asked for (a signal to the launcher,
/// or another node's launcher stopping the round): the stop signal and --term-timeout, for
/// the workers to save.
void stop_all(Group& g, int sig, double seconds) {
  for (auto& other : g.ws)
    if (!other.exited) ++g.result.stopped_others;
  signal_all(g.ws, sig);
  g.stopping = true;
  g.kill_at = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

void stop_for_failure(Group& g) { stop_all(g, SIGTERM, g.o.grace_period); }

void stop_on_request(Group& g, int got) {
  const int sig = g.o.term_signal ? g.o.term_signal : (got == SIGHUP || got == SIGQUIT ? SIGTERM : got);
  stop_all(g, sig, g.o.term_timeout);
}

/// The first stop signal the launcher got is the attempt's (and starts the stop).
void take_signal_once(Group& g) {
  const int sig = take_signal();
  if (sig != 0 && !g.result.interrupted) {
    g.result.interrupted = true;
    g.result.signal_received = sig;
    if (!g.stopping) stop_on_request(g, sig);
  }
}

/// Reaps every worker that has exited (in one poll round, `round`) and records its failure;
/// the node's first failure is posted (failure/first, on_first_failure) and stops the others.
void reap_exited(Group& g, int round) {
  const std::size_t first_new = g.failures.size();
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);  // also adopted descendants
    if (pid <= 0) break;
    auto it = std::find_if(g.ws.begin(), g.ws.end(), [&](const Worker& w) { return w.pid == pid && !w.exited; });
    if (it == g.ws.end()) continue;
    Worker& w = *it;
    w.exited = true;
    --g.alive;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      ++g.result.exited_ok;
      continue;
    }
    // Stopped on request after saving (parallel::kExitStoppedAfterSave): not a failure,
    // also when the signal reached the workers and not this launcher (srun, kill).
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitStoppedAfterSave) {
      ++g.result.stopped_after_save;
      continue;
    }
    WorkerFailure f;
    f.node = g.o.node_rank;
    f.rank = w.rank;
    f.pid = w.pid;
    f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    f.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    f.signal_from_launcher = f.term_signal != 0 && f.term_signal < 32 && (w.sent_signals >> f.term_signal & 1u);
    f.after_stop = g.stopping;
    f.reap_round = round;
    f.unix_ns = unix_now_ns();
    g.failures.push_back(f);
  }
  if (g.failures.size() > first_new && !g.stopping) {
    // This node's first failure: the first of this round (one the launcher did not cause).
    const std::vector<WorkerFailure> fresh(g.failures.begin() + first_new, g.failures.end());
    WorkerFailure first = fresh[pick_blamed(fresh)];
    if (first.term_signal != 0 && g.store_ok() && post_first_failure(*g.a.store, g.a.restart_count, first)) {
      for (auto& f : g.failures)
        if (f.rank == first.rank) f.is_first = true;
    }
    if (g.a.on_first_failure) g.a.on_first_failure(first);
    stop_for_failure(g);
  }
}

/// The open output pipes, after `pfds`' fixed entries; `owners[i]` is the worker and
/// stream of the i-th.
void poll_streams(std::vector<Worker>& ws, std::vector<pollfd>& pfds,
                  std::vector<std::pair<Worker*, Stream*>>& owners) {
  for (auto& w : ws)
    for (Stream* s : {&w.out, &w.err})
      if (s->fd >= 0) {
        pfds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&w, s);
      }
}

/// Until every worker has exited and closed its output: relays output, reaps, stops the
/// workers at the first failure or when asked to (a signal, stop_fd), and kills them at
/// the stop's deadline.
void watch_workers(Group& g) {
  const auto interval = std::chrono::milliseconds(std::max(1, static_cast<int>(g.o.monitor_interval * 1000)));
  std::vector<pollfd> pfds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  for (int round = 0;; ++round) {
    pfds.clear();
    owners.clear();
    pfds.push_back({g_signal_pipe[0], POLLIN, 0});
    pfds.push_back({g_child_pipe[0], POLLIN, 0});
    pfds.push_back({g.stopping ? -1 : g.a.stop_fd, POLLIN, 0});  // negative fds are ignored
    poll_streams(g.ws, pfds, owners);
    if (g.alive == 0 && owners.empty()) break;
    const auto now = Clock::now();
    auto wait = interval;
    if (g.relay.next_due() != Clock::time_point::max())
      wait = std::min(wait, std::max(std::chrono::milliseconds(1),
                                     std::chrono::duration_cast<std::chrono::milliseconds>(g.relay.next_due() - now)));
    ::poll(pfds.data(), pfds.size(), static_cast<int>(wait.count()));
    if (pfds[1].revents & POLLIN) {
      char b[64];
      while (::read(g_child_pipe[0], b, sizeof b) > 0) {
      }
    }
    if (pfds[0].revents & POLLIN) take_signal_once(g);
    if (pfds[2].revents && !g.stopping) {
      g.result.stopped_because = g.a.stop_reason ? g.a.stop_reason() : "stopped from outside this node";
      stop_on_request(g, SIGTERM);
    }
    // Reap every worker that has exited (one poll round), then relay output.
    reap_exited(g, round);
    for (std::size_t i = 3; i < pfds.size(); ++i)
      if (pfds[i].revents) pump(g.relay, *owners[i - 3].first, *owners[i - 3].second);
    g.relay.flush();
    if (g.stopping && g.alive > 0 && Clock::now() >= g.kill_at) {
      g.result.killed_at_deadline = g.alive;
      signal_all(g.ws, SIGKILL);
      g.kill_at = Clock::now() + std::chrono::hours(1);
    }
    if (g.alive == 0) break;
  }
}

// ---- drain ----------------------------------------------------------------------------

/// Every worker is gone; what they started may still hold a pipe open (and write on): its
/// output is relayed for at most kDrainLimit, then it is killed with the worker groups and
/// what is left in the pipes is relayed.
void drain_output(Group& g) {
  std::vector<pollfd> pfds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  const auto drain_until = Clock::now() + kDrainLimit;
  for (;;) {
    pfds.clear();
    owners.clear();
    pfds.push_back({g_signal_pipe[0], POLLIN, 0});
    poll_streams(g.ws, pfds, owners);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(drain_until - Clock::now());
    if (owners.empty() || left.count() <= 0) break;
    ::poll(pfds.data(), pfds.size(), static_cast<int>(std::min<std::int64_t>(left.count(), 50)));
    if (pfds[0].revents & POLLIN) {
      take_signal_once(g);
      break;
    }
    for (std::size_t i = 1; i < pfds.size(); ++i)
      if (pfds[i].revents) pump(g.relay, *owners[i - 1].first, *owners[i - 1].second);
  }
  kill_leftovers(g.ws);
  for (auto& w : g.ws)
    for (Stream* s : {&w.out, &w.err})
      if (s->fd >= 0) {
        // Its writers are gone: what is left in the pipe, then end of stream (bounded, in
        // case one escaped).
        ::fcntl(s->fd, F_SETFL, ::fcntl(s->fd, F_GETFL) | O_NONBLOCK);
        for (int reads = 0; reads < 64 && s->fd >= 0; ++reads) {
          pollfd p{s->fd, POLLIN, 0};
          if (::poll(&p, 1, 0) <= 0 || !pump(g.relay, w, *s)) break;
        }
        if (s->fd >= 0) {
          std::vector<LineSplitter::Event> evs;
          s->splitter.finish(evs);
          g.relay.events(w, *s, evs);
          ::close(s->fd);
          s->fd = -1;
        }
      }
  g.relay.flush();
  // The launcher's own lines come next: the workers' go first, unless the reader is stuck.
  for (int fd : {1, 2}) out_writer(fd).flush(std::chrono::milliseconds(1000));
}

// ---- blame ----------------------------------------------------------------------------

/// The worker to blame, with what the ranks themselves said (their failure records, when
/// they said it), and its last lines; then how the attempt ended.
void blame(Group& g) {
  Outcome& result = g.result;
  for (auto& f : g.failures)
    if (!g.store_ok() || !read_failure_record(*g.a.store, g.a.restart_count, f)) break;
  const int blamed = pick_blamed(g.failures);
  if (blamed >= 0 && !result.interrupted && result.launch_error.empty()) {  // not the ones it stopped
    result.blamed = g.failures[blamed];
    for (auto& w : g.ws)
      if (w.rank == result.blamed->rank) result.tail.assign(w.tail.begin(), w.tail.end());
  }
  for (auto& w : g.ws)
    if (w.log) std::fclose(w.log);
  result.ok = !result.blamed && !result.interrupted && result.stopped_because.empty() && result.launch_error.empty() &&
              result.stopped_after_save == 0;
}

}  // namespace

Outcome run_workers(const LaunchOptions& o, const Attempt& a) {
  Group g(o, a);
  spawn_workers(g);
  if (!g.result.launch_error.empty()) stop_for_failure(g);  // a round that cannot start fails whole
  watch_workers(g);
  drain_output(g);
  blame(g);
  return g.result;
}

}  // namespace phalanx::launcher
