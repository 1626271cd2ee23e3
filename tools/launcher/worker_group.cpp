#include "worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>

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

struct Stream {
  int fd = -1;
  std::string partial;
  int out_fd;  // 1 or 2
};

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = 0;
  bool exited = false;
  int status = 0;
  Stream out, err;
  std::deque<std::string> tail;
  FILE* log = nullptr;
};

void emit(Worker& w, Stream& s, const std::string& line) {
  const std::string text = "[" + std::to_string(w.rank) + "] " + line + "\n";
  // One write per line: lines of different workers never interleave mid-line.
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(s.out_fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  if (w.log) {
    std::fwrite(line.data(), 1, line.size(), w.log);
    std::fputc('\n', w.log);
    std::fflush(w.log);
  }
  w.tail.push_back(line);
  if (w.tail.size() > kTailLines) w.tail.pop_front();
}

/// Reads what is available; returns false at end of stream.
bool pump(Worker& w, Stream& s) {
  char buf[65536];
  const ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!s.partial.empty()) emit(w, s, s.partial);
    s.partial.clear();
    ::close(s.fd);
    s.fd = -1;
    return false;
  }
  s.partial.append(buf, static_cast<std::size_t>(n));
  std::size_t start = 0, nl;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    emit(w, s, s.partial.substr(start, nl - start));
    start = nl + 1;
  }
  s.partial.erase(0, start);
  return true;
}

std::vector<std::string> worker_env(const LaunchOptions& o, const Worker& w, int master_port,
                                    const std::string& token, int restart_count) {
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
  env["MASTER_PORT"] = std::to_string(master_port);
  env["PHALANX_RESTART_COUNT"] = std::to_string(restart_count);
  env["PHALANX_STORE_HOSTED"] = "1";
  if (!token.empty()) env["PHALANX_RDZV_TOKEN"] = token;
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

Outcome run_workers(const LaunchOptions& o, int master_port, const std::string& token, int restart_count) {
  std::vector<Worker> ws(o.nproc_per_node);
  const std::string program = resolve_program(o.command[0]);
  const pid_t launcher = ::getpid();
  for (int i = 0; i < o.nproc_per_node; ++i) {
    Worker& w = ws[i];
    w.local_rank = i;
    w.rank = o.node_rank * o.nproc_per_node + i;
    if (!o.log_dir.empty()) {
      const std::string path = o.log_dir + "/rank_" + std::to_string(w.rank) + ".log";
      w.log = std::fopen(path.c_str(), restart_count == 0 ? "w" : "a");
      if (!w.log) std::fprintf(stderr, "phalanx-run: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    }
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      std::perror("phalanx-run: pipe");
      std::exit(1);
    }
    // Everything exec needs is prepared before fork: the launcher has threads (the store
    // server), so the child may only call async-signal-safe functions.
    const std::vector<std::string> env = worker_env(o, w, master_port, token, restart_count);
    std::vector<char*> envp, argv;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
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
    w.out = {out[0], {}, 1};
    w.err = {err[0], {}, 2};
  }

  Outcome result;
  int alive = o.nproc_per_node;
  bool stopping = false;
  Clock::time_point kill_at{};
  const int interval_ms = std::max(1, static_cast<int>(o.monitor_interval * 1000));
  std::vector<pollfd> pfds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  for (;;) {
    pfds.clear();
    owners.clear();
    pfds.push_back({g_signal_pipe[0], POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    pfds.push_back({g_child_pipe[0], POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    for (auto& w : ws)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          pfds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
    if (alive == 0 && pfds.size() == 2) break;
    ::poll(pfds.data(), pfds.size(), interval_ms);
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
        signal_all(ws, SIGTERM);
        stopping = true;
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int>(o.grace_period * 1000));
      }
    }
    // Reap first (exit order matters for naming the first failure), then relay output.
    for (auto& w : ws) {
      if (w.exited) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.exited = true;
      w.status = status;
      --alive;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && result.failed_rank < 0 && !result.interrupted) {
        result.failed_rank = w.rank;
        result.failed_pid = w.pid;
        result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        result.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        if (!stopping) {
          for (auto& other : ws)
            if (!other.exited) ++result.stopped_others;
          signal_all(ws, SIGTERM);
          stopping = true;
          kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int>(o.grace_period * 1000));
        }
      }
    }
    for (std::size_t i = 2; i < pfds.size(); ++i)
      if (pfds[i].revents) pump(*owners[i].first, *owners[i].second);
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
            while (::poll(&p, 1, 50) > 0 && pump(w, *s)) {
            }
            if (s->fd >= 0) {
              ::close(s->fd);
              s->fd = -1;
            }
          }
      break;
    }
  }
  for (auto& w : ws) {
    if (w.log) std::fclose(w.log);
    if (w.rank == result.failed_rank) result.tail.assign(w.tail.begin(), w.tail.end());
  }
  result.ok = result.failed_rank < 0 && !result.interrupted;
  return result;
}

}  // namespace phalanx::launcher
