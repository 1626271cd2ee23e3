// phalanx-train under faults: a worker killed with SIGKILL at a random step resumes under
// phalanx-run --max-restarts and ends bit-identical; a damaged checkpoint is refused and kept
// as it was; a non-finite loss stops training with the last good checkpoint kept; metrics
// are not duplicated by a resume.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;

namespace {

using trainer_test::Result;
using trainer_test::slurp;
using trainer_test::workers_of;

std::string dir() {
  static const std::string d = trainer_test::case_study_dir("phalanx_resume");
  return d;
}

Result run(const std::string& cmd) { return trainer_test::run_command(cmd, dir() + "/out.txt"); }

const std::string kTrain = std::string(PHALANX_TRAIN) + " --train-x " + dir() + "/x.npy --train-y " + dir() +
                           "/y.npy --init " + dir() + "/init.npz";

bool same_weights(const std::string& a, const std::string& b) {
  const TensorMap x = load_npz(a), y = load_npz(b);
  if (x.names() != y.names()) return false;
  for (const auto& [k, v] : x)
    if (v.to_vector<float>() != y.at(k).to_vector<float>()) return false;
  return true;
}

// The newest checkpoint's step in `d`, -1 when there is none.
std::int64_t newest_step(const std::string& d) {
  std::int64_t best = -1;
  if (DIR* h = ::opendir(d.c_str())) {
    while (const dirent* e = ::readdir(h)) {
      long long s;
      if (std::sscanf(e->d_name, "checkpoint-%lld", &s) == 1) best = std::max<std::int64_t>(best, s);
    }
    ::closedir(h);
  }
  return best;
}


}  // namespace

