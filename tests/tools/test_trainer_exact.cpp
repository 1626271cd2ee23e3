// phalanx-train --exact: byte-identical --save files on 1, 2 and 4 workers, resumes across
// world sizes (4 -> 2 at an epoch's end, 1 -> 4 mid-epoch) equal to the uninterrupted run,
// and the errors. The data and the hyperparameters are drawn here, from a seed chosen when
// the test runs (printed; PHALANX_EXACT_TEST_SEED=S repeats a run): data no test has seen.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;

namespace {

using trainer_test::Result;
using trainer_test::slurp;

struct Case {
  std::uint64_t seed = 0;
  std::string dir, args;  // args: data, model and hyperparameters, shared by every run
  std::string other_optimizer;  // args with the other optimizer's hyperparameters instead
  std::int64_t micro_batches = 0, micro_batch = 0, steps_per_epoch = 0;
};

// A random dataset and hyperparameters: N samples (rarely a multiple of the global batch)
// of D features in C classes, an MLP, SGD with momentum (Nesterov or not) or AdamW, shuffling,
// drop_last or not, a warmup and a constant, step or multistep rate, gloo or the default backend.
const Case& the_case() {
  static const Case c = [] {
    Case k;
    if (const char* s = std::getenv("PHALANX_EXACT_TEST_SEED")) k.seed = std::strtoull(s, nullptr, 10);
    else k.seed = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    std::mt19937_64 g(k.seed);
    auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(g); };
    auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g); };
    k.dir = "/tmp/phalanx_exact_" + std::to_string(::getpid());
    std::system(("rm -rf " + k.dir + " && mkdir -p " + k.dir).c_str());
    // Removed at exit (the printed seed repeats a run).
    static const struct Cleanup {
      std::string dir;
      ~Cleanup() { std::system(("rm -rf " + dir).c_str()); }
    } cleanup{k.dir};
    const std::int64_t d = pick(3, 12), classes = pick(2, 6);
    k.micro_batch = pick(1, 8);
    k.micro_batches = 4 * pick(1, 2);  // 1, 2 and 4 workers divide it; 3 does not
    const std::int64_t b = k.micro_batch * k.micro_batches;
    const std::int64_t n = pick(3 * b + 1, 8 * b);
    const bool drop_last = pick(0, 1) == 1;
    k.steps_per_epoch = drop_last ? n / b : (n + b - 1) / b;
    Generator gen(k.seed);
    save_npy(k.dir + "/x.npy", randn({n, d}, &gen) * 2.f);
    save_npy(k.dir + "/y.npy", randint(classes, {n}, &gen));
    std::string model = std::to_string(d) + "-" + std::to_string(pick(4, 24));
    if (pick(0, 1) == 1) model += "-" + std::to_string(pick(4, 16));
    model += "-" + std::to_string(classes);
    char sgd[256], adamw[256];
    std::snprintf(sgd, sizeof sgd, " --optimizer sgd --lr %.6g --momentum %.4g --weight-decay %.3g%s", real(0.02, 0.3),
                  real(0.5, 0.95), real(0, 1e-3), pick(0, 1) == 1 ? " --nesterov" : "");
    std::snprintf(adamw, sizeof adamw, " --optimizer adamw --lr %.6g --weight-decay %.3g", real(1e-3, 2e-2), real(0, 0.05));
    const bool sgd_first = pick(0, 1) == 0;
    // The rate's schedule (the step count it follows must not depend on W) and the backend.
    // No cosine: its length is --epochs, which the resume test changes.
    std::string schedule = " --warmup-steps " + std::to_string(pick(0, 3));
    const std::int64_t kind = pick(0, 2);
    if (kind == 1) schedule += " --lr-schedule step --lr-gamma 0.7 --lr-step-size " + std::to_string(pick(1, 5));
    if (kind == 2)
      schedule += " --lr-schedule multistep --lr-gamma 0.5 --lr-milestones " + std::to_string(pick(1, 4)) + "," +
                  std::to_string(pick(5, 2 * k.steps_per_epoch));
    schedule += pick(0, 1) == 1 ? " --backend gloo" : "";  // else auto: shared memory on one host
    const std::string common = " --train-x " + k.dir + "/x.npy --train-y " + k.dir + "/y.npy --model " + model +
                               " --global-batch " + std::to_string(b) + " --exact --micro-batch " +
                               std::to_string(k.micro_batch) + " --seed " + std::to_string(pick(0, 1000000)) +
                               " --shuffle" + (drop_last ? " --drop-last" : "") + schedule;
    k.args = common + (sgd_first ? sgd : adamw);
    k.other_optimizer = common + (sgd_first ? adamw : sgd);
    return k;
  }();
  return c;
}

