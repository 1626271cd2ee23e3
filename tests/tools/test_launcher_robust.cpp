// phalanx-run under hostile conditions: signals racing fork, what workers leave behind,
// odd output, no fds, a missing job token, signals and a stopped node 0 while the launchers
// exchange their reports.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "tools/launcher_harness.hpp"

using namespace launcher_harness;

namespace {

int free_port() {
  phalanx::TcpStoreServer probe(phalanx::TcpStoreOptions{});
  return probe.port();
}

pid_t read_pid(const std::string& path, std::chrono::seconds timeout = 20s) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    pid_t p = 0;
    if (std::ifstream(path) >> p && p > 0) return p;
    std::this_thread::sleep_for(10ms);
  }
  return 0;
}

/// Starts phalanx-run with its stdout on a FIFO that nobody reads (stderr in the usual file).
Launch start_with_stuck_stdout(const std::vector<std::string>& args, const std::string& dir) {
  const std::string fifo = dir + "/stdout.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Launch l;
  l.out = dir + "/launcher.out";
  l.pid = ::fork();
  if (l.pid == 0) {
    const int f = ::open(l.out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const int p = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // RDWR: no wait for a reader
    ::dup2(p, 1);
    ::dup2(f, 2);
    std::vector<char*> argv{const_cast<char*>(PHALANX_RUN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::setenv("PHALANX_TIMEOUT", "30", 1);
    ::execv(PHALANX_RUN, argv.data());
    ::_exit(127);
  }
  return l;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<std::string> two_node_args(int port, int node, std::vector<std::string> rest) {
  std::vector<std::string> a = {"--nnodes", "2", "--nproc-per-node", "1", "--master-port", std::to_string(port),
                                "--node-rank", std::to_string(node), "--rdzv-token", "robust-test"};
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

}  // namespace

TEST_CASE("workers failing at once: every restart happens (signals that race fork stay the workers')") {
  // Eight workers that exit 1 at once: the launcher's SIGTERMs reach some of them between
  // fork and exec, where they must not run the launcher's handlers.
  for (int trial = 0; trial < 5; ++trial) {
    CAPTURE(trial);
    const std::string dir = make_dir();
    const int rc = finish(start({"--nproc-per-node", "8", "--max-restarts", "2", "/bin/false"}, dir), 30s);
    const std::string out = slurp(dir + "/launcher.out");
    INFO(out);
    CHECK(rc == 1);
    CHECK(out.find("restarting the group (restart 2 of 2") != std::string::npos);
    CHECK(out.find("giving up after 2 restart(s)") != std::string::npos);
    CHECK(out.find("Unknown signal") == std::string::npos);
  }
}

TEST_CASE("workers get no handler of the launcher's; only SIGPIPE stays ignored (for Gloo's sockets)") {
  const std::string dir = make_dir();
  const int rc = finish(start({"sh", "-c", "cat /proc/self/status"}, dir), 20s);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("SigIgn:\t0000000000001000") != std::string::npos);  // SIGPIPE (13)
  CHECK(out.find("SigCgt:\t0000000000000000") != std::string::npos);
  CHECK(out.find("SigBlk:\t0000000000000000") != std::string::npos);
}

TEST_CASE("a worker's background child that keeps writing does not keep the launcher: it is killed") {
  for (int code : {0, 3}) {
    CAPTURE(code);
    const std::string dir = make_dir();
    const auto t0 = Clock::now();
    const int rc = finish(start({"sh", "-c",
                                 "(while :; do echo tick; sleep .01; done) & echo $! > " + dir +
                                     "/bg; exit " + std::to_string(code)},
                                dir),
                          20s);
    INFO(slurp(dir + "/launcher.out"));
    CHECK(rc == code);
    CHECK(seconds_since(t0) < 10);
    const pid_t bg = read_pid(dir + "/bg", 1s);
    REQUIRE(bg > 0);
    CHECK(all_gone({bg}));
  }
}

TEST_CASE("kill -9 of a rank: what the ranks started (in their group, or a setsid daemon) dies too") {
  const std::string dir = make_dir();
  const std::string script = "sleep 301 & echo $! > " + dir + "/bg_$RANK; setsid sh -c 'echo $$ > " + dir +
                             "/daemon_'$RANK'; exec sleep 302' & echo $$ > " + dir + "/pid_$RANK; wait";
  Launch l = start({"--nproc-per-node", "2", "--grace-period", "2", "sh", "-c", script}, dir);
  std::vector<pid_t> leftovers;
  for (const char* what : {"bg_", "daemon_"})
    for (int r = 0; r < 2; ++r) leftovers.push_back(read_pid(dir + "/" + what + std::to_string(r)));
  const pid_t rank0 = read_pid(dir + "/pid_0");
  REQUIRE(rank0 > 0);
  for (pid_t p : leftovers) REQUIRE(p > 0);
  ::kill(rank0, SIGKILL);
  const int rc = finish(l, 20s);
  INFO(slurp(l.out));
  CHECK(rc == 128 + SIGKILL);
  CHECK(all_gone(leftovers));
}

TEST_CASE("SIGHUP and SIGQUIT stop the job like SIGTERM") {
  for (int sig : {SIGHUP, SIGQUIT, SIGTERM}) {
    CAPTURE(sig);
    const std::string dir = make_dir();
    Launch l = start({"--nproc-per-node", "2", "--grace-period", "2", kWorker, "sleep", dir}, dir);
    const auto wait_start = Clock::now();
    while (worker_pids(dir, 2).size() < 2 && Clock::now() - wait_start < 20s) std::this_thread::sleep_for(10ms);
    const auto pids = worker_pids(dir, 2);
    REQUIRE(pids.size() == 2);
    ::kill(l.pid, sig);
    const int rc = finish(l, 20s);
    INFO(slurp(l.out));
    CHECK(rc == 128 + sig);
    CHECK(all_gone(pids));
  }
}

TEST_CASE("a very long line without a newline, not UTF-8: relayed in pieces, the summary stays small") {
  const std::string dir = make_dir();
  // 1 MiB of 'x' and invalid UTF-8 bytes, no newline, then exit 1.
  const int rc = finish(start({"sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' x; printf '\\377\\376'; exit 1"},
                              dir),
                        20s);
  const std::string out = slurp(dir + "/launcher.out");
  CHECK(rc == 1);
  const auto summary = out.find("phalanx-run: last");
  REQUIRE(summary != std::string::npos);
  CHECK(out.size() - summary < 20 * 4200);  // at most 20 tail lines, each cut at 4 KiB
  CHECK(out.find("more bytes]") != std::string::npos);
  std::size_t longest = 0, start_of_line = 0;
  for (std::size_t i = 0; i <= out.size(); ++i)
    if (i == out.size() || out[i] == '\n') {
      longest = std::max(longest, i - start_of_line);
      start_of_line = i + 1;
    }
  CHECK(longest <= 64 * 1024 + 16);  // relayed in 64 KiB pieces
}

TEST_CASE("a stdout nobody reads holds up neither a worker's failure nor a signal") {
  // Rank 0 writes 2 MB of lines (far more than a pipe holds); rank 1 fails after 1 s.
  const std::string dir = make_dir();
  const std::string script = "echo $$ > " + dir +
                             "/pid_$RANK; if [ $RANK = 0 ]; then head -c 2000000 /dev/zero | tr '\\0' '\\n'; "
                             "sleep 30; else sleep 0.5; exit 3; fi";
  Launch l = start_with_stuck_stdout({"--nproc-per-node", "2", "--grace-period", "1", "sh", "-c", script}, dir);
  REQUIRE(read_pid(dir + "/pid_1") > 0);
  const auto t0 = Clock::now();
  const int rc = finish(l, 20s);
  const double took = seconds_since(t0);
  INFO(slurp(l.out));
  CHECK(rc == 3);
  CHECK(took < 8);  // rank 1 fails after 0.5 s; the stop, the drain and the flush are bounded
  MESSAGE("the launcher exited " << took << " s after rank 1 started (it fails after 0.5 s)");
  // And a signal, while the output is stuck.
  const std::string dir2 = make_dir();
  Launch l2 = start_with_stuck_stdout({"--nproc-per-node", "1", "--grace-period", "1", "sh", "-c",
                                       "echo $$ > " + dir2 + "/pid_0; yes; sleep 30"},
                                      dir2);
  REQUIRE(read_pid(dir2 + "/pid_0") > 0);
  std::this_thread::sleep_for(300ms);
  const auto t1 = Clock::now();
  ::kill(l2.pid, SIGINT);
  CHECK(finish(l2, 20s) == 128 + SIGINT);
  CHECK(seconds_since(t1) < 5);
  CHECK(all_gone({read_pid(dir2 + "/pid_0")}));
}

TEST_CASE("log files are not inherited by the workers") {
  const std::string dir = make_dir();
  const int rc = finish(start({"--nproc-per-node", "2", "--log-dir", dir + "/logs", "sh", "-c",
                               "for f in /proc/$$/fd/*; do readlink $f; done; true"},
                              dir),
                        20s);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("pipe:") != std::string::npos);  // it listed its fds
  // None of the launcher's own log files (fds the test runner itself leaks, like ctest's
  // LastTest.log, are not the launcher's to close).
  CHECK(out.find(dir + "/logs/") == std::string::npos);
}

TEST_CASE("out of fds at a restart: the round fails with a clear message, the launcher carries on") {
  const std::string dir = make_dir();
  // 3 fds per worker: 64 workers cannot start under a limit of 64 open files.
  const int rc = finish(start({"--nproc-per-node", "64", "--max-restarts", "1", "--grace-period", "1", "sleep", "5"},
                              dir, {}, 64),
                        30s);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("cannot start rank") != std::string::npos);
  CHECK(out.find("ulimit -n") != std::string::npos);
  CHECK(out.find("restarting the group (restart 1 of 1") != std::string::npos);
}

TEST_CASE("several nodes need a job token") {
  const std::string dir = make_dir();
  const int port = free_port();
  CHECK(finish(start({"--nnodes", "2", "--master-port", std::to_string(port), "/bin/true"}, dir), 20s) == 2);
  const std::string out = slurp(dir + "/launcher.out");
  CHECK(out.find("needs a job token") != std::string::npos);
  CHECK(out.find("PHALANX_RDZV_TOKEN") != std::string::npos);
  // The token from the environment is enough.
  const std::string dir2 = make_dir();
  const std::vector<std::pair<std::string, std::string>> env = {{"PHALANX_RDZV_TOKEN", "from-env"}};
  auto args = [&](int node) {
    return std::vector<std::string>{"--nnodes", "2", "--master-port", std::to_string(port), "--node-rank",
                                    std::to_string(node), "/bin/true"};
  };
  Launch n0 = start(args(0), dir2, env), n1 = start(args(1), dir2, env);
  CHECK(finish(n0, 30s) == 0);
  CHECK(finish(n1, 30s) == 0);
}

TEST_CASE("two launchers restart together after a failure whose output is not UTF-8") {
  const std::string dir = make_dir();
  const int port = free_port();
  const std::vector<std::string> rest = {
      "--max-restarts", "1", "--rdzv-timeout", "20", "sh", "-c",
      "if [ $RANK = 1 ] && [ $PHALANX_RESTART_COUNT = 0 ]; then printf 'bad \\377\\376 bytes\\n'; exit 4; fi"};
  Launch n0 = start(two_node_args(port, 0, rest), dir), n1 = start(two_node_args(port, 1, rest), dir);
  const auto t0 = Clock::now();
  CHECK(finish(n0, 40s) == 0);
  CHECK(finish(n1, 40s) == 0);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(seconds_since(t0) < 15);
  CHECK(out.find("restarting the group (restart 1 of 1") != std::string::npos);
}

TEST_CASE("two launchers: a signal while waiting for the other node's report ends the job at once") {
  const std::string dir = make_dir();
  const int port = free_port();
  // Rank 0 (node 0) is done at once; rank 1 (node 1) runs on, so node 0 waits in the exchange.
  const std::vector<std::string> rest = {"--grace-period", "1", "sh", "-c",
                                         "echo $$ > " + dir + "/pid_$RANK; [ $RANK = 0 ] || sleep 30"};
  Launch n0 = start(two_node_args(port, 0, rest), dir), n1 = start(two_node_args(port, 1, rest), dir);
  REQUIRE(read_pid(dir + "/pid_1") > 0);
  REQUIRE(read_pid(dir + "/pid_0") > 0);
  std::this_thread::sleep_for(500ms);  // node 0 is in the exchange now
  const auto t0 = Clock::now();
  ::kill(n0.pid, SIGTERM);
  CHECK(finish(n0, 20s) == 128 + SIGTERM);
  CHECK(seconds_since(t0) < 5);
  CHECK(finish(n1, 30s) != 0);  // its store is gone: it stops its worker and fails
  CHECK(seconds_since(t0) < 15);
  CHECK(all_gone({read_pid(dir + "/pid_1")}));
}

TEST_CASE("two launchers: --nproc-per-node that differs from node 0's ends the job, naming both values") {
  const std::string dir = make_dir();
  const int port = free_port();
  auto args = [&](int node, int nproc) {
    return std::vector<std::string>{"--nnodes", "2", "--nproc-per-node", std::to_string(nproc), "--master-port",
                                    std::to_string(port), "--node-rank", std::to_string(node), "--rdzv-token", "t",
                                    "--grace-period", "1", "sleep", "30"};
  };
  Launch n0 = start(args(0, 2), dir), n1 = start(args(1, 1), dir);
  const auto t0 = Clock::now();
  CHECK(finish(n1, 30s) == 2);
  CHECK(finish(n0, 30s) == 2);
  CHECK(seconds_since(t0) < 10);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(out.find("--nproc-per-node is 1 on node 1 but 2 on node 0") != std::string::npos);
  CHECK(out.find("node 1: --nproc-per-node is 1 on node 1 but 2 on node 0: every node must run the same number of "
                 "workers; the job ends") != std::string::npos);  // node 0 says so too
}

TEST_CASE("two launchers: a launcher restarted late joins the round the job is in") {
  const std::string dir = make_dir();
  const int port = free_port();
  // Round 0: rank 1 fails. Round 1: every rank records its round and sleeps 2 s.
  const std::vector<std::string> rest = {
      "--max-restarts", "3", "--grace-period", "1", "sh", "-c",
      "echo $PHALANX_RESTART_COUNT >> " + dir + "/rounds_$RANK; [ $PHALANX_RESTART_COUNT = 0 ] && [ $RANK = 1 ] && "
      "exit 1; [ $PHALANX_RESTART_COUNT = 0 ] || sleep 2"};
  Launch n0 = start(two_node_args(port, 0, rest), dir);
  Launch n1 = start(two_node_args(port, 1, rest), dir);
  REQUIRE(wait_for_text(dir + "/rounds_1", "1\n", 20s));
  ::kill(n1.pid, SIGKILL);  // node 1's launcher dies in round 1 (its worker with it)
  finish(n1, 10s);
  Launch again = start(two_node_args(port, 1, rest), dir);
  CHECK(finish(n0, 30s) == 0);
  CHECK(finish(again, 30s) == 0);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(slurp(dir + "/rounds_1") == "0\n1\n1\n");  // the new launcher started round 1, not 0
  CHECK(out.find("node 1 joins the job in round 1") != std::string::npos);
}

TEST_CASE("two launchers: node 1 gives up within --rdzv-timeout when node 0 is stopped (SIGSTOP)") {
  const std::string dir = make_dir();
  const int port = free_port();
  const std::vector<std::string> rest = {
      "--rdzv-timeout", "1", "--grace-period", "1", "sh", "-c",
      "echo $$ > " + dir + "/pid_$RANK; sleep 30"};
  Launch n0 = start(two_node_args(port, 0, rest), dir), n1 = start(two_node_args(port, 1, rest), dir);
  REQUIRE(read_pid(dir + "/pid_0") > 0);
  REQUIRE(read_pid(dir + "/pid_1") > 0);
  ::kill(n0.pid, SIGSTOP);
  const auto t0 = Clock::now();
  const int rc1 = finish(n1, 40s);
  const double took = seconds_since(t0);
  ::kill(n0.pid, SIGCONT);
  ::kill(n0.pid, SIGTERM);
  finish(n0, 20s);
  const std::string out = slurp(dir + "/launcher.out");
  INFO(out);
  CHECK(rc1 == 1);
  CHECK(out.find("node 1: stopped 1 worker(s): lost the job's store") != std::string::npos);
  CHECK(took < 10);  // a few --rdzv-timeout, not PHALANX_TIMEOUT (30 s)
  CHECK(all_gone({read_pid(dir + "/pid_1")}));
  MESSAGE("node 1 gave up after " << took << " s (--rdzv-timeout 1)");
}
