// phalanx-train --model cnn:...: the CNN spec (text and JSON), --sync-bn, --zero, image data
// from .npy files and Fashion-MNIST's inferred [1, 28, 28], and the one-line errors.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;
using trainer_test::Result;

namespace {

// /tmp/phalanx_train_cnn_<pid>: 96 images [1, 8, 8] whose class (of 4) is the bright
// quadrant, plus noise; images.npy, labels.npy and flat.npy ([96, 64], for the errors).
const std::string& dir() {
  static const std::string d = [] {
    const std::string p = "/tmp/phalanx_train_cnn_" + std::to_string(::getpid());
    std::system(("rm -rf " + p + " && mkdir -p " + p).c_str());
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
    save_npy(p + "/images.npy", x);
    save_npy(p + "/labels.npy", y);
    save_npy(p + "/flat.npy", x.reshape({n, 64}));
    // A test set of 95 (odd: the second worker's shard is padded, and must not be counted).
    Tensor tx = Tensor::empty({95, 1, 8, 8}), ty = Tensor::empty({95}, DType::Int64);
    std::copy_n(x.data<float>(), 95 * 64, tx.data<float>());
    std::copy_n(y.data<std::int64_t>(), 95, ty.data<std::int64_t>());
    save_npy(p + "/test_images.npy", tx);
    save_npy(p + "/test_labels.npy", ty);
    return p;
  }();
  return d;
}

Result run(const std::string& args, int workers = 1) {
  const std::string cmd =
      (workers > 1 ? std::string(PHALANX_RUN) + " --nproc-per-node " + std::to_string(workers) + " " : "") + PHALANX_TRAIN +
      " " + args;
  return trainer_test::run_command(cmd, dir() + "/out.txt");
}

nlohmann::json summary(const std::string& out) {
  const auto start = out.rfind("{\"");
  REQUIRE(start != std::string::npos);
  return nlohmann::json::parse(out.substr(start, out.find('\n', start) - start));
}

std::string data() { return " --train-x " + dir() + "/images.npy --train-y " + dir() + "/labels.npy"; }

// Largest |a - b| over every tensor of two saved state dicts (which must have the same names).
double max_diff(const std::string& a, const std::string& b) {
  const TensorMap x = load_npz(a), y = load_npz(b);
  REQUIRE(x.names() == y.names());
  double worst = 0;
  for (const auto& name : x.names()) {
    const Tensor& s = x.at(name);
    const Tensor& t = y.at(name);
    REQUIRE(s.shape() == t.shape());
    for (std::int64_t i = 0; i < s.numel(); ++i)
      worst = std::max(worst, s.dtype() == DType::Int64
                                  ? std::fabs(double(s.data<std::int64_t>()[i] - t.data<std::int64_t>()[i]))
                                  : std::fabs(double(s.data<float>()[i]) - double(t.data<float>()[i])));
  }
  return worst;
}

// The error line of a run that must fail with exit code 2 (a usage error) or 1.
std::string error_of(const std::string& args) {
  const Result r = run(args);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("phalanx-train: ") != std::string::npos);
  return r.out;
}

}  // namespace

TEST_CASE("a CNN on .npy images learns; its state dict has PyTorch's names, BatchNorm buffers included") {
  const std::string save = dir() + "/cnn.npz";
  auto r = run(data() + " --model cnn:4-8:4 --global-batch 16 --lr 0.1 --momentum 0.9 --epochs 6 --eval-train --save " + save);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("model cnn:4-8:4") != std::string::npos);
  CHECK(summary(r.out)["final_train_loss"].get<double>() < 0.7);  // ln 4 = 1.386 at the start
  const TensorMap m = load_npz(save);
  for (const char* k : {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                        "1.num_batches_tracked", "4.weight", "5.running_var", "9.weight", "9.bias"})
    CHECK_MESSAGE(m.contains(k), k);
  CHECK(m.at("0.weight").shape() == Shape{4, 1, 3, 3});
  CHECK(m.at("9.weight").shape() == Shape{4, 8 * 2 * 2});
  CHECK(m.at("1.num_batches_tracked").data<std::int64_t>()[0] == 36);  // 6 epochs of 6 steps
}

