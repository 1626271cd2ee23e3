// phalanx-train's inputs are checked where they enter: every numeric option against its
// range, config files, model sizes, the data (non-finite values, float labels, .npz members).
// Each case runs the real binary and reads its exit code and output.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "tools/trainer_harness.hpp"

using namespace phalanx;

namespace {

const std::string kNpz = std::string(PHALANX_EXAMPLE_DATA) + "/seed_case_study.npz";

std::string dir() {
  static const std::string d = [] {
    const std::string p = trainer_test::case_study_dir("phalanx_train_inputs");
    const TensorMap f = load_npz(kNpz);
    Tensor bad = f.at("x").clone();
    bad.data<float>()[17 * 64 + 3] = std::nanf("");
    bad.data<float>()[400 * 64] = std::numeric_limits<float>::infinity();
    save_npy(p + "/x_nan.npy", bad);
    // float64 labels, as np.save writes them (save_npy writes float32 and int64 only)
    const auto y = f.at("y").to_vector<std::int64_t>();
    std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (" + std::to_string(y.size()) + ",), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::ofstream out(p + "/y_f64.npy", std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(static_cast<char>(header.size() & 0xff));
    out.put(static_cast<char>(header.size() >> 8));
    out << header;
    for (auto v : y) {
      const double d = static_cast<double>(v);
      out.write(reinterpret_cast<const char*>(&d), 8);
    }
    return p;
  }();
  return d;
}

using trainer_test::Result;

Result run(const std::string& args, const std::string& env = "", bool launcher = false, int workers = 2) {
  const std::string cmd = env + " " +
                          (launcher ? std::string(PHALANX_RUN) + " --nproc-per-node " + std::to_string(workers) + " "
                                    : "") +
                          PHALANX_TRAIN + " " + args;
  return trainer_test::run_command(cmd, dir() + "/out.txt");
}

const std::string kData = " --train-x " + kNpz + ":x --train-y " + kNpz + ":y";

// A usage error: exit 2, one line, naming every piece of `expect`, nothing trained.
void check_usage_error(const std::string& args, const std::vector<std::string>& expect) {
  CAPTURE(args);
  const Result r = run(kData + " " + args + " --metrics " + dir() + "/never.jsonl");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK(r.out.rfind("phalanx-train: ", 0) == 0);
  for (const auto& e : expect) CHECK(r.out.find(e) != std::string::npos);
  CHECK(r.out.find("train loss") == std::string::npos);  // nothing trained
}

}  // namespace

TEST_CASE("--lr -0.1, nan, 0 and inf are errors naming the option, the value and the range") {
  for (const char* v : {"-0.1", "nan", "0", "inf", "-inf", "1e999", "0.1x", ""})
    check_usage_error(std::string("--lr '") + v + "'",
                      {std::string("--lr ") + (*v ? v : "''") + ": expected a finite number > 0"});
}

TEST_CASE("--momentum nan, inf and 1.5 are errors naming the option") {
  for (const char* v : {"nan", "inf", "1.5", "1", "-0.5"})
    check_usage_error(std::string("--momentum ") + v, {std::string("--momentum ") + v, "[0, 1)"});
}

TEST_CASE("every other numeric option has a range") {
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"--weight-decay -1", "--weight-decay -1: expected a finite number >= 0"},
      {"--weight-decay nan", "--weight-decay nan: expected a finite number >= 0"},
      {"--global-batch 0", "--global-batch 0: expected an integer in [1, 9223372036854775807]"},
      {"--global-batch 99999999999999999999", "--global-batch 99999999999999999999: expected an integer in [1, "},
      {"--global-batch 6.5", "--global-batch 6.5: expected an integer"},
      {"--epochs 0", "--epochs 0: expected an integer in [1, 2147483647]"},
      {"--epochs 2147483648", "--epochs 2147483648: expected an integer in [1, 2147483647]"},
      {"--base-lr -1 --base-batch 64", "--base-lr -1: expected a finite number > 0"},
      {"--base-lr 0.1 --base-batch 0", "--base-batch 0: expected an integer in [1, "},
      {"--warmup-steps -3", "--warmup-steps -3: expected an integer in [0, "},
      {"--checkpoint-dir " + dir() + "/ck --checkpoint-every -1", "--checkpoint-every -1: expected an integer in [0, "},
      {"--checkpoint-dir " + dir() + "/ck --keep-checkpoints 0", "--keep-checkpoints 0: expected an integer in [1, "},
      {"--seed -1", "--seed -1: expected an integer in [0, 18446744073709551615]"},
      {"--seed 18446744073709551616", "--seed 18446744073709551616: expected an integer in [0, "},
      {"--lr-schedule step --lr-step-size 0", "--lr-step-size 0: expected an integer in [1, "},
      {"--lr-schedule step --lr-step-size 10 --lr-gamma 0", "--lr-gamma 0: expected a number in (0, 1]"},
      {"--lr-schedule step --lr-step-size 10 --lr-gamma 2", "--lr-gamma 2: expected a number in (0, 1]"},
      {"--lr-schedule multistep --lr-milestones 10,5", "--lr-milestones 10,5: expected strictly increasing"},
      {"--lr-schedule multistep --lr-milestones 10,,20", "--lr-milestones 10,,20: expected strictly increasing"},
  };
  for (const auto& c : cases) check_usage_error(c.args, {c.expect});
}

