// phalanx-train --model gpt:... on text (--dataset text:F,... and fortunes): the validation
// loss per epoch, the options that only mean something for a GPT, the one-line errors
// (exit 2), checkpoints and resume, --zero, --exact; phalanx-sample's determinism and errors.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;
using trainer_test::Result;

namespace {

// /tmp/phalanx_train_gpt_<pid>: a.txt and b.txt (English-like text, 6000 and 3000 bytes),
// binary.bin (NUL bytes), short.txt (40 bytes).
const std::string& dir() {
  static const std::string d = [] {
    const std::string p = "/tmp/phalanx_train_gpt_" + std::to_string(::getpid());
    std::system(("rm -rf " + p + " && mkdir -p " + p).c_str());
    const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran ", "far.\n"};
    std::uint64_t h = 12345;
    auto text = [&](std::size_t n) {
      std::string s;
      while (s.size() < n) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        s += words[(h >> 33) % 10];
      }
      s.resize(n);
      return s;
    };
    std::ofstream(p + "/a.txt") << text(6000);
    std::ofstream(p + "/b.txt") << text(3000);
    std::ofstream(p + "/short.txt") << text(40);
    std::ofstream bin(p + "/binary.bin", std::ios::binary);
    bin << text(100) << std::string(50, '\0') << text(100);
    return p;
  }();
  return d;
}

Result run(const std::string& args, int workers = 1) {
  const std::string cmd = (workers > 1 ? std::string(PHALANX_RUN) + " --nproc-per-node " + std::to_string(workers) + " "
                                       : std::string()) +
                          PHALANX_TRAIN + " " + args;
  return trainer_test::run_command(cmd, dir() + "/out.txt");
}

Result sample(const std::string& args) {
  return trainer_test::run_command(std::string(PHALANX_SAMPLE) + " " + args, dir() + "/sample.txt");
}

nlohmann::json summary(const std::string& out) {
  const auto at = out.rfind("{\"");
  REQUIRE(at != std::string::npos);
  return nlohmann::json::parse(out.substr(at, out.find('\n', at) - at));
}

const std::string kSmall = "--model gpt:2-2-16:32 --optimizer adamw --lr 3e-3 --global-batch 8 --seed 5 ";

std::string text_data() { return "--dataset text:" + dir() + "/a.txt," + dir() + "/b.txt "; }

// One line on stderr (the launcher may prefix it), exit 2, containing `needle`.
void check_usage_error(const Result& r, const std::string& needle) {
  CAPTURE(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("a GPT trains on text files and reports the validation loss each epoch") {
  const std::string m = dir() + "/m.jsonl";
  const Result r = run(kSmall + text_data() + "--epochs 2 --weight-decay 0.1 --warmup-steps 5 --lr-schedule cosine "
                       "--clip-grad-norm 1 --metrics " + m + " --save " + dir() + "/w.npz --plot " + dir() + "/p.svg");
  CAPTURE(r.out);
  REQUIRE(r.code == 0);
  // 9000 bytes: 8100 train, (8100 - 33) / 32 + 1 = 253 windows; 900 validate.
  CHECK(r.out.find("253 windows, model gpt:2-2-16:32 on windows of 32 bytes") != std::string::npos);
  CHECK(r.out.find("epoch 1: train loss ") != std::string::npos);
  CHECK(r.out.find(", validation loss ") != std::string::npos);
  CHECK(r.out.find("test accuracy") == std::string::npos);
  const auto s = summary(r.out);
  CHECK(s["val_loss"].get<double>() < std::log(256.0));  // learnt something over uniform bytes
  CHECK(s["steps"] == 2 * 32);  // ceil(253 / 8)
  int epochs = 0;
  std::ifstream f(m);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("val_loss")) continue;
    ++epochs;
    CHECK(!j.contains("test_acc"));
  }
  CHECK(epochs == 2);
  const TensorMap w = load_npz(dir() + "/w.npz");
  CHECK(w.contains("transformer.wte.weight"));
  CHECK(w.contains("transformer.wpe.weight"));
  CHECK(w.at("transformer.wpe.weight").shape() == Shape{32, 16});
  CHECK(trainer_test::slurp(dir() + "/p.svg").find("validation loss") != std::string::npos);

  // --init with the saved weights and the same run: a lower first-epoch loss.
  const Result again = run(kSmall + text_data() + "--epochs 1 --init " + dir() + "/w.npz");
  REQUIRE(again.code == 0);
  CHECK(summary(again.out)["val_loss"].get<double>() < summary(r.out)["val_loss"].get<double>() + 0.05);
}

