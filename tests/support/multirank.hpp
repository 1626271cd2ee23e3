#pragma once
// The multi-rank harness: run a function as W ranks, either as threads in this process
// (over an in-memory store) or as forked processes (real TCP over loopback). Functions
// signal failure by throwing; REQUIRE_RANK gives a message naming the rank.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <phalanx/phalanx.hpp>

#define REQUIRE_RANK(rank, cond, msg)                                                        \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw std::runtime_error(::phalanx::detail::concat("rank ", rank, ": ", #cond, ": ", msg, \
                                                         " (", __FILE__, ":", __LINE__, ")")); \
  } while (0)

namespace phalanx::test {

/// Runs fn(rank) on `world` threads; rethrows the first failure (by rank order).
inline void run_threads(int world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Gloo groups of `world` ranks as threads over one in-memory store.
inline ProcessGroupPtr make_thread_group(const std::string& backend, int rank, int world, StorePtr store,
                                         std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  BackendConfig cfg;
  cfg.rank = rank;
  cfg.size = world;
  cfg.store = store;
  cfg.timeout = timeout;
  return create_process_group(backend, cfg);
}

struct ProcResult {
  int exit_code = -1;  ///< -1 when killed by a signal
  int signal = 0;
};

/// Forks `world` processes running fn(rank) (return value = exit code; an exception prints
/// its message and exits 1). Kills them all after `timeout`. Returns each rank's result.
inline std::vector<ProcResult> run_processes(int world, const std::function<int(int)>& fn,
                                             std::chrono::seconds timeout = std::chrono::seconds(60)) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d failed: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "rank %d failed with an unknown exception\n", r);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<ProcResult> results(world);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] == 0) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
        pids[r] = 0;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t p : pids)
        if (p) ::kill(p, SIGKILL);
      for (int r = 0; r < world; ++r)
        if (pids[r]) {
          int status;
          ::waitpid(pids[r], &status, 0);
          results[r].signal = SIGKILL;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return results;
}

/// Sets the torchrun-style environment of one rank (in a forked child).
inline void set_rank_env(int rank, int world, int port, const std::string& backend = "gloo") {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("PHALANX_BACKEND", backend.c_str(), 1);
}

/// A client of the parent's TCP store (on loopback at `port`), prefixed for one group.
inline StorePtr store_client(int port, const std::string& prefix) {
  TcpStoreOptions o;
  o.port = port;
  return std::make_shared<PrefixStore>(prefix, std::make_shared<TcpStore>(o));
}

/// Runs `fn` on a new thread; returns the message of the exception it threw ("" if none).
inline std::string on_other_thread(const std::function<void()>& fn) {
  std::string error;
  std::thread([&] {
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  return error;
}

}  // namespace phalanx::test