TEST_CASE("options that need each other") {
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"--lr-schedule step", "--lr-schedule step needs --lr-step-size"},
      {"--lr-schedule multistep", "--lr-schedule multistep needs --lr-milestones"},
      {"--lr-step-size 5", "--lr-step-size needs --lr-schedule step"},
      {"--lr-milestones 5,6", "--lr-milestones needs --lr-schedule multistep"},
      {"--lr-gamma 0.5", "--lr-gamma needs --lr-schedule step or multistep"},
      {"--lr-schedule linear", "--lr-schedule: linear not in {constant,cosine,step,multistep}"},
      {"--resume", "--resume needs --checkpoint-dir"},
      {"--checkpoint-every 5", "--checkpoint-every needs --checkpoint-dir"},
      {"--keep-checkpoints 2", "--keep-checkpoints needs --checkpoint-dir"},
  };
  for (const auto& c : cases) check_usage_error(c.args, {c.expect});
}

TEST_CASE("sizes that overflow are named, not std::bad_alloc or stoll") {
  // 64*4e9 + 4e9 + 4e9*10 + 10 parameters: 2.2 TiB of float32 weights and gradients
  check_usage_error("--model 64-4000000000-10", {"--model 64-4000000000-10: 300000000010 parameters need",
                                                 "TiB", "of memory"});
  check_usage_error("--model 64-99999999999999999999-10", {"width 99999999999999999999 does not fit in a 64-bit integer"});
  check_usage_error("--model 64-4000000000000-4000000000000-10", {"the parameter count does not fit in a 64-bit integer"});
  // a batch larger than the data (it once overflowed to zero steps and a loss of 0, exit 0)
  const auto r = run(kData + " --global-batch 9223372036854775807");
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("--global-batch 9223372036854775807 is larger than the training set (512 samples); use "
                   "--global-batch 512 or less") != std::string::npos);
}

TEST_CASE("NaN in x.npy: an error naming the file, the row and the column; --no-data-check skips the scan") {
  const std::string args = " --train-x " + dir() + "/x_nan.npy --train-y " + dir() + "/y.npy";
  auto r = run(args);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find(dir() + "/x_nan.npy: row 17, column 3 is nan (2 non-finite values in all)") != std::string::npos);
  CHECK(r.out.find("train loss") == std::string::npos);
  // the test set is scanned too
  r = run(kData + " --test-x " + dir() + "/x_nan.npy --test-y " + dir() + "/y.npy");
  CHECK(r.out.find("x_nan.npy: row 17") != std::string::npos);
  r = run(args + " --no-data-check");
  CHECK(r.out.find("non-finite values in all") == std::string::npos);
  CHECK(r.out.find("512 samples") != std::string::npos);  // it got past loading
}

TEST_CASE("float64 labels: the message names float64 and the conversion") {
  const auto r = run(" --train-x " + dir() + "/x.npy --train-y " + dir() + "/y_f64.npy");
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find(dir() + "/y_f64.npy: labels are float64") != std::string::npos);
  CHECK(r.out.find("astype(np.int64)") != std::string::npos);
}

