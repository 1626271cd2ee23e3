// phalanx-train end to end: the case study's figures, exact resume, config files, errors.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;

namespace {

using trainer_test::Result;

std::string dir() {
  static const std::string d = trainer_test::case_study_dir("phalanx_train");
  return d;
}

Result run(const std::string& args, bool launcher = false, int workers = 2) {
  const std::string cmd = (launcher ? std::string(PHALANX_RUN) + " --nproc-per-node " + std::to_string(workers) + " " : "") +
                          PHALANX_TRAIN + " " + args;
  return trainer_test::run_command(cmd, dir() + "/out.txt");
}

nlohmann::json summary(const std::string& out) {
  const auto start = out.rfind("{\"");
  REQUIRE(start != std::string::npos);
  return nlohmann::json::parse(out.substr(start, out.find('\n', start) - start));
}

const std::string kData = " --train-x " + dir() + "/x.npy --train-y " + dir() + "/y.npy --init " + dir() + "/init.npz";

/// PyTorch 1.13's reference losses, read from the committed fixture that
/// scripts/make_example_data.py wrote (examples/data/seed_case_study.npz, torch_final_loss):
/// 0 single (one process, batch 64, lr 0.1), 1 direct, 2 linear (each ONE process at batch
/// 256, lr 0.1 and 0.4: the equivalent of 4 workers x 64).
double torch_reference(std::size_t which) {
  static const std::vector<float> losses =
      load_npz(std::string(PHALANX_EXAMPLE_DATA) + "/seed_case_study.npz").at("torch_final_loss").to_vector<float>();
  REQUIRE(losses.size() == 3);
  return losses.at(which);
}

}  // namespace

TEST_CASE("the textbook's single-worker figure, then 4 workers with linear scaling") {
  auto r = run(kData + " --global-batch 64 --lr 0.1 --epochs 30 --no-shuffle --eval-train");
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto s = summary(r.out);
  CHECK(std::abs(s["final_train_loss"].get<double>() - torch_reference(0)) < 2e-3);
  CHECK(s["world_size"] == 1);
  CHECK(s["steps"] == 240);
  r = run(kData + " --global-batch 256 --base-lr 0.1 --base-batch 64 --epochs 30 --no-shuffle --eval-train", true, 4);
  INFO(r.out);
  REQUIRE(r.code == 0);
  s = summary(r.out);
  CHECK(std::abs(s["final_train_loss"].get<double>() - torch_reference(2)) < 2e-3);  // 4 workers x 64 = one process at 256
  CHECK(s["world_size"] == 4);
  CHECK(s["backend"] == (phalanx::backend_available("shm") ? "shm" : "gloo"));  // auto, one host
}

TEST_CASE("resuming from a mid-epoch checkpoint continues exactly (SGD momentum, warmup, shuffle)") {
  const std::string common = kData + " --global-batch 64 --lr 0.1 --momentum 0.9 --warmup-steps 6 --seed 3";
  auto full = run(common + " --epochs 3 --save " + dir() + "/full.npz");
  REQUIRE(full.code == 0);
  const std::string ck = dir() + "/ckpt";
  auto first = run(common + " --epochs 1 --checkpoint-dir " + ck + " --checkpoint-every 5");
  REQUIRE(first.code == 0);  // the last checkpoint is at step 5 of 8: mid-epoch
  auto rest = run(common + " --epochs 3 --checkpoint-dir " + ck + " --resume --save " + dir() + "/resumed.npz");
  INFO(rest.out);
  REQUIRE(rest.code == 0);
  CHECK(summary(rest.out)["steps"] == 24);
  const TensorMap a = load_npz(dir() + "/full.npz"), b = load_npz(dir() + "/resumed.npz");
  for (const auto& [k, v] : a) {
    CAPTURE(k);
    CHECK(v.to_vector<float>() == b.at(k).to_vector<float>());  // bit for bit
  }
}