TEST_CASE("kill -9 of a random worker at a random step: the restarted job resumes and ends bit-identical") {
  const std::string opts = " --global-batch 64 --lr 0.1 --momentum 0.9 --warmup-steps 6 --seed 5 --epochs 12";
  const std::string ref = dir() + "/ref.npz";
  auto r = run(std::string(PHALANX_RUN) + " --nproc-per-node 2 " + kTrain + opts + " --save " + ref);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::int64_t total = 12 * 8;
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (int trial = 0; trial < 2; ++trial) {
    CAPTURE(trial);
    const std::string d = dir() + "/kill" + std::to_string(trial), out = d + ".npz", log = d + ".log";
    std::system(("rm -rf " + d).c_str());
    const std::int64_t target = std::uniform_int_distribution<std::int64_t>(6, total / 2)(rng);
    const std::string cmd = "exec " + std::string(PHALANX_RUN) + " --max-restarts 2 --nproc-per-node 2 " + kTrain + opts +
                            " --checkpoint-dir " + d + " --checkpoint-every 3 --resume --save " + out + " > " + log + " 2>&1";
    const pid_t launcher = ::fork();
    if (launcher == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait for the target step's checkpoint, then SIGKILL one worker, chosen at random.
    bool killed = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!killed && std::chrono::steady_clock::now() < deadline) {
      int st;
      if (::waitpid(launcher, &st, WNOHANG) == launcher) FAIL("the job ended before the kill; log:\n" << slurp(log));
      if (newest_step(d) >= target) {
        const auto ws = workers_of(launcher);
        if (ws.size() == 2) {
          const pid_t victim = ws[std::uniform_int_distribution<std::size_t>(0, 1)(rng)];
          killed = ::kill(victim, SIGKILL) == 0;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(killed);
    int status = 0;
    ::waitpid(launcher, &status, 0);
    const std::string text = slurp(log);
    INFO(text);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    const auto at = text.find("resumed at step ");
    REQUIRE(at != std::string::npos);
    CHECK(std::atoll(text.c_str() + at + 16) > 0);
    CHECK(text.find("checkpoint written at ") != std::string::npos);
    CHECK(same_weights(ref, out));  // bit for bit
    CHECK(newest_step(d) == total);  // the final checkpoint
  }
}

TEST_CASE("a checkpoint with one flipped byte: non-zero exit naming the file and the checksum; the file is unchanged") {
  const std::string d = dir() + "/flip", opts = " --global-batch 64 --lr 0.1 --epochs 2 --checkpoint-dir " + d;
  std::system(("rm -rf " + d).c_str());
  auto r = run(kTrain + opts + " --checkpoint-every 5");
  REQUIRE(r.code == 0);
  const std::string path = d + "/checkpoint-0000000016.npz";  // the final one
  std::string bytes = slurp(path);
  REQUIRE(bytes.size() > 4000);
  const auto w = bytes.find("model.0.weight.npy");
  REQUIRE(w != std::string::npos);
  bytes[w + 300] ^= 0x01;  // inside the first layer's weights
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  // Named explicitly, the damaged file is an error.
  r = run(kTrain + opts + " --epochs 3 --resume-from " + path);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find(path) != std::string::npos);
  CHECK(r.out.find("checksum") != std::string::npos);
  CHECK(r.out.find("epoch 3") == std::string::npos);  // nothing trained
  CHECK(slurp(path) == bytes);                         // unchanged, not overwritten
  // --resume (started by the user) refuses it too, and names the newest file that verifies.
  r = run(kTrain + opts + " --epochs 3 --resume");
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find(path) != std::string::npos);
  CHECK(r.out.find("checksum") != std::string::npos);
  CHECK(r.out.find("--resume-from " + d + "/checkpoint-0000000015.npz") != std::string::npos);
  CHECK(r.out.find("epoch 3") == std::string::npos);
  CHECK(slurp(path) == bytes);
  // A restart by the launcher (unattended) walks back to the newest file that verifies,
  // naming the one passed over and why.
  r = run("env PHALANX_RESTART_COUNT=1 " + kTrain + opts + " --epochs 3 --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("passing over " + path + " (") != std::string::npos);
  CHECK(r.out.find("CRC-32 checksum") != std::string::npos);
  CHECK(r.out.find("resumed at step 15 (epoch 2, checkpoint written at ") != std::string::npos);
  CHECK(slurp(path) == bytes);  // kept as it was; the new step-16 file has its own name
  CHECK(::access((d + "/checkpoint-0000000016.1.npz").c_str(), F_OK) == 0);
  CHECK(::access((d + "/checkpoint-0000000024.npz").c_str(), F_OK) == 0);
  // --resume-from the older one: the newer files (of the abandoned run) are renamed, kept.
  r = run(kTrain + opts + " --epochs 3 --resume-from " + d + "/checkpoint-0000000015.npz");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("resumed at step 15 (epoch 2, checkpoint written at ") != std::string::npos);
  CHECK(slurp(path + ".superseded") == bytes);
  CHECK(::access((d + "/checkpoint-0000000024.npz.superseded").c_str(), F_OK) == 0);
  CHECK(::access((d + "/checkpoint-0000000024.npz").c_str(), F_OK) == 0);  // this run's final one
}

TEST_CASE("--resume without a checkpoint starts fresh; --resume-from a missing file is an error") {
  const std::string d = dir() + "/fresh";
  std::system(("rm -rf " + d).c_str());
  auto r = run(kTrain + " --epochs 1 --checkpoint-dir " + d + " --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("no checkpoint in " + d + " yet; starting from step 0") != std::string::npos);
  CHECK(::access((d + "/checkpoint-0000000008.npz").c_str(), F_OK) == 0);  // the final one, always
  r = run(kTrain + " --epochs 1 --resume-from " + d + "/nope.npz");
  CHECK(r.code != 0);
  CHECK(r.out.find(d + "/nope.npz: no such checkpoint") != std::string::npos);
  // A restarted worker (phalanx-run --max-restarts sets PHALANX_RESTART_COUNT) resumes by
  // itself, without --resume.
  r = run("env PHALANX_RESTART_COUNT=1 " + kTrain + " --epochs 2 --checkpoint-dir " + d);
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("resumed at step 8 (epoch 2, checkpoint written at ") != std::string::npos);
  // A fresh run into a folder of another run's checkpoints is refused (it would mix them).
  const std::string before = slurp(d + "/checkpoint-0000000016.npz");
  r = run(kTrain + " --epochs 3 --checkpoint-dir " + d);
  CHECK(r.code != 0);
  CHECK(r.out.find("already holds checkpoints (newest " + d + "/checkpoint-0000000016.npz) and this run starts from step 0") !=
        std::string::npos);
  CHECK(slurp(d + "/checkpoint-0000000016.npz") == before);
  // Another global batch: refused with both values.
  r = run(kTrain + " --epochs 2 --global-batch 128 --checkpoint-dir " + d + " --resume");
  CHECK(r.code != 0);
  CHECK(r.out.find("global batch 64, this run has 128") != std::string::npos);
}

TEST_CASE("a resumed run's metrics hold each step once, epochs numbered from 1, the epoch loss over the whole epoch") {
  const std::string d = dir() + "/metrics", m = dir() + "/m.jsonl", m_full = dir() + "/m_full.jsonl";
  std::system(("rm -rf " + d).c_str());
  const std::string opts = " --global-batch 64 --lr 0.1 --warmup-steps 4 --lr-schedule step --lr-step-size 5 --lr-gamma 0.5 --seed 2";
  auto full = run(kTrain + opts + " --epochs 3 --metrics " + m_full);
  REQUIRE(full.code == 0);
  auto a = run(kTrain + opts + " --epochs 1 --checkpoint-dir " + d + " --checkpoint-every 5 --metrics " + m);
  REQUIRE(a.code == 0);
  // Simulate a crash after step 5's checkpoint: drop the final checkpoint (step 8).
  std::remove((d + "/checkpoint-0000000008.npz").c_str());
  auto b = run(kTrain + opts + " --epochs 3 --checkpoint-dir " + d + " --resume --metrics " + m);
  INFO(b.out);
  REQUIRE(b.code == 0);
  CHECK(b.out.find("resumed at step 5 (epoch 1,") != std::string::npos);
  // The resumed file equals the uninterrupted one, but for the wall-clock seconds.
  auto strip = [](const std::string& path) {
    std::vector<nlohmann::json> v;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line);
      j.erase("seconds");
      v.push_back(j);
    }
    return v;
  };
  const auto got = strip(m), want = strip(m_full);
  CHECK(got.size() == 24 + 3);
  CHECK(got == want);
  CHECK(want.front()["epoch"] == 1);
  CHECK(want.front()["lr"].get<double>() < 0.1);  // the warmup's first rate, the one step 1 used
  // The clock goes on from the checkpoint's training time: seconds never go backwards.
  std::ifstream f(m);
  std::string line;
  double last = -1;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("seconds")) continue;
    CAPTURE(line);
    CHECK(j["seconds"].get<double>() >= last);
    last = j["seconds"].get<double>();
  }
}

