// phalanx-run under faults and on a terminal: blame when a rank is killed (also while the
// launcher is paused), live and crash output, rank 0's progress bar through a pty, --log-dir,
// and restarts that two launchers (two nodes on loopback) agree on.
#include <doctest/doctest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "tools/launcher_harness.hpp"

using namespace launcher_harness;

namespace {

bool wait_ready(const std::string& dir, int world, int attempt = 0, std::chrono::seconds timeout = 30s) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int ready = 0;
    for (int r = 0; r < world; ++r)
      if (std::ifstream(dir + "/ready_" + std::to_string(r) + "_" + std::to_string(attempt))) ++ready;
    if (ready == world) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
}

int free_port() {
  phalanx::TcpStoreServer probe(phalanx::TcpStoreOptions{});
  return probe.port();
}

/// One trial: kill -9 a random rank of a 4-worker job; with `pause`, the launcher is
/// stopped while it happens and while the survivors exit. Returns the victim.
int blame_trial(bool pause, std::mt19937& rng, std::string& out, int& rc) {
  const std::string dir = make_dir();
  Launch l = start({"--nproc-per-node", "4", "--grace-period", "2", kWorker, "spin", dir}, dir);
  REQUIRE(wait_ready(dir, 4));
  const auto pids = worker_pids(dir, 4);
  REQUIRE(pids.size() == 4);
  const int victim = std::uniform_int_distribution<int>(0, 3)(rng);
  if (pause) ::kill(l.pid, SIGSTOP);
  ::kill(pids[victim], SIGKILL);
  if (pause) {
    // Long enough for every survivor to lose its peer and exit 1 while nobody reaps.
    std::this_thread::sleep_for(1500ms);
    ::kill(l.pid, SIGCONT);
  }
  rc = finish(l, 60s);
  out = slurp(l.out);
  CHECK(all_gone(pids));
  return victim;
}

}  // namespace

TEST_CASE("blame: the rank killed with SIGKILL is named, also when the launcher was paused") {
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (bool pause : {false, true})
    for (int trial = 0; trial < 3; ++trial) {
      CAPTURE(pause);
      CAPTURE(trial);
      std::string out;
      int rc = 0;
      const int victim = blame_trial(pause, rng, out, rc);
      INFO(out);
      CHECK(rc == 128 + SIGKILL);
      CHECK(out.find("phalanx-run: rank " + std::to_string(victim) + " (pid") != std::string::npos);
      CHECK(out.find("killed by signal 9") != std::string::npos);
    }
}

TEST_CASE("live output: a line shows before the worker exits") {
  const std::string dir = make_dir();
  Launch l = start({"--nproc-per-node", "2", "--grace-period", "1", kWorker, "print-sleep", dir}, dir);
  // The workers print and then sleep for 60 s: block buffering would hold the lines until exit.
  CHECK(wait_for_text(l.out, "[0] rank 0 is up", 30s));
  CHECK(wait_for_text(l.out, "[1] rank 1 is up", 30s));
  ::kill(l.pid, SIGINT);
  CHECK(finish(l, 20s) == 128 + SIGINT);
}

TEST_CASE("uneven inputs: a rank that finished cleanly is not blamed; the summary says the others had ended") {
  const std::string dir = make_dir();
  const int rc = finish(start({"--nproc-per-node", "2", kWorker, "uneven", dir}, dir), 60s);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("phalanx-run: rank 0 (pid ") != std::string::npos);
  CHECK(out.find("rank 1 finished") != std::string::npos);
  CHECK(out.find("parallel::Join") != std::string::npos);
  CHECK(out.find("the other worker on this node had already ended") != std::string::npos);
  CHECK(out.find("stopped the other 0") == std::string::npos);
}

TEST_CASE("a crashing worker's last lines are in the failure summary") {
  for (const std::string how : {"abort", "segv"}) {
    CAPTURE(how);
    const std::string dir = make_dir();
    const int rc = finish(start({"--nproc-per-node", "1", kWorker, "print-crash", how, dir}, dir));
    const std::string out = slurp(dir + "/launcher.out");
    INFO(out);
    CHECK(rc == 128 + (how == "abort" ? SIGABRT : SIGSEGV));
    CHECK(out.find("  | rank 0 about to crash\n  | the last words of rank 0") != std::string::npos);
  }
}