Result run(const std::string& args, int workers) {
  const Case& k = the_case();
  const std::string cmd = (workers > 0 ? std::string(PHALANX_RUN) + " --nproc-per-node " + std::to_string(workers) + " " : "") +
                          PHALANX_TRAIN + " " + args;
  return trainer_test::run_command(cmd, k.dir + "/out.txt");
}

double final_loss(const std::string& out) {
  const auto start = out.rfind("{\"");
  REQUIRE(start != std::string::npos);
  return nlohmann::json::parse(out.substr(start, out.find('\n', start) - start))["final_train_loss"].get<double>();
}

std::string checkpoint_of(const std::string& dir, std::int64_t step) {
  char b[64];
  std::snprintf(b, sizeof b, "/checkpoint-%010lld.npz", static_cast<long long>(step));
  return dir + b;
}

// The uninterrupted run on one process (2 epochs, a checkpoint every few steps), shared.
struct Reference {
  std::string weights;
  double loss = 0;
  std::int64_t mid_step = 0;  // a checkpoint in the middle of epoch 2
};

const Reference& reference() {
  static const Reference ref = [] {
    const Case& k = the_case();
    Reference r;
    r.mid_step = k.steps_per_epoch + std::max<std::int64_t>(1, k.steps_per_epoch / 2);
    const Result res = run(k.args + " --epochs 2 --save " + k.dir + "/w1.npz --checkpoint-dir " + k.dir +
                               "/ck1 --checkpoint-every " + std::to_string(r.mid_step) + " --keep-checkpoints 5",
                           0);
    INFO(res.out);
    REQUIRE(res.code == 0);
    r.weights = slurp(k.dir + "/w1.npz");
    REQUIRE(r.weights.size() > 0);
    r.loss = final_loss(res.out);
    return r;
  }();
  return ref;
}

}  // namespace

TEST_CASE("--exact on 1, 2 and 4 workers: byte-identical --save files and the same logged loss (SGD, AdamW)") {
  const Case& k = the_case();
  MESSAGE("seed " << k.seed << " (PHALANX_EXACT_TEST_SEED repeats it):" << k.args);
  const Reference& ref = reference();
  for (int w : {2, 4}) {
    CAPTURE(w);
    const std::string save = k.dir + "/w" + std::to_string(w) + ".npz";
    const Result r = run(k.args + " --epochs 2 --save " + save, w);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(slurp(save) == ref.weights);
    CHECK(final_loss(r.out) == ref.loss);
  }
  // The other optimizer (SGD with momentum or AdamW, whichever the reference did not use).
  std::string first;
  double first_loss = 0;
  for (int w : {1, 2, 4}) {
    CAPTURE(w);
    const std::string save = k.dir + "/o" + std::to_string(w) + ".npz";
    const Result r = run(k.other_optimizer + " --epochs 2 --save " + save, w == 1 ? 0 : w);
    INFO(r.out);
    REQUIRE(r.code == 0);
    if (w == 1) {
      first = slurp(save);
      first_loss = final_loss(r.out);
      CHECK(first != ref.weights);  // another optimizer: other weights (the comparison can fail)
    } else {
      CHECK(slurp(save) == first);
      CHECK(final_loss(r.out) == first_loss);
    }
  }
}

TEST_CASE("an exact-mode checkpoint resumes on another world size, bit for bit: 4 -> 2 and 1 -> 4") {
  const Case& k = the_case();
  INFO("seed " << k.seed << ":" << k.args);
  const Reference& ref = reference();
  // 4 -> 2: one epoch on 4 workers, stopped; the second on 2.
  const std::string d = k.dir + "/ck4";
  Result r = run(k.args + " --epochs 1 --checkpoint-dir " + d, 4);
  INFO(r.out);
  REQUIRE(r.code == 0);
  r = run(k.args + " --epochs 2 --checkpoint-dir " + d + " --resume --save " + k.dir + "/r42.npz", 2);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resumed at step " + std::to_string(k.steps_per_epoch)) != std::string::npos);
  CHECK(slurp(k.dir + "/r42.npz") == ref.weights);
  CHECK(final_loss(r.out) == ref.loss);
  // 1 -> 4: from the single process's checkpoint in the middle of epoch 2 (its partial loss
  // sums included), on 4 workers.
  r = run(k.args + " --epochs 2 --resume-from " + checkpoint_of(k.dir + "/ck1", ref.mid_step) + " --save " + k.dir +
              "/r14.npz",
          4);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resumed at step " + std::to_string(ref.mid_step)) != std::string::npos);
  CHECK(slurp(k.dir + "/r14.npz") == ref.weights);
  CHECK(final_loss(r.out) == ref.loss);
}