TEST_CASE("a non-finite loss stops training at that step; the last good checkpoint is kept") {
  // Row 150 of the data overflows the first layer: the loss of step 3 (rows 128-191) is NaN.
  TensorMap f = load_npz(std::string(PHALANX_EXAMPLE_DATA) + "/seed_case_study.npz");
  std::vector<float> x = f.at("x").to_vector<float>();
  const std::int64_t dim = f.at("x").shape()[1];
  for (std::int64_t k = 0; k < dim; ++k) x[150 * dim + k] = 3e38f;
  save_npy(dir() + "/x_big.npy", tensor(x, f.at("x").shape()));
  const std::string d = dir() + "/nan";
  std::system(("rm -rf " + d).c_str());
  const std::string cmd = std::string(PHALANX_TRAIN) + " --train-x " + dir() + "/x_big.npy --train-y " + dir() +
                          "/y.npy --init " + dir() + "/init.npz --no-shuffle --global-batch 64 --epochs 2 --checkpoint-dir " +
                          d + " --checkpoint-every 1";
  auto r = run(cmd);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("non-finite loss (") != std::string::npos);
  CHECK(r.out.find("at step 3 (epoch 1, step 3 of 8)") != std::string::npos);
  CHECK(r.out.find("--allow-nonfinite") != std::string::npos);
  CHECK(newest_step(d) == 2);
  const auto ck = parallel::load_checkpoint(d + "/checkpoint-0000000002.npz");
  for (const auto& [k, v] : ck.state.model)
    for (float w : v.to_vector<float>()) REQUIRE(std::isfinite(w));
  std::system(("rm -rf " + d).c_str());
  r = run(cmd + " --allow-nonfinite --metrics " + dir() + "/nan.jsonl");
  CHECK(r.code == 0);
  // The non-finite loss is recorded as JSON's null (as nlohmann::json writes NaN); every line parses.
  std::ifstream m(dir() + "/nan.jsonl");
  std::string line;
  int nulls = 0;
  while (std::getline(m, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("step") && j["step"] == 3) CHECK(j["loss"].is_null());
    nulls += j.contains("loss") && j["loss"].is_null();
  }
  CHECK(nulls >= 1);
}