TEST_CASE("rank 0's progress bar is redrawn in place on a terminal, never in logs") {
  const std::string dir = make_dir();
  int master = -1;
  const auto t0 = Clock::now();
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string logs = dir + "/logs/nested";
    ::setenv("PHALANX_TIMEOUT", "30", 1);
    ::execl(PHALANX_RUN, PHALANX_RUN, "--nproc-per-node", "2", "--log-dir", logs.c_str(), kWorker.c_str(), "progress",
            dir.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string screen;
  char buf[4096];
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 30000) <= 0) break;
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO: the launcher closed the terminal
    screen.append(buf, static_cast<std::size_t>(n));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(master);
  INFO(screen);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(slurp(dir + "/progress_env_0") == "1");  // only rank 0 is asked to draw
  CHECK(slurp(dir + "/progress_env_1") == "");
  std::size_t draws = 0;
  for (std::size_t at = 0; (at = screen.find("\r[0] step ", at)) != std::string::npos; ++at) ++draws;
  CHECK(draws >= 2);
  CHECK(draws < 40);                          // 40 redraws in ~1 s: coalesced
  CHECK(draws <= 10 * secs + 2);              // at most 10 a second
  CHECK(screen.find("[0] step 40/40\r\n") != std::string::npos);  // the finished bar as a line
  CHECK(screen.find("[1] bar done") != std::string::npos);
  CHECK(screen.find("[0] bar done") != std::string::npos);
  // The log files hold lines only: the bar's last state, no redraws.
  CHECK(slurp(dir + "/logs/nested/rank_0.log") == "step 40/40\nbar done\n");
  CHECK(slurp(dir + "/logs/nested/rank_1.log") == "bar done\n");
}

TEST_CASE("without a terminal: no PHALANX_PROGRESS, no '\\r' in the output") {
  const std::string dir = make_dir();
  CHECK(finish(start({"--nproc-per-node", "2", kWorker, "progress", dir}, dir)) == 0);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(slurp(dir + "/progress_env_0") == "");
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find("[0] step 40/40\n") != std::string::npos);
}

TEST_CASE("--log-dir is created, or refused with a clear message") {
  const std::string dir = make_dir();
  CHECK(finish(start({"--log-dir", dir + "/a/b/c", kWorker, "env", dir}, dir)) == 0);
  CHECK(slurp(dir + "/a/b/c/rank_0.log").find("rank 0 done") != std::string::npos);
  std::ofstream(dir + "/a_file") << "x";
  CHECK(finish(start({"--log-dir", dir + "/a_file/logs", kWorker, "env", dir}, dir)) == 2);
  CHECK(slurp(dir + "/launcher.out").find("--log-dir '" + dir + "/a_file/logs': cannot create") != std::string::npos);
}

namespace {
struct TwoNodes {
  std::string dir = make_dir();
  int port = free_port();
  Launch n0, n1;
  std::string out0, out1;
  void launch(std::vector<std::string> extra, const std::vector<std::string>& worker) {
    auto args = [&](int node) {
      std::vector<std::string> a = {"--nnodes", "2", "--nproc-per-node", "2", "--master-port", std::to_string(port),
                                    "--rdzv-token", "two-node-restarts", "--grace-period", "2", "--node-rank",
                                    std::to_string(node)};
      a.insert(a.end(), extra.begin(), extra.end());
      a.insert(a.end(), worker.begin(), worker.end());
      return a;
    };
    ::mkdir((dir + "/n0").c_str(), 0700);
    ::mkdir((dir + "/n1").c_str(), 0700);
    n1 = start(args(1), dir + "/n1");
    n0 = start(args(0), dir + "/n0");
  }
};
}  // namespace

TEST_CASE("two launchers restart together when a worker on node 1 is killed") {
  TwoNodes job;
  job.launch({"--max-restarts", "1"}, {kWorker, "kill-node1-once", job.dir});
  const int rc0 = finish(job.n0, 90s), rc1 = finish(job.n1, 90s);
  const std::string out0 = slurp(job.n0.out), out1 = slurp(job.n1.out);
  INFO(out0);
  INFO(out1);
  CHECK(rc0 == 0);
  CHECK(rc1 == 0);
  for (const std::string& out : {out0, out1}) {
    CHECK(out.find("the job failed in round 0: rank 2 on node 1") != std::string::npos);
    CHECK(out.find("killed by signal 9") != std::string::npos);
    CHECK(out.find("restarting the group (restart 1 of 1, world size 4)") != std::string::npos);
  }
  CHECK(worker_pids(job.dir, 4, 1).size() == 4);  // every rank ran again as restart 1
  for (int r = 0; r < 4; ++r) CHECK((out0 + out1).find("[" + std::to_string(r) + "] rank " + std::to_string(r) + " done") != std::string::npos);
}

