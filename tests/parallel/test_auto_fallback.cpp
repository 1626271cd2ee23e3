// `auto` on one host when the shared-memory segment cannot be created (a /dev/shm too small,
// as in a container's 64 MiB default): every rank falls back to gloo together, rank 0 warns
// once naming the shortfall and the fix, and the job runs.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <phalanx/phalanx.hpp>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;

TEST_CASE("auto falls back to gloo on one host when /dev/shm is too small for the segment") {
  if (!backend_available("shm")) return;
  if (::geteuid() != 0) {
    MESSAGE("SKIPPED: needs root (unshare, mount) to give the ranks a 1 MiB /dev/shm");
    return;
  }
  const std::string log = "/tmp/phalanx_auto_fallback_" + std::to_string(::getpid()) + ".log";
  std::fflush(stdout);
  std::fflush(stderr);
  // One child in a mount namespace of its own with a 1 MiB /dev/shm; the ranks are its children.
  const pid_t outer = ::fork();
  if (outer == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") != 0)
      ::_exit(77);
    if (!std::freopen(log.c_str(), "w", stderr)) ::_exit(78);
    TcpStoreServer server(TcpStoreOptions{});
    const int port = server.port();
    const auto results = run_processes(2, [&](int rank) {
      set_rank_env(rank, 2, port, "auto");
      ::setenv("PHALANX_STORE_HOSTED", "1", 1);
      auto pg = parallel::init_process_group();
      if (pg->backend_name() != "gloo") return 3;
      Tensor t = ones({5});
      pg->allreduce(t)->wait();
      if (t.to_vector<float>() != std::vector<float>(5, 2.f)) return 4;
      parallel::destroy_process_group();
      return 0;
    });
    ::_exit(results[0].exit_code == 0 && results[1].exit_code == 0 ? 0 : 10 + results[0].exit_code * 16 + results[1].exit_code);
  }
  int status = 0;
  ::waitpid(outer, &status, 0);
  std::FILE* f = std::fopen(log.c_str(), "r");
  std::string text;
  if (f) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  std::remove(log.c_str());
  INFO(text);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    MESSAGE("SKIPPED: cannot mount a tmpfs in a mount namespace here");
    return;
  }
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(text.find("phalanx: warning: auto: shared memory is unavailable (shm group: rank 0 of 2: /dev/shm has ") !=
        std::string::npos);
  CHECK(text.find("enlarge /dev/shm (docker: --shm-size)); using gloo on this host") != std::string::npos);
  // once, from rank 0
  CHECK(text.find("warning: auto") == text.rfind("warning: auto"));
}