TEST_CASE("a resume with changed settings is refused, naming the setting and both values; --epochs may change") {
  const std::string d = dir() + "/settings", base = " --global-batch 64 --epochs 1 --lr 0.1 --checkpoint-dir " + d;
  std::system(("rm -rf " + d).c_str());
  auto r = run(kTrain + base);
  REQUIRE(r.code == 0);
  const std::string ck = d + "/checkpoint-0000000008.npz";
  const std::pair<std::string, std::string> changes[] = {
      {" --lr 0.2", "was written with lr 0.1, this run has 0.2"},
      {" --momentum 0.5", "was written with momentum 0, this run has 0.5"},
      {" --weight-decay 0.01", "was written with weight-decay 0, this run has 0.01"},
      {" --activation tanh", "was written with activation relu, this run has tanh"},
      {" --seed 3", "was written with seed 0, this run has 3"},
      {" --no-shuffle", "was written with shuffle on, this run has off"},
      {" --warmup-steps 2", "was written with warmup-steps 0, this run has 2"},
      {" --lr-schedule step --lr-step-size 4", "was written with lr-schedule constant, this run has step"},
  };
  for (const auto& [opt, want] : changes) {
    CAPTURE(opt);
    r = run(kTrain + base + " --epochs 2 --resume" + opt);
    INFO(r.out);
    CHECK(r.code != 0);
    CHECK(r.out.find(ck + " " + want) != std::string::npos);
    CHECK(r.out.find("epoch 2") == std::string::npos);
  }
  // Linear scaling to the same rate is the same setting.
  r = run(kTrain + " --global-batch 64 --base-lr 0.05 --base-batch 32 --epochs 2 --resume --checkpoint-dir " + d +
          " --checkpoint-every 3 --keep-checkpoints 5 --metrics " + d + "/m.jsonl");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("resumed at step 8 (epoch 2") != std::string::npos);
}

TEST_CASE("a finite loss with non-finite gradients stops at that step; the last good checkpoint holds finite weights") {
  // tanh saturates at an infinite input: the loss stays finite, the first layer's gradient is 0 x inf.
  TensorMap f = load_npz(std::string(PHALANX_EXAMPLE_DATA) + "/seed_case_study.npz");
  std::vector<float> x = f.at("x").to_vector<float>();
  x[150 * f.at("x").shape()[1]] = std::numeric_limits<float>::infinity();
  save_npy(dir() + "/x_inf.npy", tensor(x, f.at("x").shape()));
  const std::string d = dir() + "/nangrad";
  std::system(("rm -rf " + d).c_str());
  const std::string cmd = std::string(PHALANX_TRAIN) + " --train-x " + dir() + "/x_inf.npy --train-y " + dir() +
                          "/y.npy --init " + dir() + "/init.npz --no-data-check --activation tanh --no-shuffle --epochs 1" +
                          " --checkpoint-dir " + d + " --checkpoint-every 1";
  auto r = run(cmd);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("non-finite gradient at step 3 (epoch 1, step 3 of 8; loss ") != std::string::npos);
  CHECK(r.out.find("--allow-nonfinite") != std::string::npos);
  CHECK(newest_step(d) == 2);
  for (const auto& [k, v] : parallel::load_checkpoint(d + "/checkpoint-0000000002.npz").state.model)
    for (float w : v.to_vector<float>()) REQUIRE(std::isfinite(w));
  // NaN in the data under --no-data-check: relu keeps it (as PyTorch), so the loss shows it.
  x[150 * f.at("x").shape()[1]] = std::numeric_limits<float>::quiet_NaN();
  save_npy(dir() + "/x_nan.npy", tensor(x, f.at("x").shape()));
  r = run(std::string(PHALANX_TRAIN) + " --train-x " + dir() + "/x_nan.npy --train-y " + dir() + "/y.npy --init " + dir() +
          "/init.npz --no-data-check --no-shuffle --epochs 1");
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("non-finite loss (") != std::string::npos);
  CHECK(r.out.find("at step 3 ") != std::string::npos);
}