TEST_CASE("two launchers: when the job's budget is spent both exit naming the same rank") {
  TwoNodes job;
  job.launch({"--max-restarts", "1"}, {kWorker, "selfkill", "3", job.dir});
  const int rc0 = finish(job.n0, 90s), rc1 = finish(job.n1, 90s);
  const std::string out0 = slurp(job.n0.out), out1 = slurp(job.n1.out);
  INFO(out0);
  INFO(out1);
  CHECK(rc0 == 128 + SIGKILL);
  CHECK(rc1 == 128 + SIGKILL);
  for (const std::string& out : {out0, out1}) {
    CHECK(out.find("the job failed in round 1: rank 3 on node 1") != std::string::npos);
    CHECK(out.find("giving up after 1 restart(s)") != std::string::npos);
  }
  CHECK(worker_pids(job.dir, 4, 1).size() == 4);
}

TEST_CASE("two launchers: node 0 gives up in time when node 1's launcher is gone") {
  TwoNodes job;
  job.launch({"--rdzv-timeout", "2"}, {kWorker, "spin", job.dir});
  REQUIRE(wait_ready(job.dir, 4));
  const auto t0 = Clock::now();
  ::kill(job.n1.pid, SIGKILL);  // its workers die with it (PR_SET_PDEATHSIG)
  const int rc0 = finish(job.n0, 60s);
  finish(job.n1, 5s);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string out0 = slurp(job.n0.out);
  INFO(out0);
  CHECK(rc0 != 0);
  CHECK(rc0 != -1);
  CHECK(out0.find("node 1's launcher stopped answering") != std::string::npos);
  CHECK(secs < 30);
}

TEST_CASE("two launchers: node 1 stops at once when node 0's launcher (the store) is gone") {
  TwoNodes job;
  job.launch({}, {kWorker, "spin", job.dir});
  REQUIRE(wait_ready(job.dir, 4));
  const auto t0 = Clock::now();
  ::kill(job.n0.pid, SIGKILL);
  const int rc1 = finish(job.n1, 60s);
  finish(job.n0, 5s);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string out1 = slurp(job.n1.out);
  INFO(out1);
  CHECK(rc1 == 1);
  CHECK(out1.find("lost the job's store (is node 0's launcher gone?)") != std::string::npos);
  CHECK(secs < 10);  // measured: 0.1 s
  const auto pids = worker_pids(job.dir, 4);
  REQUIRE(pids.size() == 4);
  CHECK(all_gone({pids[2], pids[3]}));  // node 1's (node 0's are orphans: init reaps them)
}

TEST_CASE("two launchers: a failure on node 1 stops node 0's workers even when they would wait on") {
  TwoNodes job;
  job.launch({}, {kWorker, "sleep", job.dir});  // no collectives: nothing fails on node 0 by itself
  const auto wait_start = Clock::now();
  while (worker_pids(job.dir, 4).size() < 4 && Clock::now() - wait_start < 30s) std::this_thread::sleep_for(10ms);
  const auto pids = worker_pids(job.dir, 4);
  REQUIRE(pids.size() == 4);
  const auto t0 = Clock::now();
  ::kill(pids[2], SIGKILL);
  const int rc0 = finish(job.n0, 60s), rc1 = finish(job.n1, 60s);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string out0 = slurp(job.n0.out), out1 = slurp(job.n1.out);
  INFO(out0);
  INFO(out1);
  CHECK(rc0 == 128 + SIGKILL);
  CHECK(rc1 == 128 + SIGKILL);
  CHECK(out0.find("node 0: stopped 2 worker(s): node 1: rank 2 was killed by signal 9") != std::string::npos);
  for (const std::string& out : {out0, out1})
    CHECK(out.find("the job failed in round 0: rank 2 on node 1") != std::string::npos);
  CHECK(secs < 15);  // a tick to see the close, then SIGTERM (the sleepers die at once)
  CHECK(all_gone(pids));
}