TEST_CASE("--sync-bn: 2 workers at global batch B equal 1 process at B; plain BatchNorm on 2 workers does not") {
  const std::string common = data() + " --test-x " + dir() + "/test_images.npy --test-y " + dir() +
                             "/test_labels.npy --model cnn:4-8:4 --global-batch 16 --lr 0.05 --epochs 2 --no-shuffle --save ";
  auto r = run(common + dir() + "/one.npz");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto one = summary(r.out);
  r = run(common + dir() + "/sync.npz --sync-bn", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  // The test set's 95 samples, 48 + 47 over the workers (the padded one not counted): the same
  // accuracy as one process's.
  CHECK(summary(r.out)["test_acc"].get<double>() == doctest::Approx(one["test_acc"].get<double>()).epsilon(1e-6));
  r = run(common + dir() + "/plain.npz", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const double sync = max_diff(dir() + "/one.npz", dir() + "/sync.npz");
  const double plain = max_diff(dir() + "/one.npz", dir() + "/plain.npz");
  MESSAGE("1 process vs 2 workers: SyncBatchNorm " << sync << ", per-worker BatchNorm " << plain);
  CHECK(sync < 1e-4);
  CHECK(plain > 1e-3);  // the per-worker statistics train another model
}

TEST_CASE("--zero: the sharded optimizer trains the same weights as the replicated one") {
  const std::string common =
      data() + " --model cnn:4-8:4 --global-batch 16 --lr 0.01 --optimizer adam --epochs 2 --no-shuffle --save ";
  auto r = run(common + dir() + "/ddp.npz", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  r = run(common + dir() + "/zero.npz --zero", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(max_diff(dir() + "/ddp.npz", dir() + "/zero.npz") < 1e-6);
}

TEST_CASE("--zero checkpoints hold the replicated optimizer's state: resuming without --zero equals one run") {
  const std::string common = data() + " --model cnn:4-8:4 --global-batch 16 --lr 0.01 --optimizer adam --sync-bn --no-shuffle";
  const std::string ck = dir() + "/zero_ck";
  std::system(("rm -rf " + ck).c_str());
  auto r = run(common + " --epochs 2 --zero --checkpoint-dir " + ck, 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  r = run(common + " --epochs 4 --checkpoint-dir " + ck + " --resume --save " + dir() + "/resumed.npz", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resumed at step 12") != std::string::npos);
  r = run(common + " --epochs 4 --save " + dir() + "/straight.npz", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(max_diff(dir() + "/resumed.npz", dir() + "/straight.npz") < 1e-6);
}

TEST_CASE("the model as a JSON object in --config") {
  const std::string cfg = dir() + "/cnn.json";
  std::ofstream(cfg) << R"({"model": {"conv": [4, 8], "classes": 4}, "global-batch": 16, "epochs": 1})";
  auto r = run("--config " + cfg + data());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("model cnn:4-8:4") != std::string::npos);
  std::ofstream(cfg) << R"({"model": {"conv": [4, 0]}})";
  CHECK(error_of("--config " + cfg + data()).find("integer >= 1") != std::string::npos);
  std::ofstream(cfg) << R"({"model": {"layers": [4]}})";
  CHECK(error_of("--config " + cfg + data()).find("unknown key 'layers'") != std::string::npos);
}

TEST_CASE("CNN errors are one line that names the fix") {
  CHECK(error_of(data() + " --model cnn:").find("cnn:C1-C2") != std::string::npos);
  CHECK(error_of(data() + " --model cnn:4-x:4").find("cnn:C1-C2") != std::string::npos);
  CHECK(error_of(data() + " --model cnn:4-8").find("needs the number of classes") != std::string::npos);
  CHECK(error_of(data() + " --model 64-4 --sync-bn").find("--sync-bn needs a model with BatchNorm") != std::string::npos);
  CHECK(error_of(data() + " --model cnn:4:4 --exact --micro-batch 8 --global-batch 16").find("--exact and --model") !=
        std::string::npos);
  CHECK(error_of(data() + " --model cnn:2-2-2-2:4").find("shrink the 8x8 images to nothing") != std::string::npos);
  CHECK(error_of(" --train-x " + dir() + "/flat.npy --train-y " + dir() + "/labels.npy --model cnn:4:4")
            .find("needs images") != std::string::npos);
  CHECK(error_of(data() + " --model cnn:4:3").find("the classes are --model cnn:...:K") != std::string::npos);
  CHECK(error_of(data() + " --model cnn:1000000-1000000:4").find("use fewer channels") != std::string::npos);
  CHECK(error_of(data() + " --model cnn:2000000000-2000000000:4").find("does not fit in a 64-bit integer") !=
        std::string::npos);
}

TEST_CASE("--dataset fashion-mnist infers [1, 28, 28] for a CNN") {
  struct stat st;
  if (::stat(samplers::kFashionMnistDir, &st) != 0) {
    MESSAGE("skipped: no " << samplers::kFashionMnistDir << " (Debian's dataset-fashion-mnist)");
    return;
  }
  auto r = run("--dataset fashion-mnist --model cnn:4 --global-batch 256 --lr 0.05 --momentum 0.9 --epochs 1", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("model cnn:4:10") != std::string::npos);
  CHECK(r.out.find("[1, 28, 28]") != std::string::npos);
  CHECK(summary(r.out)["test_acc"].get<double>() > 0.8);  // 0.85 measured
}
