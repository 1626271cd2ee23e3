// phalanx-run end to end: environment, failures, signals, restarts, concurrent jobs and a
// two-node job simulated with two launchers on loopback.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "tools/launcher_harness.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using namespace launcher_harness;

TEST_CASE("environment propagation for 1, 2 and 4 workers") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    const std::string dir = make_dir();
    const int rc = finish(start({"--nproc-per-node", std::to_string(n), kWorker, "env", dir}, dir));
    INFO(slurp(dir + "/launcher.out"));
    REQUIRE(rc == 0);
    std::string port;
    for (int r = 0; r < n; ++r) {
      auto e = read_env(dir + "/env_" + std::to_string(r));
      CHECK(e["RANK"] == std::to_string(r));
      CHECK(e["LOCAL_RANK"] == std::to_string(r));
      CHECK(e["WORLD_SIZE"] == std::to_string(n));
      CHECK(e["LOCAL_WORLD_SIZE"] == std::to_string(n));
      CHECK(e["MASTER_ADDR"] == "127.0.0.1");
      CHECK(e["PHALANX_RESTART_COUNT"] == "0");
      CHECK(e["OMP_NUM_THREADS"] == "1");
      CHECK(e["OPENBLAS_NUM_THREADS"] == "1");
      CHECK(e["PHALANX_STORE_HOSTED"] == "1");
      CHECK(e["PHALANX_LINE_BUFFERED"] == "1");
      CHECK(e["PYTHONUNBUFFERED"] == "1");
      CHECK(e["TOKEN_LEN"] == "32");
      if (r == 0) port = e["MASTER_PORT"];
      CHECK(e["MASTER_PORT"] == port);
    }
    const std::string out = slurp(dir + "/launcher.out");
    for (int r = 0; r < n; ++r) CHECK(out.find("[" + std::to_string(r) + "] rank " + std::to_string(r) + " done") != std::string::npos);
  }
}

TEST_CASE("a worker that exits 3 while the others wait in a collective") {
  const std::string dir = make_dir();
  const auto t0 = Clock::now();
  const int rc = finish(start({"--nproc-per-node", "3", "--grace-period", "2", kWorker, "fail", "1", "3", dir}, dir));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc == 3);
  CHECK(secs < 15);  // the failure (after ~0.5 s) plus the grace period, well inside it
  CHECK(out.find("rank 1 (pid") != std::string::npos);
  CHECK(out.find("exited with code 3") != std::string::npos);
  CHECK(out.find("| rank 1 going down") != std::string::npos);  // the tail of its output
  CHECK(all_gone(worker_pids(dir, 3)));
}

TEST_CASE("kill -9 of a worker") {
  const std::string dir = make_dir();
  const auto t0 = Clock::now();
  const int rc = finish(start({"--nproc-per-node", "2", "--grace-period", "2", kWorker, "selfkill", "0", dir}, dir));
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc == 128 + SIGKILL);
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 15);
  CHECK(out.find("rank 0 (pid") != std::string::npos);
  CHECK(out.find("killed by signal 9") != std::string::npos);
  CHECK(all_gone(worker_pids(dir, 2)));
}

TEST_CASE("PHALANX_TIMEOUT out of --timeout's range: one line before anything starts, exit 2") {
  const std::string dir = make_dir();
  for (const char* bad : {"1e10", "1e30", "0"}) {
    CAPTURE(bad);
    Launch l = start({"--nproc-per-node", "2", kWorker, "sleep", dir}, dir, {{"PHALANX_TIMEOUT", bad}});
    CHECK(finish(l, 20s) == 2);
    const std::string out = slurp(l.out);
    CHECK(out.find(std::string("phalanx-run: PHALANX_TIMEOUT='") + bad + "' is not a number of seconds in [0.001, 1e+06]") !=
          std::string::npos);
    std::remove(l.out.c_str());
  }
}

