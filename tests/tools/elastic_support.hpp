#pragma once
// What the elastic tests (test_elastic.cpp: launchers on loopback posing as nodes;
// test_netns_elastic.cpp: launchers in network namespaces) share: a launcher process, its
// end, a reaper for a failed REQUIRE, and waits on its output and its checkpoint folder.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "trainer_harness.hpp"

namespace elastic_test {

using Clock = std::chrono::steady_clock;

/// A launcher started by the test, its output in `out`.
struct Launcher {
  pid_t pid = -1;
  std::string out;
};

/// Its exit code (128 + N for signal N), or -1 when it is still running after `limit` (then
/// it is killed).
inline int finish(Launcher& l, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  int status = 0;
  while (Clock::now() < end) {
    if (::waitpid(l.pid, &status, WNOHANG) == l.pid) {
      l.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(l.pid, SIGKILL);
  ::waitpid(l.pid, &status, 0);
  l.pid = -1;
  return -1;
}

/// Kills the launchers a failed REQUIRE leaves behind (their workers die with them).
struct Reaper {
  std::vector<Launcher*> ls;
  /// Kills and reaps the launchers still running (their workers die with them: PDEATHSIG).
  void reap() {
    for (Launcher* l : ls)
      if (l->pid > 0 && ::kill(l->pid, SIGKILL) == 0) {
        ::waitpid(l->pid, nullptr, 0);
        l->pid = -1;
      }
  }
  ~Reaper() { reap(); }
};

/// Removes a case's folder. A worker killed a moment ago may still be renaming a checkpoint
/// there (PDEATHSIG is asynchronous): a file that vanishes under remove_all is retried, never
/// an error of the case.
inline void remove_case_dir(const std::string& d) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
    if (!ec) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

inline bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// Waits until `path` holds `what` after byte `from`; false after `limit`.
inline bool wait_for(const std::string& path, const std::string& what, std::chrono::milliseconds limit,
                     std::size_t from = 0) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    const std::string s = trainer_test::slurp(path);
    if (s.size() > from && s.find(what, from) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

/// The folder holds a checkpoint-* file.
inline bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) return true;
  return false;
}

}  // namespace elastic_test
