// Preemption: SIGTERM (or Slurm's SIGUSR1) to phalanx-run mid-epoch makes every worker finish
// its step, rank 0 save a verified checkpoint of the step all ranks agreed on, every worker
// exit 75 and the launcher say which step was saved; --resume then ends byte-identical to
// an uninterrupted run. A signal to one worker alone stops the whole job the same way (no
// restart); without --checkpoint-dir nothing is saved and the job dies by the signal; a
// worker that ignores the signal is killed at --term-timeout.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <regex>
#include <string>
#include <thread>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;

namespace {

using trainer_test::Result;
using trainer_test::slurp;
using trainer_test::workers_of;
using Clock = std::chrono::steady_clock;

std::string dir() {
  static const std::string d = trainer_test::case_study_dir("phalanx_stop");
  return d;
}

// A model wide enough that a step takes about a millisecond: a signal lands mid-epoch.
const std::string kJob = std::string(PHALANX_TRAIN) + " --train-x " + dir() + "/x.npy --train-y " + dir() +
                         "/y.npy --model 64-512-512-10 --global-batch 64 --lr 0.05 --momentum 0.9 --warmup-steps 6 "
                         "--seed 5 --epochs 40";
constexpr std::int64_t kTotalSteps = 40 * 8;

bool same_bytes(const std::string& a, const std::string& b) {
  const TensorMap x = load_npz(a), y = load_npz(b);
  if (x.names() != y.names()) return false;
  for (const auto& [k, v] : x) {
    const Tensor& w = y.at(k);
    if (v.nbytes() != w.nbytes() || std::memcmp(v.raw_data(), w.raw_data(), v.nbytes()) != 0) return false;
  }
  return true;
}

std::vector<std::int64_t> checkpoint_steps(const std::string& d) {
  std::vector<std::int64_t> out;
  if (DIR* h = ::opendir(d.c_str())) {
    while (const dirent* e = ::readdir(h)) {
      long long s;
      char tail[8] = {0};
      if (std::sscanf(e->d_name, "checkpoint-%lld.%3s", &s, tail) == 2 && std::string(tail) == "npz") out.push_back(s);
    }
    ::closedir(h);
  }
  return out;
}

pid_t start(const std::string& cmd, const std::string& log) {
  const std::string full = "exec " + cmd + " > " + log + " 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// The launcher's exit status and how long it took after `since`.
std::pair<int, double> wait_for(pid_t pid, Clock::time_point since) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double secs = std::chrono::duration<double>(Clock::now() - since).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), secs};
}


// Waits until the job has trained a while (its metrics file has `steps` step records).
bool trained_steps(const std::string& metrics, std::int64_t steps, pid_t launcher) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    const std::string m = slurp(metrics);
    std::int64_t n = 0;
    for (std::size_t at = m.find("\"step\":"); at != std::string::npos; at = m.find("\"step\":", at + 1)) ++n;
    if (n >= steps) return true;
    int st;
    if (::waitpid(launcher, &st, WNOHANG) == launcher) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::string reference() {
  static const std::string ref = [] {
    const std::string r = dir() + "/ref.npz";
    const auto res = trainer_test::run_command(std::string(PHALANX_RUN) + " --nproc-per-node 2 " + kJob + " --save " + r,
                                               dir() + "/ref.log");
    REQUIRE(res.code == 0);
    return r;
  }();
  return ref;
}

}  // namespace

TEST_CASE("SIGTERM to phalanx-run mid-epoch: the step is saved and verified, --resume ends byte-identical") {
  const std::string ref = reference();
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  const std::regex saved("phalanx-run: stopped by SIGTERM after saving step ([0-9]+) to (\\S+); rerun with --resume");
  for (int trial = 0; trial < 3; ++trial) {
    CAPTURE(trial);
    const std::string d = dir() + "/term" + std::to_string(trial), log = d + ".log", metrics = d + ".jsonl";
    std::system(("rm -rf " + d + " " + metrics).c_str());
    const std::string job = kJob + " --checkpoint-dir " + d + " --checkpoint-every 100000 --resume";
    const pid_t launcher = start(std::string(PHALANX_RUN) + " --nproc-per-node 2 " + job + " --metrics " + metrics, log);
    const std::int64_t target = std::uniform_int_distribution<std::int64_t>(5, kTotalSteps / 2)(rng);
    REQUIRE(trained_steps(metrics, target, launcher));
    const auto t0 = Clock::now();
    ::kill(launcher, SIGTERM);
    const auto [code, secs] = wait_for(launcher, t0);
    const std::string text = slurp(log);
    INFO(text);
    CHECK(code == parallel::kExitStoppedAfterSave);
    CHECK(secs < 30);  // within the grace period (--term-timeout, 30 s)
    std::smatch m;
    REQUIRE(std::regex_search(text, m, saved));
    const std::int64_t step = std::stoll(m[1]);
    CHECK(step >= target);
    CHECK(step < kTotalSteps);
    CHECK(checkpoint_steps(d) == std::vector<std::int64_t>{step});  // the stop's checkpoint, the only one
    parallel::CheckpointExpect any;
    any.world_size = parallel::kAnyWorld;  // the 2-worker job's file, read here in a world of one
    CHECK(parallel::load_checkpoint(m[2], any).manifest.step == step);  // verifies
    CHECK(text.find("phalanx-train: stopped by SIGTERM after saving step " + std::to_string(step)) != std::string::npos);
    // The rest of the job, resumed: byte-identical to the run nobody stopped.
    const auto r = trainer_test::run_command(
        std::string(PHALANX_RUN) + " --nproc-per-node 2 " + job + " --save " + d + ".npz", d + ".resume.log");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("resumed at step " + std::to_string(step)) != std::string::npos);
    CHECK(same_bytes(ref, d + ".npz"));
  }
}

