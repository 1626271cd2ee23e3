// phalanx-train --precision: bf16 trains under autocast with a loss close to float32's, fp16
// is refused on the CPU and with --exact, the precision is in the summary and in checkpoints,
// and resuming with another precision works and says so. Short runs (CI has 2 cores).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;

namespace {

using trainer_test::Result;

std::string dir() {
  static const std::string d = trainer_test::case_study_dir("phalanx_precision");
  return d;
}

Result run(const std::string& args) {
  return trainer_test::run_command(std::string(PHALANX_TRAIN) + " " + args, dir() + "/out.txt");
}

// The case study's MLP 64-32-10 on its 512 samples, the textbook's initial weights.
const std::string kData = "--train-x " + dir() + "/x.npy --train-y " + dir() + "/y.npy --init " + dir() +
                          "/init.npz --model 64-32-10 --global-batch 64 --lr 0.1 --no-shuffle";

nlohmann::json summary(const std::string& out) {
  const auto start = out.rfind("{\"");
  REQUIRE(start != std::string::npos);
  return nlohmann::json::parse(out.substr(start, out.find('\n', start) - start));
}

int lines(const std::string& s) {
  int n = 0;
  for (char ch : s) n += ch == '\n';
  return n;
}

}  // namespace

TEST_CASE("--precision bf16 trains under autocast, its loss within 1 % of fp32's; the config file takes it") {
  const Result f = run(kData + " --epochs 30 --eval-train");
  INFO(f.out);
  REQUIRE(f.code == 0);
  const std::string cfg = dir() + "/bf16.json";
  {
    std::ofstream(cfg) << nlohmann::json{{"precision", "bf16"}}.dump();
  }
  const Result b = run(kData + " --epochs 30 --eval-train --config " + cfg);
  INFO(b.out);
  REQUIRE(b.code == 0);
  CHECK(b.out.find("precision bf16: forward and loss under autocast bfloat16") != std::string::npos);
  const auto sf = summary(f.out), sb = summary(b.out);
  CHECK(sf["precision"] == "fp32");
  CHECK(sb["precision"] == "bf16");
  const double lf = sf["final_train_loss"].get<double>(), lb = sb["final_train_loss"].get<double>();
  MESSAGE("final mean training loss: fp32 ", lf, ", bf16 ", lb);
  CHECK(lb != lf);                            // the forward did run in bf16
  CHECK(std::abs(lb - lf) <= 0.01 * lf);      // and trained as float32 does
  CHECK(lb < 0.75 * std::log(10.0));          // well below the untrained loss (ln 10 = 2.30)
}

TEST_CASE("--precision fp16 is refused on the CPU and with --exact, bf16 on the sim device, in one line") {
  Result r = run(kData + " --precision fp16");
  CHECK(r.code == 2);
  CHECK(lines(r.out) == 1);
  CHECK(r.out.find("--precision fp16 needs a GPU: the CPU autocasts to bfloat16 only") != std::string::npos);
  CHECK(r.out.find("use --precision bf16 on the CPU") != std::string::npos);
  r = run(kData + " --precision fp16 --device cuda --exact --micro-batch 16");
  CHECK(r.code == 2);
  CHECK(lines(r.out) == 1);
  CHECK(r.out.find("--exact and --precision fp16 conflict") != std::string::npos);
  r = run(kData + " --precision bf16 --device sim");  // the test device: no autocast there
  CHECK(r.code == 2);
  CHECK(r.out == "phalanx-train: --precision bf16 needs --device cpu or cuda: autocast has no sim:0 device\n");
  r = run(kData + " --precision fp16 --device sim");  // fp16 needs a GPU: the line names cuda only
  CHECK(r.code == 2);
  CHECK(r.out == "phalanx-train: --precision fp16 needs --device cuda: autocast has no sim:0 device\n");
  // A bf16 GEMM path this CPU cannot honour is refused at start-up (exit 2, before any step).
  r = trainer_test::run_command("PHALANX_BF16_GEMM=fast " + std::string(PHALANX_TRAIN) + " " + kData +
                                    " --precision bf16",
                                dir() + "/out.txt");
  CHECK(r.code == 2);
  CHECK(lines(r.out) == 1);
  CHECK(r.out.find("phalanx-train: ") == 0);
  CHECK(r.out.find("PHALANX_BF16_GEMM") != std::string::npos);
  r = run(kData + " --precision fp64");
  CHECK(r.code == 2);
  CHECK(r.out.find("fp64") != std::string::npos);
}