TEST_CASE("two workers shard the windows; --zero keeps the result of the replicated optimizer") {
  // Weight decay 0.1: AdamW's two groups (nanoGPT's), each partitioned by ZeRO.
  const std::string base = kSmall + text_data() + "--epochs 1 --weight-decay 0.1 ";
  const Result plain = run(base + "--save " + dir() + "/plain.npz", 2);
  const Result zero = run(base + "--zero --save " + dir() + "/zero.npz", 2);
  CAPTURE(plain.out);
  CAPTURE(zero.out);
  REQUIRE(plain.code == 0);
  REQUIRE(zero.code == 0);
  CHECK(trainer_test::max_weight_diff(dir() + "/plain.npz", dir() + "/zero.npz") < 1e-5);
}

TEST_CASE("--dropout: each worker its stream from the seed and its rank, the same in every run") {
  const std::string base = kSmall + text_data() + "--epochs 1 --dropout 0.2 ";
  const Result a = run(base + "--save " + dir() + "/d1.npz", 2), b = run(base + "--save " + dir() + "/d2.npz", 2),
               off = run(kSmall + text_data() + "--epochs 1 --save " + dir() + "/d0.npz", 2);
  CAPTURE(a.out);
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  REQUIRE(off.code == 0);
  CHECK(trainer_test::max_weight_diff(dir() + "/d1.npz", dir() + "/d2.npz") == 0);
  CHECK(trainer_test::max_weight_diff(dir() + "/d1.npz", dir() + "/d0.npz") > 1e-6);  // the masks did something
}

TEST_CASE("a checkpointed GPT run resumes to the weights of an uninterrupted one") {
  const std::string ck = dir() + "/ck";
  std::system(("rm -rf " + ck).c_str());
  const std::string base = kSmall + text_data() + "--weight-decay 0.1 --lr-schedule cosine ";
  const Result full = run(base + "--epochs 2 --save " + dir() + "/full.npz");
  REQUIRE(full.code == 0);
  const Result first = run(base + "--epochs 2 --checkpoint-dir " + ck + " --checkpoint-every 40");
  REQUIRE(first.code == 0);
  // Resume from the mid-epoch checkpoint at step 40 (of 32 a epoch) and finish.
  const Result resumed = run(base + "--epochs 2 --resume-from " + ck + "/checkpoint-0000000040.npz --save " + dir() +
                             "/resumed.npz");
  CAPTURE(resumed.out);
  REQUIRE(resumed.code == 0);
  CHECK(resumed.out.find("resumed at step 40") != std::string::npos);
  CHECK(trainer_test::max_weight_diff(dir() + "/full.npz", dir() + "/resumed.npz") < 1e-6);
}

TEST_CASE("--exact gives the same GPT weights on one and two workers") {
  const std::string base = kSmall + text_data() + "--epochs 1 --exact --micro-batch 2 ";
  const Result one = run(base + "--save " + dir() + "/e1.npz");
  const Result two = run(base + "--save " + dir() + "/e2.npz", 2);
  CAPTURE(one.out);
  CAPTURE(two.out);
  REQUIRE(one.code == 0);
  REQUIRE(two.code == 0);
  CHECK(trainer_test::max_weight_diff(dir() + "/e1.npz", dir() + "/e2.npz") == 0);
}