TEST_CASE("--train-x/--train-y read members of an .npz as file.npz:key") {
  auto r = run(kData + " --global-batch 64 --lr 0.1 --epochs 1 --no-shuffle");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("\"steps\":8") != std::string::npos);
  // the same data from .npy files trains to the same loss
  const auto npy = run(" --train-x " + dir() + "/x.npy --train-y " + dir() + "/y.npy --global-batch 64 --lr 0.1 --no-shuffle");
  const std::regex loss("\"final_train_loss\":([^,]+),");
  std::smatch a, b;
  REQUIRE(std::regex_search(r.out, a, loss));
  REQUIRE(std::regex_search(npy.out, b, loss));
  CHECK(a[1].str() == b[1].str());
  r = run(" --train-x " + kNpz + ":nope --train-y " + kNpz + ":y");
  CHECK(r.code != 0);
  CHECK(r.out.find(kNpz + " has no member 'nope' (members: x, y, 0.weight") != std::string::npos);
  r = run(" --train-x " + kNpz + " --train-y " + kNpz + ":y");
  CHECK(r.out.find("name the array as " + kNpz + ":KEY") != std::string::npos);
}

TEST_CASE("config-file errors name the file") {
  const std::string cfg = dir() + "/bad.json";
  struct Case {
    std::string json, expect;
  } cases[] = {
      {R"({"lr": -0.1})", "--lr -0.1: expected a finite number > 0"},
      {R"({"momentum": 1.5})", "--momentum 1.5: expected a number in [0, 1)"},
      {R"({"epochs": 2.5})", "key 'epochs' is a number (2.5): expected an integer, e.g. \"epochs\": 64"},
      {R"({"epochs": "2.5"})", "--epochs 2.5: expected an integer"},
      {R"({"epochz": 3})", "unknown option 'epochz'"},
      {R"({"lr": [0.1]})", "key 'lr' is an array ([0.1]): expected a number, e.g. \"lr\": 0.1"},
      {R"({"lr": true})", "key 'lr' is a boolean (true): expected a number, e.g. \"lr\": 0.1"},
      {R"({"shuffle": "yes"})", "key 'shuffle' is a string (\"yes\"): expected true or false, e.g. \"shuffle\": true"},
      {R"({"exact": 1})", "key 'exact' is an integer (1): expected true or false"},
      {R"({"optimizer": 3})", "key 'optimizer' is an integer (3): expected a string"},
      {R"({"lr-milestones": [4, "x"]})", "key 'lr-milestones' is an array ([4,\"x\"]): expected an array of integer"},
      {R"({"seed": null})", "key 'seed' is null (null): expected an integer"},
      {R"({"lr": 0.1,)", "not valid JSON"},
      {R"([1, 2])", "expected a JSON object of options"},
      {R"({"help": true})", "'help' is not a setting (run phalanx-train --help)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.json);
    std::ofstream(cfg) << c.json;
    const auto r = run(kData + " --config " + cfg);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("phalanx-train: --config " + cfg + ": " + c.expect) != std::string::npos);
  }
  // a good file: its values are checked and used, the command line still wins
  std::ofstream(cfg) << R"({"lr-schedule": "multistep", "lr-milestones": [4, 6], "lr-gamma": 0.5, "epochs": 3})";
  auto r = run(kData + " --config " + cfg + " --epochs 1");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"steps\":8") != std::string::npos);
  r = run(" --config /nonexistent/c.json");
  CHECK(r.out.find("--config /nonexistent/c.json: cannot open") != std::string::npos);
  // --shuffle on the command line overrides the file's "shuffle": false (the later flag wins)
  auto summary_line = [](const std::string& out) { return out.substr(out.rfind("{\"")); };
  std::ofstream(cfg) << R"({"shuffle": false, "epochs": 2})";
  const auto file_then_shuffle = run(kData + " --config " + cfg + " --shuffle");
  const auto file_only = run(kData + " --config " + cfg);
  const auto shuffled = run(kData + " --epochs 2");
  REQUIRE(file_then_shuffle.code == 0);
  REQUIRE(file_only.code == 0);
  REQUIRE(shuffled.code == 0);
  CHECK(summary_line(file_then_shuffle.out).substr(0, 60) == summary_line(shuffled.out).substr(0, 60));
  CHECK(summary_line(file_only.out).substr(0, 60) != summary_line(shuffled.out).substr(0, 60));
}

TEST_CASE("an option given twice takes the later value, on the command line and over a config file") {
  // The README test shortens the README's runs this way (" --epochs 1" appended).
  auto r = run(kData + " --epochs 30 --epochs 2");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("\"steps\":16") != std::string::npos);  // 2 epochs of 8 steps
  const std::string cfg = dir() + "/thirty_epochs.json";
  std::ofstream(cfg) << R"({"epochs": 30})";
  r = run(kData + " --config " + cfg + " --epochs 1");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("\"steps\":8") != std::string::npos);
  r = run(kData + " --epochs 1 --epochs 0");  // the later value is still checked
  CHECK(r.code == 2);
  CHECK(r.out.find("--epochs 0: expected an integer in [1, 2147483647]") != std::string::npos);
}