TEST_CASE("a JSON config gives the same run as the command line; metrics and plot are written") {
  const std::string cfg = dir() + "/cfg.json";
  {
    std::ofstream f(cfg);
    f << nlohmann::json{{"train-x", dir() + "/x.npy"}, {"train-y", dir() + "/y.npy"}, {"init", dir() + "/init.npz"},
                        {"model", "64-32-10"}, {"global-batch", 128}, {"lr", 0.2}, {"epochs", 2}, {"shuffle", false},
                        {"optimizer", "adamw"}, {"weight-decay", 0.01}}
             .dump();
  }
  auto a = run("--config " + cfg + " --metrics " + dir() + "/m.jsonl --plot " + dir() + "/p.svg");
  auto b = run(kData + " --global-batch 128 --lr 0.2 --epochs 2 --no-shuffle --optimizer adamw --weight-decay 0.01");
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  CHECK(summary(a.out)["final_train_loss"] == summary(b.out)["final_train_loss"]);
  std::ifstream m(dir() + "/m.jsonl");
  std::string line;
  int steps = 0, epochs = 0;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("step")) {
      ++steps;
      CHECK(j.contains("loss"));
      CHECK(j.contains("lr"));
      CHECK(j.contains("seconds"));
      CHECK(j["epoch"] == epochs + 1);  // each epoch's record follows its steps (short epochs are reported in groups)
    }
    if (j.contains("train_loss")) CHECK(j["epoch"] == ++epochs);
  }
  CHECK(steps == 8);
  CHECK(epochs == 2);
  std::ifstream svg(dir() + "/p.svg");
  std::string head;
  std::getline(svg, head);
  CHECK(head.rfind("<svg", 0) == 0);
  // a command-line value wins over the file's
  auto c = run("--config " + cfg + " --epochs 1");
  CHECK(summary(c.out)["steps"] == 4);
}

TEST_CASE("bad values are one-line errors before any training") {
  const std::string d = dir();
  struct Case {
    std::string args, expect;
  };
  std::vector<Case> cases = {
      {"--train-x /nonexistent.npy --train-y " + d + "/y.npy", "/nonexistent.npy: cannot open"},
      {"--train-x " + d + "/x.npy --train-y " + d + "/y.npy --model 32-10", "features per sample but --model starts with 32"},
      {"--train-x " + d + "/x.npy --train-y " + d + "/y.npy --model 64-5", "--model 64-5 ends in 5 outputs but the labels have "},
      {"--train-x " + d + "/x.npy --train-y " + d + "/y.npy --frobnicate", "--frobnicate"},
      {"--train-x " + d + "/x.npy", "--train-x needs --train-y"},
      {"--train-x " + d + "/x.npy --train-y " + d + "/y.npy --lr 0.1 --base-lr 0.1 --base-batch 64", "either --lr or --base-lr"},
      {"--config /nonexistent.json", "cannot open"},
  };
  // --device cuda is an error only where there is no CUDA device (on a GPU machine it trains).
  bool have_cuda = true;
  try {
    (void)zeros({1}, DType::Float32, Device::cuda(0));
  } catch (const TypeError&) {
    have_cuda = false;
  }
  if (!have_cuda) cases.push_back({"--train-x " + d + "/x.npy --train-y " + d + "/y.npy --device cuda", "no CUDA device"});
  for (const auto& c : cases) {
    CAPTURE(c.args);
    auto r = run(c.args + " --metrics " + d + "/never.jsonl");
    CHECK(r.code != 0);
    CHECK(r.out.find(c.expect) != std::string::npos);
    CHECK(r.out.find("epoch") == std::string::npos);  // nothing trained
  }
  auto r = run(kData + " --global-batch 64", true, 3);
  CHECK(r.code != 0);
  CHECK(r.out.find("world size 3 does not divide the global batch 64") != std::string::npos);
}

namespace {
std::vector<nlohmann::json> step_records(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("step")) v.push_back(j);
  }
  return v;
}
}  // namespace

TEST_CASE("--lr-schedule: the metrics log the rate each step used; multistep milestones are global steps") {
  const std::string m = dir() + "/sched.jsonl";
  auto r = run(kData + " --global-batch 64 --lr 0.1 --epochs 1 --lr-schedule multistep --lr-milestones 3,5 --lr-gamma 0.5 --metrics " + m);
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto s = step_records(m);
  REQUIRE(s.size() == 8);
  const double want[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.025};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(s[i]["lr"].get<double>() == doctest::Approx(want[i]).epsilon(1e-12));
    CHECK(s[i]["epoch"] == 1);  // numbered as the console numbers it
  }
  // Warmup 2 steps, then cosine to 0 at the last step.
  r = run(kData + " --global-batch 64 --lr 0.1 --epochs 2 --warmup-steps 2 --lr-schedule cosine --metrics " + m);
  REQUIRE(r.code == 0);
  s = step_records(m);
  REQUIRE(s.size() == 16);
  CHECK(s[0]["lr"].get<double>() == doctest::Approx(0.05));  // the warmup's first rate, lr / 2
  CHECK(s[2]["lr"].get<double>() == doctest::Approx(0.1));   // the cosine's start
  CHECK(s[15]["lr"].get<double>() < 0.01);
  for (int i = 3; i < 16; ++i) CHECK(s[i]["lr"].get<double>() < s[i - 1]["lr"].get<double>());
  r = run(kData + " --epochs 1 --lr-schedule step");
  CHECK(r.code != 0);
  CHECK(r.out.find("--lr-step-size") != std::string::npos);
}

