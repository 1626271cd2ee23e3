#pragma once
// Running phalanx-run from tests: start it with its output in a file, wait for it with a
// timeout, read what the workers of tests/support/launcher_worker.cpp left behind.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace launcher_harness {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;


inline std::string make_dir() {
  static int n = 0;
  const std::string d = "/tmp/phalanx_launch_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
  std::system(("rm -rf " + d).c_str());
  ::mkdir(d.c_str(), 0700);
  return d;
}

struct Launch {
  pid_t pid = 0;
  std::string out;  // file holding stdout+stderr
};

/// Starts phalanx-run with `args`, in an environment of its own: PHALANX_TIMEOUT=30, no
/// PHALANX_RDZV_TOKEN unless `env` sets it, default signal dispositions, and the open-files
/// limit `nofile` (soft and hard) when it is > 0.
inline Launch start(const std::vector<std::string>& args, const std::string& dir,
                    const std::vector<std::pair<std::string, std::string>>& env = {}, int nofile = 0) {
  Launch l;
  l.out = dir + "/launcher.out";
  l.pid = ::fork();
  if (l.pid == 0) {
    FILE* f = std::fopen(l.out.c_str(), "ae");  // fds 1 and 2 only
    ::dup2(fileno(f), 1);
    ::dup2(fileno(f), 2);
    std::vector<char*> argv{const_cast<char*>(PHALANX_RUN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::setenv("PHALANX_TIMEOUT", "30", 1);
    ::unsetenv("PHALANX_RDZV_TOKEN");
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (nofile > 0) {
      rlimit r{static_cast<rlim_t>(nofile), static_cast<rlim_t>(nofile)};
      ::setrlimit(RLIMIT_NOFILE, &r);
    }
    ::execv(PHALANX_RUN, argv.data());
    ::_exit(127);
  }
  return l;
}

/// Waits for the launcher; returns its exit code (-1 on timeout, then it is killed).
inline int finish(const Launch& l, std::chrono::seconds timeout = 60s) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(l.pid, &status, WNOHANG) == l.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (Clock::now() > deadline) {
      ::kill(l.pid, SIGKILL);
      ::waitpid(l.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::map<std::string, std::string> read_env(const std::string& path) {
  std::map<std::string, std::string> m;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return m;
}

inline std::vector<pid_t> worker_pids(const std::string& dir, int world, int attempt = 0) {
  std::vector<pid_t> out;
  for (int r = 0; r < world; ++r) {
    std::ifstream f(dir + "/pid_" + std::to_string(r) + "_" + std::to_string(attempt));
    pid_t p = 0;
    if (f >> p) out.push_back(p);
  }
  return out;
}

inline bool all_gone(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (::kill(p, 0) == 0 || errno != ESRCH) return false;
  return true;
}

inline const std::string kWorker = PHALANX_LAUNCHER_WORKER;


/// Waits until `path` contains `text`; false after the timeout.
inline bool wait_for_text(const std::string& path, const std::string& text, std::chrono::seconds timeout = 30s) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (slurp(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

}  // namespace launcher_harness