TEST_CASE("--help shows every default") {
  const auto r = run("--help");
  REQUIRE(r.code == 0);
  for (const char* s : {"--model TEXT=64-32-10", "--seed INT=0", "--optimizer TEXT:{sgd,adam,adamw}=sgd", "--lr FLOAT=0.1",
                        "--momentum FLOAT=0", "--weight-decay FLOAT=0", "--global-batch INT=64", "--warmup-steps INT=0",
                        "--lr-schedule TEXT:{constant,cosine,step,multistep}=constant", "--lr-gamma FLOAT=0.1",
                        "--epochs INT=1", "--device TEXT=cpu", "--backend TEXT=auto", "--checkpoint-every INT=0",
                        "--keep-checkpoints INT=3", "--activation TEXT:{relu,tanh}=relu"})
    CHECK_MESSAGE(r.out.find(s) != std::string::npos, s);
  // every option that takes a value shows a default (or "none")
  std::istringstream lines(r.out);
  std::string line;
  const std::regex valued(R"(^  (--[a-z-]+) (TEXT|INT|FLOAT|LIST)\b(.*))");
  const std::vector<std::string> no_default = {"--config", "--train-x", "--train-y", "--dataset", "--test-x", "--test-y",
                                               "--init", "--save", "--metrics", "--plot", "--tensorboard", "--checkpoint-dir",
                                               "--resume-from"};
  int valued_seen = 0;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, valued)) continue;
    ++valued_seen;
    if (std::find(no_default.begin(), no_default.end(), m[1].str()) != no_default.end()) continue;
    CHECK_MESSAGE(m[3].str().find('=') != std::string::npos, line);
  }
  CHECK(valued_seen >= 30);
}

