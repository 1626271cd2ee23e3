#include "worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>

#include "failure_records.hpp"
#include "output_relay.hpp"

extern char** environ;

namespace phalanx::launcher {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kTailLines = 20;

int g_signal_pipe[2] = {-1, -1};
int g_child_pipe[2] = {-1, -1};
volatile sig_atomic_t g_last_signal = 0;

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

void write_all(int fd, const std::string& text) {
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
}

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
    w.tail.push_back(text);
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

void signal_all(std::vector<Worker>& ws, int sig) {
  for (auto& w : ws)
    if (!w.exited) {
      w.sent_signals |= 1u << sig;
      if (::kill(-w.pid, sig) != 0) ::kill(w.pid, sig);  // its process group, else itself
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
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  struct sigaction sc {};
  sc.sa_handler = on_child;
  sigemptyset(&sc.sa_mask);
  sc.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sc, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

Outcome run_workers(const LaunchOptions& o, const Attempt& a) {
  std::vector<Worker> ws(o.nproc_per_node);
  const std::string program = resolve_program(o.command[0]);
  const pid_t launcher = ::getpid();
  for (int i = 0; i < o.nproc_per_node; ++i) {
    Worker& w = ws[i];
    w.local_rank = i;
    w.rank = o.node_rank * o.nproc_per_node + i;
    if (!o.log_dir.empty()) {
      const std::string path = o.log_dir + "/rank_" + std::to_string(w.rank) + ".log";
      w.log = std::fopen(path.c_str(), a.restart_count == 0 ? "w" : "a");
      if (!w.log) std::fprintf(stderr, "phalanx-run: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    }
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      std::perror("phalanx-run: pipe");
      std::exit(1);
    }
    // Everything exec needs is prepared before fork: the launcher has threads (the store
    // server), so the child may only call async-signal-safe functions.
    const std::vector<std::string> env = worker_env(o, w, a);
    std::vector<char*> envp, argv;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    for (const auto& arg : o.command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("phalanx-run: fork");
      std::exit(1);
    }
    if (pid == 0) {
      ::setpgid(0, 0);                       // its own group: stopping it stops its children
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);    // no orphans if the launcher itself is killed
      if (::getppid() != launcher) ::_exit(127);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(program.c_str(), argv.data(), envp.data());
      const char msg[] = "phalanx-run: exec failed\n";
      if (::write(2, msg, sizeof msg - 1) < 0) {
      }
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(out[1]);
    ::close(err[1]);
    w.pid = pid;
    w.out.fd = out[0];
    w.out.out_fd = 1;
    w.err.fd = err[0];
    w.err.out_fd = 2;
  }

  Outcome result;
  Relay relay(a.progress_passthrough);
  std::vector<WorkerFailure> failures;
  int alive = o.nproc_per_node;
  bool stopping = false;
  int round = 0;
  Clock::time_point kill_at{};
  const auto interval = std::chrono::milliseconds(std::max(1, static_cast<int>(o.monitor_interval * 1000)));
  auto stop_all = [&] {
    for (auto& other : ws)
      if (!other.exited) ++result.stopped_others;
    signal_all(ws, SIGTERM);
    stopping = true;
    kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int>(o.grace_period * 1000));
  };
  std::vector<pollfd> pfds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  for (;; ++round) {
    pfds.clear();
    owners.clear();
    pfds.push_back({g_signal_pipe[0], POLLIN, 0});
    pfds.push_back({g_child_pipe[0], POLLIN, 0});
    pfds.push_back({stopping ? -1 : a.stop_fd, POLLIN, 0});  // negative fds are ignored
    for (auto& w : ws)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          pfds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
    if (alive == 0 && owners.empty()) break;
    const auto now = Clock::now();
    auto wait = interval;
    if (relay.next_due() != Clock::time_point::max())
      wait = std::min(wait, std::max(std::chrono::milliseconds(1),
                                     std::chrono::duration_cast<std::chrono::milliseconds>(relay.next_due() - now)));
    ::poll(pfds.data(), pfds.size(), static_cast<int>(wait.count()));
    if (pfds[1].revents & POLLIN) {
      char b[64];
      while (::read(g_child_pipe[0], b, sizeof b) > 0) {
      }
    }
    if (pfds[0].revents & POLLIN) {
      char b[16];
      while (::read(g_signal_pipe[0], b, sizeof b) > 0) {
      }
      if (!result.interrupted) {
        result.interrupted = true;
        result.signal_received = g_last_signal;
        if (!stopping) stop_all();
      }
    }
    if (pfds[2].revents && !stopping) {
      result.stopped_because = a.stop_reason ? a.stop_reason() : "stopped from outside this node";
      stop_all();
    }
    // Reap every worker that has exited (one poll round), then relay output.
    const std::size_t first_new = failures.size();
    for (auto& w : ws) {
      if (w.exited) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.exited = true;
      --alive;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      WorkerFailure f;
      f.node = o.node_rank;
      f.rank = w.rank;
      f.pid = w.pid;
      f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
      f.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      f.signal_from_launcher = f.term_signal != 0 && f.term_signal < 32 && (w.sent_signals >> f.term_signal & 1u);
      f.after_stop = stopping;
      f.reap_round = round;
      f.unix_ns = unix_now_ns();
      failures.push_back(f);
    }
    if (failures.size() > first_new && !stopping) {
      // This node's first failure: the first of this round (one the launcher did not cause).
      const std::vector<WorkerFailure> fresh(failures.begin() + first_new, failures.end());
      WorkerFailure first = fresh[pick_blamed(fresh)];
      const bool store_ok = a.store && !(a.store_lost && a.store_lost());
      if (first.term_signal != 0 && store_ok && post_first_failure(*a.store, a.restart_count, first)) {
        for (auto& f : failures)
          if (f.rank == first.rank) f.is_first = true;
      }
      if (a.on_first_failure) a.on_first_failure(first);
      stop_all();
    }
    for (std::size_t i = 3; i < pfds.size(); ++i)
      if (pfds[i].revents) pump(relay, *owners[i - 3].first, *owners[i - 3].second);
    relay.flush();
    if (stopping && alive > 0 && Clock::now() >= kill_at) {
      signal_all(ws, SIGKILL);
      kill_at = Clock::now() + std::chrono::hours(1);
    }
    if (alive == 0) {
      // Every worker is gone; a grandchild may still hold a pipe open: drain briefly.
      for (auto& w : ws)
        for (Stream* s : {&w.out, &w.err})
          if (s->fd >= 0) {
            pollfd p{s->fd, POLLIN, 0};
            while (::poll(&p, 1, 50) > 0 && pump(relay, w, *s)) {
            }
            if (s->fd >= 0) {
              std::vector<LineSplitter::Event> evs;
              s->splitter.finish(evs);
              relay.events(w, *s, evs);
              ::close(s->fd);
              s->fd = -1;
            }
          }
      relay.flush();
      break;
    }
  }
  // Blame with what the ranks themselves said (their failure records), when they said it.
  auto store_ok = [&] { return a.store && !(a.store_lost && a.store_lost()); };
  for (auto& f : failures)
    if (!store_ok() || !read_failure_record(*a.store, a.restart_count, f)) break;
  const int blamed = pick_blamed(failures);
  if (blamed >= 0 && !result.interrupted) {
    result.blamed = failures[blamed];
    for (auto& w : ws)
      if (w.rank == result.blamed->rank) result.tail.assign(w.tail.begin(), w.tail.end());
  }
  for (auto& w : ws)
    if (w.log) std::fclose(w.log);
  result.ok = !result.blamed && !result.interrupted && result.stopped_because.empty();
  return result;
}

}  // namespace phalanx::launcher