TEST_CASE("SIGINT to the launcher stops every worker within the grace period") {
  const std::string dir = make_dir();
  Launch l = start({"--nproc-per-node", "3", "--grace-period", "2", kWorker, "sleep", dir}, dir);
  const auto wait_start = Clock::now();
  while (worker_pids(dir, 3).size() < 3 && Clock::now() - wait_start < 20s) std::this_thread::sleep_for(10ms);
  const auto pids = worker_pids(dir, 3);
  REQUIRE(pids.size() == 3);
  const auto t0 = Clock::now();
  ::kill(l.pid, SIGINT);
  const int rc = finish(l, 20s);
  CHECK(rc == 128 + SIGINT);
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 3);
  CHECK(all_gone(pids));
}

TEST_CASE("--max-restarts 1 with a worker that fails only on its first attempt") {
  const std::string dir = make_dir();
  const int rc = finish(start({"--nproc-per-node", "2", "--max-restarts", "1", kWorker, "fail-once", dir}, dir));
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("restarting the group (restart 1 of 1") != std::string::npos);
  CHECK(out.find("[1] rank 1 done") != std::string::npos);
}

TEST_CASE("two concurrent single-node jobs on one machine both succeed") {
  const std::string a = make_dir(), b = make_dir();
  Launch la = start({"--nproc-per-node", "2", kWorker, "env", a}, a);
  Launch lb = start({"--nproc-per-node", "2", kWorker, "env", b}, b);
  CHECK(finish(la) == 0);
  CHECK(finish(lb) == 0);
  CHECK(read_env(a + "/env_0")["MASTER_PORT"] != read_env(b + "/env_0")["MASTER_PORT"]);
}

TEST_CASE("two launchers simulate two nodes on loopback") {
  int port;
  { phalanx::TcpStoreServer probe(phalanx::TcpStoreOptions{}); port = probe.port(); }
  const std::string dir = make_dir();
  const std::vector<std::string> common = {"--nnodes", "2", "--nproc-per-node", "2", "--master-port",
                                           std::to_string(port), "--rdzv-token", "two-node-test"};
  auto args = [&](int node) {
    std::vector<std::string> a = common;
    a.insert(a.end(), {"--node-rank", std::to_string(node), kWorker, "env", dir});
    return a;
  };
  Launch n1 = start(args(1), dir);  // the second node may start first
  Launch n0 = start(args(0), dir);
  CHECK(finish(n0) == 0);
  CHECK(finish(n1) == 0);
  INFO(slurp(dir + "/launcher.out"));
  for (int r = 0; r < 4; ++r) {
    auto e = read_env(dir + "/env_" + std::to_string(r));
    CHECK(e["RANK"] == std::to_string(r));
    CHECK(e["LOCAL_RANK"] == std::to_string(r % 2));
    CHECK(e["WORLD_SIZE"] == "4");
    CHECK(e["LOCAL_WORLD_SIZE"] == "2");
  }
}

TEST_CASE("invalid options are rejected before anything starts") {
  const std::string dir = make_dir();
  CHECK(finish(start({"--nproc-per-node", "zero", kWorker, "env", dir}, dir)) == 2);
  CHECK(finish(start({"--nnodes", "2", kWorker, "env", dir}, dir)) == 2);  // no --master-port
  CHECK(finish(start({"--nnodes", "2", "--node-rank", "2", "--master-port", "1234", kWorker, "env", dir}, dir)) == 2);
  CHECK(finish(start({"--nproc-per-node", "2", "/nonexistent/program"}, dir)) == 2);
  CHECK(finish(start({"--bogus-flag", "1", kWorker}, dir)) == 2);  // usage errors exit 2, CLI11's too
  CHECK(finish(start({"--max-restarts", "-1", kWorker, "env", dir}, dir)) == 2);
  CHECK(finish(start({"--help"}, dir)) == 0);
  CHECK(worker_pids(dir, 1).empty());  // nothing started
  const std::string out = slurp(dir + "/launcher.out");
  CHECK(out.find("must be a positive integer or 'auto'") != std::string::npos);
  CHECK(out.find("--master-port is required") != std::string::npos);
  CHECK(out.find("not found or not executable") != std::string::npos);
}