TEST_CASE("the precision is in the checkpoint; resuming with another one says so") {
  const std::string ck = dir() + "/ck";
  std::system(("rm -rf " + ck).c_str());
  Result r = run(kData + " --epochs 1 --precision bf16 --checkpoint-dir " + ck);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto latest = parallel::CheckpointDir(ck).latest();
  REQUIRE(latest.has_value());
  const parallel::LoadedCheckpoint loaded = parallel::load_checkpoint(*latest);
  REQUIRE(loaded.state.config.count("precision") == 1);
  CHECK(loaded.state.config.at("precision") == "bf16");
  r = run(kData + " --epochs 2 --precision fp32 --checkpoint-dir " + ck + " --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("phalanx-train: resuming a bf16 checkpoint with --precision fp32\n") != std::string::npos);
  CHECK(summary(r.out)["steps"] == 16);
  // The same precision again: no line.
  r = run(kData + " --epochs 3 --precision fp32 --checkpoint-dir " + ck + " --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resuming a") == std::string::npos);
  // A file written before --precision existed (no "precision" setting) loads, as fp32.
  const auto newest = parallel::CheckpointDir(ck).latest();
  REQUIRE(newest.has_value());
  parallel::LoadedCheckpoint old = parallel::load_checkpoint(*newest);
  REQUIRE(old.state.config.erase("precision") == 1);
  parallel::save_checkpoint(*newest, old.state);
  r = run(kData + " --epochs 4 --precision bf16 --checkpoint-dir " + ck + " --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("phalanx-train: resuming an fp32 checkpoint with --precision bf16\n") != std::string::npos);
  CHECK(summary(r.out)["steps"] == 32);
}

TEST_CASE("exact mode under --precision bf16: the same weights on 1 and 2 workers, bit for bit") {
  const std::string a = dir() + "/exact1.npz", b = dir() + "/exact2.npz";
  const std::string args = kData + " --epochs 1 --precision bf16 --exact --micro-batch 16 --save ";
  Result r = run(args + a);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("bf16 GEMM") != std::string::npos);
  r = trainer_test::run_command(std::string(PHALANX_RUN) + " --nproc-per-node 2 " + PHALANX_TRAIN + " " + args + b,
                                dir() + "/out.txt");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(trainer_test::max_weight_diff(a, b) == 0);
}

TEST_CASE("lr_scaling_study --precision bf16 --check: PyTorch's float32 figures within bf16's tolerance") {
  Result r = trainer_test::run_command(std::string(LR_SCALING_STUDY) + " --precision bf16 --check", dir() + "/out.txt");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("precision bf16: forwards and losses under autocast bfloat16") != std::string::npos);
  CHECK(r.out.find("check: passed") != std::string::npos);
  r = trainer_test::run_command(std::string(LR_SCALING_STUDY) + " --precision fp16", dir() + "/out.txt");
  CHECK(r.code == 2);  // the example takes fp32 and bf16 only
  CHECK(r.out == "lr_scaling_study: --precision fp16: expected fp32 or bf16 (the CPU autocasts to bfloat16 only)\n");
  r = trainer_test::run_command(std::string(LR_SCALING_STUDY) + " --precision bf16 --device sim", dir() + "/out.txt");
  CHECK(r.code == 2);  // refused before training, in the example's words
  CHECK(r.out == "lr_scaling_study: --precision bf16 needs --device cpu or cuda (autocast has no sim:0 device)\n");
}

TEST_CASE("a CNN with SyncBatchNorm on 2 workers trains under --precision bf16") {
  // 96 images [1, 8, 8] whose class (of 4) is the bright quadrant, plus noise.
  Generator g(11);
  const std::int64_t n = 96;
  Tensor x = randn({n, 1, 8, 8}, &g) * 0.5f;
  Tensor y = randint(4, {n}, &g);
  float* px = x.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t k = y.data<std::int64_t>()[i], r0 = (k / 2) * 4, c0 = (k % 2) * 4;
    for (std::int64_t r = r0; r < r0 + 4; ++r)
      for (std::int64_t c = c0; c < c0 + 4; ++c) px[i * 64 + r * 8 + c] += 1.5f;
  }
  save_npy(dir() + "/images.npy", x);
  save_npy(dir() + "/labels.npy", y);
  const std::string args = " --train-x " + dir() + "/images.npy --train-y " + dir() + "/labels.npy --test-x " + dir() +
                           "/images.npy --test-y " + dir() + "/labels.npy --model cnn:4-8:4 --global-batch 16 --lr 0.05 "
                           "--epochs 3 --no-shuffle --sync-bn --precision ";
  const std::string two = std::string(PHALANX_RUN) + " --nproc-per-node 2 " + PHALANX_TRAIN;
  const Result f = trainer_test::run_command(two + args + "fp32", dir() + "/out.txt");
  INFO(f.out);
  REQUIRE(f.code == 0);
  const Result b = trainer_test::run_command(two + args + "bf16", dir() + "/out.txt");
  INFO(b.out);
  REQUIRE(b.code == 0);  // SyncBatchNorm takes the bf16 activations (statistics in float32)
  const auto sf = summary(f.out), sb = summary(b.out);
  CHECK(sb["precision"] == "bf16");
  CHECK(sb["test_acc"].get<double>() >= 0.9);
  CHECK(std::abs(sb["final_train_loss"].get<double>() - sf["final_train_loss"].get<double>()) <=
        0.05 * sf["final_train_loss"].get<double>());
}