TEST_CASE("exact mode's errors: the world size, the micro-batch, the options and the mode of a checkpoint; normal "
          "mode repeats itself") {
  const Case& k = the_case();
  const Reference& ref = reference();
  Result r = run(k.args + " --epochs 1", 3);  // 3 does not divide 4 or 8 micro-batches
  CHECK(r.code != 0);
  CHECK(r.out.find("the world size (3) does not divide the " + std::to_string(k.micro_batches) + " micro-batches") !=
        std::string::npos);
  const std::string data = " --train-x " + k.dir + "/x.npy --train-y " + k.dir + "/y.npy --model 3-2";
  r = run(data + " --global-batch 10 --exact --micro-batch 4", 0);
  CHECK(r.code == 2);
  CHECK(r.out.find("--micro-batch 4 does not divide --global-batch 10: choose a divisor of 10") != std::string::npos);
  r = run(data + " --micro-batch 4", 0);
  CHECK(r.code == 2);
  CHECK(r.out.find("--micro-batch needs --exact") != std::string::npos);
  r = run(data + " --exact", 0);
  CHECK(r.code == 2);
  CHECK(r.out.find("--exact needs --micro-batch M") != std::string::npos);
  r = run(data + " --exact --micro-batch 2 --allow-nonfinite", 0);
  CHECK(r.code == 2);
  CHECK(r.out.find("--exact and --allow-nonfinite conflict") != std::string::npos);
  r = run(data + " --exact --micro-batch 0", 0);
  CHECK(r.code == 2);
  CHECK(r.out.find("--micro-batch 0: expected an integer in [1,") != std::string::npos);
  // An exact checkpoint resumed in normal mode, and a normal one on another world size.
  const std::string exact_ck = checkpoint_of(k.dir + "/ck1", ref.mid_step);
  std::string normal = k.args;
  normal.replace(normal.find(" --exact --micro-batch"), std::string(" --exact --micro-batch ").size() +
                                                            std::to_string(k.micro_batch).size(), "");
  r = run(normal + " --epochs 2 --resume-from " + exact_ck, 0);
  CHECK(r.code != 0);
  CHECK(r.out.find("was written in exact mode (micro-batch " + std::to_string(k.micro_batch) +
                   ") and this run is not: resume with --exact --micro-batch " + std::to_string(k.micro_batch)) !=
        std::string::npos);
  r = run(normal + " --epochs 1 --checkpoint-dir " + k.dir + "/ckn --save " + k.dir + "/n1.npz", 2);
  REQUIRE(r.code == 0);
  // Normal mode is deterministic too: the same world size, seed and data give the same bytes.
  r = run(normal + " --epochs 1 --save " + k.dir + "/n2.npz", 2);
  REQUIRE(r.code == 0);
  CHECK(slurp(k.dir + "/n1.npz") == slurp(k.dir + "/n2.npz"));
  r = run(normal + " --epochs 2 --checkpoint-dir " + k.dir + "/ckn --resume", 0);
  CHECK(r.code != 0);
  CHECK(r.out.find("written with world size 2, this run has 1: resume with the same number of workers (only a "
                   "checkpoint written in exact mode, --exact, resumes on another)") != std::string::npos);
  r = run(k.args + " --epochs 2 --checkpoint-dir " + k.dir + "/ckn --resume", 0);
  CHECK(r.code != 0);
  CHECK(r.out.find("was written in normal mode and this run is in exact mode") != std::string::npos);
}

TEST_CASE("load_checkpoint: exact mode lets the world size change to any divisor of the micro-batches") {
  const std::string p = the_case().dir + "/lib.npz";
  parallel::CheckpointState s;
  s.model.set("w", zeros({2}));
  s.step = 0;
  s.world_size = 4;
  s.global_batch = 24;
  s.micro_batch = 2;  // 12 micro-batches a step
  s.exact = true;
  parallel::save_checkpoint(p, s);
  parallel::CheckpointExpect e;
  e.global_batch = 24;
  e.micro_batch = 2;
  e.exact = 1;
  for (int w : {1, 2, 3, 6, 12}) {
    e.world_size = w;
    CHECK(parallel::load_checkpoint(p, e).manifest.exact);
  }
  e.world_size = 5;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e),
                       doctest::Contains("12 micro-batches a step (global batch 24 / micro-batch 2), which 5 workers do "
                                         "not divide: resume on a number of workers that divides 12"),
                       ConfigError);
  e.world_size = 4;
  e.micro_batch = 4;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("resume with the same --micro-batch"),
                       ConfigError);
  e.micro_batch = 2;
  e.exact = 0;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("written in exact mode"), ConfigError);
  e.exact = -1;  // not checked: the stored shape must then match as in normal mode
  CHECK(parallel::load_checkpoint(p, e).manifest.exact);
  e.world_size = 2;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("written with world size 4"), ConfigError);
  s.exact = false;
  parallel::save_checkpoint(p, s);
  e.world_size = 4;
  e.exact = 1;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("written in normal mode"), ConfigError);
  e.exact = 0;
  CHECK_FALSE(parallel::load_checkpoint(p, e).manifest.exact);
}