TEST_CASE("the progress bar: only on request off a terminal, and at most 10 redraws a second") {
  ::setenv("PHALANX_PROGRESS", "1", 1);
  const auto start = std::chrono::steady_clock::now();
  auto r = run(kData + " --global-batch 8 --epochs 3");
  ::unsetenv("PHALANX_PROGRESS");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto draws = std::count(r.out.begin(), r.out.end(), '\r');
  CHECK(draws >= 3);  // one epoch's last step at least
  // 192 steps: unthrottled that is 192 lines; allowed: the first and last of each epoch plus
  // 10 a second.
  CHECK(draws <= 3 * 2 + static_cast<long>(10 * secs) + 2);
  CHECK(draws < 192);
  r = run(kData + " --global-batch 8 --epochs 1");  // stdout is a file: no bar
  CHECK(std::count(r.out.begin(), r.out.end(), '\r') == 0);
}

namespace {
const std::string kNpz = std::string(PHALANX_EXAMPLE_DATA) + "/seed_case_study.npz";
const std::string kNpzData = " --train-x " + kNpz + ":x --train-y " + kNpz + ":y";
}  // namespace

TEST_CASE("a run stopped by a non-finite loss still reports every epoch and step before it (1-step epochs)") {
  // 512 samples, global batch 512: 1-step epochs, reported in groups; --lr 50 diverges to an
  // infinite loss at step 28 (the test reads where from the error).
  const std::string m = dir() + "/diverge.jsonl";
  for (int workers : {1, 2}) {
    CAPTURE(workers);
    std::remove(m.c_str());
    auto r = run(kNpzData + " --global-batch 512 --lr 50 --epochs 100 --metrics " + m, workers > 1, workers);
    INFO(r.out);
    REQUIRE(r.code != 0);
    const auto at = r.out.find(") at step ");
    REQUIRE(r.out.find("non-finite loss (") != std::string::npos);
    REQUIRE(at != std::string::npos);
    const long stop = std::atol(r.out.c_str() + at + 10);
    REQUIRE(stop > 5);
    // One worker: its sums are the sums. Two: rank 0 stopped alone (no collective), and says
    // its lines hold its own batches only.
    const std::string key = workers == 1 ? "train_loss" : "train_loss_rank0";
    for (long e = 1; e < stop; ++e) {
      CAPTURE(e);
      const std::string line = "epoch " + std::to_string(e) + ": train loss ";
      const auto p = r.out.find(line);
      REQUIRE(p != std::string::npos);
      const std::string rest = r.out.substr(p, r.out.find('\n', p) - p);
      CHECK((rest.find("rank 0's batches only") != std::string::npos) == (workers > 1));
    }
    CHECK(r.out.find("epoch " + std::to_string(stop) + ": train loss") == std::string::npos);
    // The metrics file: every step before the stop, each followed by its epoch's record.
    std::ifstream f(m);
    std::vector<nlohmann::json> recs;
    for (std::string line; std::getline(f, line);) recs.push_back(nlohmann::json::parse(line));
    REQUIRE(recs.size() == static_cast<std::size_t>(2 * (stop - 1)));
    for (long e = 1; e < stop; ++e) {
      CAPTURE(e);
      const auto& s = recs[2 * (e - 1)];
      const auto& ep = recs[2 * (e - 1) + 1];
      CHECK(s["step"] == e);
      CHECK(s["epoch"] == e);
      CHECK(ep["epoch"] == e);
      CHECK(ep.contains(key));
      if (workers == 1) CHECK(ep[key].get<double>() == doctest::Approx(s["loss"].get<double>()));
    }
  }
}