TEST_CASE("a stop signal to one worker only stops the whole job after saving, with no restart") {
  const std::string ref = reference();
  const std::string d = dir() + "/one", log = d + ".log", metrics = d + ".jsonl";
  std::system(("rm -rf " + d + " " + metrics).c_str());
  const std::string job = kJob + " --checkpoint-dir " + d + " --checkpoint-every 100000 --resume";
  const pid_t launcher =
      start(std::string(PHALANX_RUN) + " --max-restarts 3 --nproc-per-node 2 " + job + " --metrics " + metrics, log);
  REQUIRE(trained_steps(metrics, 20, launcher));
  const auto ws = workers_of(launcher);
  REQUIRE(ws.size() == 2);
  const auto t0 = Clock::now();
  ::kill(ws[1], SIGUSR1);  // Slurm's --signal=USR1 reaches the tasks
  const auto [code, secs] = wait_for(launcher, t0);
  const std::string text = slurp(log);
  INFO(text);
  CHECK(code == parallel::kExitStoppedAfterSave);
  CHECK(text.find("phalanx-run: stopped by SIGUSR1 after saving step ") != std::string::npos);
  CHECK(text.find("restarting") == std::string::npos);
  REQUIRE(checkpoint_steps(d).size() == 1);
  const auto r = trainer_test::run_command(std::string(PHALANX_RUN) + " --nproc-per-node 2 " + job + " --save " + d + ".npz",
                                           d + ".resume.log");
  REQUIRE(r.code == 0);
  CHECK(same_bytes(ref, d + ".npz"));
}

TEST_CASE("--term-signal USR1: the workers get SIGUSR1 when the launcher gets SIGTERM, and save") {
  const std::string d = dir() + "/usr1", log = d + ".log", metrics = d + ".jsonl";
  std::system(("rm -rf " + d + " " + metrics).c_str());
  const pid_t launcher = start(std::string(PHALANX_RUN) + " --term-signal USR1 --nproc-per-node 2 " + kJob +
                                   " --checkpoint-dir " + d + " --metrics " + metrics,
                               log);
  REQUIRE(trained_steps(metrics, 10, launcher));
  ::kill(launcher, SIGTERM);
  const auto [code, secs] = wait_for(launcher, Clock::now());
  const std::string text = slurp(log);
  INFO(text);
  CHECK(code == parallel::kExitStoppedAfterSave);
  CHECK(text.find("phalanx-train: stopped by SIGUSR1 after saving step ") != std::string::npos);
}

TEST_CASE("without --checkpoint-dir a stop saves nothing, says so, and dies by the signal") {
  const std::string log = dir() + "/nockpt.log", metrics = dir() + "/nockpt.jsonl";
  std::system(("rm -f " + metrics).c_str());
  const pid_t launcher = start(std::string(PHALANX_RUN) + " --nproc-per-node 2 " + kJob + " --metrics " + metrics, log);
  REQUIRE(trained_steps(metrics, 10, launcher));
  ::kill(launcher, SIGTERM);
  const auto [code, secs] = wait_for(launcher, Clock::now());
  const std::string text = slurp(log);
  INFO(text);
  CHECK(code == 128 + SIGTERM);
  CHECK(text.find("nothing saved (no --checkpoint-dir") != std::string::npos);
  CHECK(text.find("phalanx-run: got SIGTERM, stopped all workers.") != std::string::npos);
}

TEST_CASE("a worker that ignores the stop signal is killed at --term-timeout, and the launcher says so") {
  const std::string log = dir() + "/ignore.log";
  const pid_t launcher = start(std::string(PHALANX_RUN) + " --term-timeout 1 --nproc-per-node 2 sh -c 'trap \"\" TERM; "
                                                          "echo ready; while :; do sleep 0.05; done'",
                               log);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (slurp(log).find("ready") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = Clock::now();
  ::kill(launcher, SIGTERM);
  const auto [code, secs] = wait_for(launcher, t0);
  const std::string text = slurp(log);
  INFO(text);
  CHECK(code == 128 + SIGTERM);
  CHECK(secs >= 0.9);
  CHECK(secs < 5);
  CHECK(text.find("did not exit within --term-timeout 1 s and were killed") != std::string::npos);
}

TEST_CASE("--term-signal and --term-timeout are checked") {
  auto r = trainer_test::run_command(std::string(PHALANX_RUN) + " --term-signal KILL true", dir() + "/opt.log");
  CHECK(r.code == 2);
  CHECK(r.out.find("--term-signal 'KILL' must be TERM, INT, USR1 or USR2") != std::string::npos);
  r = trainer_test::run_command(std::string(PHALANX_RUN) + " --term-timeout -1 true", dir() + "/opt.log");
  CHECK(r.code == 2);
  r = trainer_test::run_command(std::string(PHALANX_RUN) + " --term-signal sigusr2 --nproc-per-node 1 true",
                                dir() + "/opt.log");
  CHECK(r.code == 0);
}