TEST_CASE("one run per checkpoint folder: a second is refused naming the first's pid") {
  const std::string d = dir() + "/locked";
  std::system(("rm -rf " + d).c_str());
  parallel::CheckpointDir held(d, 2);
  held.lock();  // as a running phalanx-train's rank 0 holds it
  { std::ofstream(d + "/checkpoint-0000000003.npz.tmp.x1y2z3") << "torn"; }
  auto r = run(kTrain + " --epochs 1 --resume --checkpoint-dir " + d);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("checkpoint folder " + d + " is in use by another run (pid " + std::to_string(::getpid()) + ")") !=
        std::string::npos);
  CHECK(::access((d + "/checkpoint-0000000003.npz.tmp.x1y2z3").c_str(), F_OK) == 0);  // not its to remove
}

TEST_CASE("write errors are errors: --metrics and --plot on a full disk; --save/--plot folders checked before training") {
  auto r = run(kTrain + " --epochs 2 --metrics /dev/full");
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("--metrics /dev/full: write failed") != std::string::npos);
  r = run(kTrain + " --epochs 1 --plot /dev/full");
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("/dev/full: write failed") != std::string::npos);
  for (const char* opt : {" --save ", " --plot "}) {
    r = run(kTrain + " --epochs 1" + opt + dir() + "/no/such/folder/out");
    INFO(r.out);
    CHECK(r.code != 0);
    CHECK(r.out.find(std::string(opt).substr(1) + dir() + "/no/such/folder/out: the folder " + dir() +
                     "/no/such/folder does not exist") != std::string::npos);
    CHECK(r.out.find("epoch 1") == std::string::npos);  // before training
  }
  r = run(kTrain + " --epochs 1 --base-lr 1e308 --base-batch 1 --global-batch 64");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("gives the rate inf, which is not a finite number > 0") != std::string::npos);
  r = run(kTrain + " --epochs 1 --resume-from /dev/zero");
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("/dev/zero: not a regular file") != std::string::npos);
}

TEST_CASE("a NaN that recurs at the same step after a restart ends the job, naming the step, not every restart") {
  // Row 150 overflows the first layer: on 2 workers (no shuffle, 32 rows each a step) the
  // loss of step 3 is NaN on rank 0; rank 1 fails as a consequence. The first restart resumes
  // from step 2's checkpoint and meets it again at step 3: the launcher stops there.
  TensorMap f = load_npz(std::string(PHALANX_EXAMPLE_DATA) + "/seed_case_study.npz");
  std::vector<float> x = f.at("x").to_vector<float>();
  const std::int64_t dim = f.at("x").shape()[1];
  for (std::int64_t k = 0; k < dim; ++k) x[150 * dim + k] = 3e38f;
  save_npy(dir() + "/x_big2.npy", tensor(x, f.at("x").shape()));
  const std::string d = dir() + "/recur";
  std::system(("rm -rf " + d).c_str());
  const auto r = run(std::string(PHALANX_RUN) + " --nproc-per-node 2 --max-restarts 3 " + PHALANX_TRAIN + " --train-x " +
                     dir() + "/x_big2.npy --train-y " + dir() + "/y.npy --init " + dir() +
                     "/init.npz --no-shuffle --global-batch 64 --epochs 2 --checkpoint-dir " + d +
                     " --checkpoint-every 1 --resume");
  INFO(r.out);
  CHECK(r.code == 1);
  std::size_t restarts = 0;
  for (std::size_t at = r.out.find("restarting the group"); at != std::string::npos;
       at = r.out.find("restarting the group", at + 1))
    ++restarts;
  CHECK(restarts == 1);  // one restart, then the recurrence is seen: not 3
  CHECK(r.out.find("the same failure recurred at step 3 after a restart (non-finite loss (") != std::string::npos);
  CHECK(r.out.find("(2 restart(s) left)") != std::string::npos);
  CHECK(r.out.find("giving up") == std::string::npos);
  std::system(("rm -rf " + d).c_str());
}