TEST_CASE("bad GPT input is one line naming the value and the limit, exit 2") {
  check_usage_error(run("--model gpt:2-3-16:32 " + text_data()), "3 heads do not divide the width 16");
  check_usage_error(run("--model gpt:2-2-16 " + text_data()), "must be gpt:LAYERS-HEADS-WIDTH:CONTEXT");
  check_usage_error(run("--model gpt:2-2-16:0 " + text_data()), "must be gpt:LAYERS-HEADS-WIDTH:CONTEXT");
  check_usage_error(run("--model gpt:a-2-16:32 " + text_data()), "must be gpt:LAYERS-HEADS-WIDTH:CONTEXT");
  check_usage_error(run(kSmall + "--dataset text:" + dir() + "/binary.bin"),
                    dir() + "/binary.bin: not a text file: a NUL byte at offset 100");
  check_usage_error(run(kSmall + "--dataset text:" + dir() + "/short.txt"), "fewer than context + 1 = 33");
  check_usage_error(run(kSmall + "--dataset text:" + dir() + "/missing.txt"), dir() + "/missing.txt");
  check_usage_error(run(kSmall + "--dataset fashion-mnist"), "--dataset must be text:FILE[,FILE...] or fortunes");
  check_usage_error(run("--model 784-10 " + text_data()), "is text, for a language model");
  check_usage_error(run(kSmall + text_data() + "--classes 5"), "--classes does not apply");
  check_usage_error(run("--model 784-10 --dataset fashion-mnist --stride 4"), "--stride needs --model gpt");
  check_usage_error(run(kSmall + text_data() + "--stride 0"), "--stride 0: expected an integer in [1,");
  check_usage_error(run(kSmall + text_data() + "--dropout 1"), "--dropout 1: expected a number in [0, 1)");
  check_usage_error(run(kSmall + text_data() + "--exact --micro-batch 2 --dropout 0.1"), "--exact and --dropout conflict");
  check_usage_error(run(kSmall + text_data() + "--global-batch 1000"), "--global-batch 1000 is larger than the training set");
  // --init of a model with a shorter context.
  REQUIRE(run("--model gpt:2-2-16:16 --global-batch 8 " + text_data() + "--save " + dir() + "/ctx16.npz").code == 0);
  check_usage_error(run(kSmall + text_data() + "--init " + dir() + "/ctx16.npz"),
                    "transformer.wpe.weight has 16 positions, fewer than --model gpt:2-2-16:32's context 32");
}

TEST_CASE("phalanx-sample: the same seed gives the same text; errors are one line, exit 2") {
  const std::string w = dir() + "/sample_w.npz";
  REQUIRE(run(kSmall + text_data() + "--epochs 1 --save " + w).code == 0);
  const std::string args = "--model gpt:2-2-16:32 --weights " + w + " --prompt 'the cat' --tokens 60 --top-k 20 ";
  const Result a = sample(args + "--seed 1 --temperature 0.8"), b = sample(args + "--seed 1 --temperature 0.8"),
               c = sample(args + "--seed 2 --temperature 0.8");
  CAPTURE(a.out);
  REQUIRE(a.code == 0);
  CHECK(a.out.rfind("the cat", 0) == 0);
  CHECK(a.out.size() == 7 + 60 + 1);  // prompt, continuation, newline
  CHECK(a.out == b.out);
  CHECK(a.out != c.out);
  // nanoGPT's own file: the causal masks saved as buffers (transformer.h.<i>.attn.bias),
  // and no lm_head.weight (it is wte): the same text.
  {
    TensorMap nano;
    for (const auto& [k, v] : load_npz(w))
      if (k != "lm_head.weight") nano.set(k, v);
    nano.set("transformer.h.0.attn.bias", ones({1, 1, 32, 32}));
    nano.set("transformer.h.1.attn.bias", ones({1, 1, 32, 32}));
    save_npz(dir() + "/nano.npz", nano);
    const Result n = sample("--model gpt:2-2-16:32 --weights " + dir() + "/nano.npz --prompt 'the cat' --tokens 60 "
                            "--top-k 20 --seed 1 --temperature 0.8");
    CAPTURE(n.out);
    CHECK(n.out == a.out);
    CHECK(run(kSmall + text_data() + "--epochs 1 --init " + dir() + "/nano.npz").code == 0);
  }
  // A prompt longer than the context: the model sees its last 32 bytes (nanoGPT's crop).
  CHECK(sample("--model gpt:2-2-16:32 --weights " + w + " --tokens 5 --prompt '" + std::string(50, 'a') + "'").code == 0);

  check_usage_error(sample("--model gpt:2-2-16:64 --weights " + w), "has 32 positions but --model gpt:2-2-16:64 has the context 64");
  check_usage_error(sample("--model gpt:2-2-32:32 --weights " + w), "do not fit --model gpt:2-2-32:32");
  check_usage_error(sample("--model gpt:2-3-16:32 --weights " + w), "3 heads do not divide the width 16");
  check_usage_error(sample("--model gpt:2-2-16:32 --weights " + dir() + "/none.npz"), "none.npz");
  check_usage_error(sample(args + "--top-k 257"), "--top-k 257: expected an integer in [0, 256]");
  check_usage_error(sample(args + "--temperature 0"), "--temperature 0: expected a finite number > 0");
  check_usage_error(sample(args + "--tokens 0"), "--tokens 0: expected an integer >= 1");
  check_usage_error(sample("--weights " + w), "--model is required");
}