TEST_CASE("with a test set every epoch is reported as it ends (not in a group)") {
  // 1-step epochs with a test evaluation each. Grouped, the first 64 lines would come in one
  // write; reported as they end, the first line is read long before the 40th is written.
  const std::string cmd = std::string(PHALANX_TRAIN) + kNpzData + " --test-x " + kNpz + ":x --test-y " + kNpz +
                          ":y --model 64-256-10 --global-batch 512 --lr 0.1 --epochs 200 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out, first;
  char buf[65536];
  for (ssize_t got; (got = ::read(fileno(p), buf, sizeof buf)) > 0;) {
    out.append(buf, static_cast<std::size_t>(got));
    if (first.empty() && out.find("epoch 1: ") != std::string::npos) first = out;
  }
  const int status = ::pclose(p);
  INFO(out);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(!first.empty());
  CHECK(first.find("epoch 40: ") == std::string::npos);
  for (int e = 1; e <= 200; ++e) {
    CAPTURE(e);
    const auto at = out.find("epoch " + std::to_string(e) + ": train loss ");
    REQUIRE(at != std::string::npos);
    CHECK(out.substr(at, out.find('\n', at) - at).find(", test accuracy ") != std::string::npos);
  }
}

TEST_CASE("SIGINT while training without --checkpoint-dir: the finished epochs are reported, then the trainer dies by the signal") {
  const std::string m = dir() + "/sigint.jsonl", out = dir() + "/sigint.txt";
  const std::string cmd = std::string(PHALANX_TRAIN) + kNpzData + " --global-batch 512 --lr 0.1 --epochs 1000000 --metrics " + m +
                          " > " + out + " 2>&1";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait for training to start (the first step record), then some more 1-step epochs.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::ifstream f(m);
    std::string line;
    if (std::getline(f, line) && !line.empty()) break;
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    ::usleep(20000);
  }
  ::usleep(300000);
  REQUIRE(::kill(pid, SIGINT) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  std::ifstream o(out);
  std::stringstream ss;
  ss << o.rdbuf();
  const std::string text = ss.str();
  INFO(text);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
  CHECK(text.find("phalanx-train: stopped by SIGINT at step ") != std::string::npos);
  CHECK(text.find(": nothing saved (no --checkpoint-dir") != std::string::npos);
  // Every step taken has its record, and its epoch (one step each) its record and its line.
  std::ifstream f(m);
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(f, line);) recs.push_back(nlohmann::json::parse(line));
  REQUIRE(recs.size() >= 2);
  const long steps = recs[recs.size() - 2]["step"].get<long>();
  CHECK(steps > 1);
  REQUIRE(recs.size() == static_cast<std::size_t>(2 * steps));
  for (long e = 1; e <= steps; ++e) {
    CHECK(recs[2 * (e - 1)]["step"] == e);
    CHECK(recs[2 * (e - 1) + 1]["epoch"] == e);
    CHECK(recs[2 * (e - 1) + 1].contains("train_loss"));
  }
  CHECK(std::count(text.begin(), text.end(), '\n') >= steps);
  CHECK(text.find("epoch " + std::to_string(steps) + ": train loss ") != std::string::npos);
  CHECK(text.find("epoch " + std::to_string(steps + 1) + ": train loss ") == std::string::npos);
}

TEST_CASE("PHALANX_TIMELINE: the trainer's evaluation pass shows as validation, its input as load batch") {
  const std::string trace = dir() + "/trainer_timeline.json";
  std::remove(trace.c_str());
  const auto t = trainer_test::run_command("PHALANX_TIMELINE=" + trace + " " + PHALANX_TRAIN + " --global-batch 64 "
                                           "--epochs 2 --test-x " + dir() + "/x.npy --test-y " + dir() + "/y.npy" + kData,
                                           dir() + "/timeline_out.txt");
  INFO(t.out);
  REQUIRE(t.code == 0);
  std::ifstream f(trace);
  REQUIRE(f.good());
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::map<std::string, int> count;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "X") ++count[e.at("cat").get<std::string>() + "/" + e.at("name").get<std::string>()];
  CHECK(count["eval/validation"] == 2);  // one per epoch
  CHECK(count["data/load batch"] == 2 * 8);  // 512 samples in batches of 64, two epochs
  CHECK(count["optim/optimizer step"] == 2 * 8);
  std::remove(trace.c_str());
}