TEST_CASE("the plot's ticks are round numbers and every point has a marker") {
  const std::string svg_path = dir() + "/p.svg";
  const auto r = run(kData + " --epochs 7 --plot " + svg_path + " --test-x " + kNpz + ":x --test-y " + kNpz + ":y");
  REQUIRE(r.code == 0);
  std::ifstream f(svg_path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string svg = ss.str();
  for (const char* axis : {"xtick", "ytick"}) {
    CAPTURE(axis);
    std::vector<double> ticks;
    const std::regex tick(std::string("class='") + axis + "'[^>]*>([^<]*)<");
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
      ticks.push_back(std::stod((*it)[1].str()));
    REQUIRE(ticks.size() >= 3);
    const double step = ticks[1] - ticks[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    CHECK((std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 || std::abs(mantissa - 5) < 1e-6));
    for (std::size_t i = 0; i < ticks.size(); ++i) {
      CHECK(std::abs(ticks[i] - ticks[0] - static_cast<double>(i) * step) < step * 1e-6);  // evenly spaced
      const double k = ticks[i] / step;
      CHECK(std::abs(k - std::round(k)) < 1e-6);  // on multiples of the step
    }
  }
  // 7 epochs x 2 curves, and one marker per legend entry
  std::size_t circles = 0;
  for (auto p = svg.find("<circle"); p != std::string::npos; p = svg.find("<circle", p + 1)) ++circles;
  CHECK(circles == 7 * 2 + 2);
}

TEST_CASE("the remainder hint names --global-batch") {
  const auto r = run(kData + " --global-batch 64", "", true, 3);
  CHECK(r.code != 0);
  CHECK(r.out.find("world size 3 does not divide the global batch 64") != std::string::npos);
  CHECK(r.out.find("--global-batch 63 or 66") != std::string::npos);
}

TEST_CASE("/dev/zero, a FIFO or a directory as --train-x: one line naming the file and what it is, exit 2, at once") {
  // They were read without end (RSS +230 MB/s), blocked forever, or failed unnamed.
  const std::string fifo = dir() + "/x.fifo", folder = dir() + "/x_dir", npz_fifo = dir() + "/d.npz";
  ::mkfifo(fifo.c_str(), 0600);
  ::mkdir(folder.c_str(), 0700);
  ::mkfifo(npz_fifo.c_str(), 0600);
  const struct {
    std::string args, line;
  } cases[] = {
      {"--train-x /dev/zero", "--train-x /dev/zero: is a character device, not a regular file"},
      {"--train-x " + fifo, "--train-x " + fifo + ": is a FIFO, not a regular file"},
      {"--train-x " + folder, "--train-x " + folder + ": is a directory, not a regular file"},
      {"--train-x " + npz_fifo + ":x", "--train-x " + npz_fifo + ": is a FIFO, not a regular file"},
      {"--train-x " + dir() + "/x.npy --test-x " + dir() + "/x.npy --test-y /dev/zero",
       "--test-y /dev/zero: is a character device, not a regular file"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run(c.args + " --train-y " + dir() + "/y.npy");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out == "phalanx-train: " + c.line + "\n");
    CHECK(seconds < 1.0);
  }
  // A --config file likewise (a FIFO blocked the open).
  const Result r = run("--config " + fifo);
  CHECK(r.code == 2);
  CHECK(r.out == "phalanx-train: --config " + fifo + ": is a FIFO, not a regular file\n");
}

TEST_CASE("--metrics through a symbolic link another user planted is refused and the link's target left unchanged") {
  if (::geteuid() != 0) return;  // a link of another user: made as root, then given away
  const std::string link = dir() + "/planted.jsonl", victim = dir() + "/victim.txt";
  std::ofstream(victim) << "precious";
  std::remove(link.c_str());
  REQUIRE(::symlink(victim.c_str(), link.c_str()) == 0);
  REQUIRE(::lchown(link.c_str(), 12345, 12345) == 0);
  const Result r = run(kData + " --metrics " + link);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("--metrics " + link + ": is a symbolic link of another user (uid 12345)") != std::string::npos);
  CHECK(trainer_test::slurp(victim) == "precious");
}

TEST_CASE("an MLP's last width must be the number of classes: --classes for labels that do not show every class") {
  // The case study's labels are 0..9: 10 classes.
  check_usage_error("--model 64-32", {"--model 64-32 ends in 32 outputs but the labels have 10 classes (0..9): make the "
                                      "last width 10, e.g. --model 64-32-10, or pass --classes 32 if some classes have "
                                      "no labels in this data"});
  check_usage_error("--model 64-5", {"--model 64-5 ends in 5 outputs but the labels have 10 classes (0..9): make the last "
                                     "width 10, e.g. --model 64-5-10"});
  check_usage_error("--model 64-32-10 --classes 12",
                    {"--model 64-32-10 ends in 10 outputs but --classes is 12: make the last width 12"});
  check_usage_error("--model 64-10 --classes 8", {"row ", " has the label 9 but --classes is 8 (labels 0..7): pass --classes 10 or more"});
  check_usage_error("--model 32-10", {"the data has [64] features per sample but --model starts with 32 inputs: make the "
                                      "first width 64, e.g. --model 64-10"});
  check_usage_error("--model cnn:4:3 --classes 5", {"--classes 5 and --model cnn:4:3 (3 classes) disagree"});
  check_usage_error("--classes 0", {"--classes"});
  // Labels that never show class 10 and 11: --classes 12 and a model ending in 12 train.
  const TensorMap f = load_npz(kNpz);
  auto y = f.at("y").to_vector<std::int64_t>();
  const std::string y_path = dir() + "/y_first_rows.npy";
  save_npy(y_path, tensor(y, {static_cast<std::int64_t>(y.size())}));
  const Result ok = run(" --train-x " + kNpz + ":x --train-y " + y_path + " --model 64-12 --classes 12");
  INFO(ok.out);
  CHECK(ok.code == 0);
  CHECK(ok.out.find("train loss") != std::string::npos);
  // A negative label: the file and the row.
  y[7] = -1;
  save_npy(y_path, tensor(y, {static_cast<std::int64_t>(y.size())}));
  const Result neg = run(" --train-x " + kNpz + ":x --train-y " + y_path + " --model 64-10");
  INFO(neg.out);
  CHECK(neg.code == 2);
  CHECK(neg.out.find(y_path + ": row 7 has the label -1: class labels are 0, 1, ..., classes - 1") != std::string::npos);
  // The test set's labels count too: a label 10 there makes 11 classes.
  y[7] = 10;
  save_npy(y_path, tensor(y, {static_cast<std::int64_t>(y.size())}));
  const Result test_set = run(kData + " --test-x " + kNpz + ":x --test-y " + y_path + " --model 64-10");
  INFO(test_set.out);
  CHECK(test_set.code == 2);
  CHECK(test_set.out.find("the labels have 11 classes (0..10)") != std::string::npos);
}
