// phalanx-train against the library's own DDP loop, in the same run (the bar: the
// trainer's time per step <= 1.2x the loop's). The textbook's demo on 2 workers under
// phalanx-run: MLP 64-32-10 on examples/data/seed_case_study.npz, global batch 256, SGD at
// one rate, the same backend, shuffled by the DistributedSampler. Both sides time every step
// of every epoch (set-up excluded) and are run alternately; medians of the runs, with their
// spread, and the ratio of the medians.
//
//   bench_trainer_step [--runs N] [--epochs E] [--global-batch B] [--backend B] [--bin DIR]
//                      [--before TRAINER]
//
// DIR holds phalanx-run and phalanx-train (default: ../bin next to this program). The
// library loop is this program itself, started by phalanx-run with --library-worker.
// --before runs another phalanx-train binary too (e.g. one built from an older commit).
// The data has 512 samples: 2 steps per epoch at the default global batch 256, so per-epoch
// work weighs as much as per-step; --global-batch 8 gives epochs of 64 steps.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

/// The textbook's data (found beside the executable: bench_support.hpp); exits with a
/// one-line error when it is not there.
const std::string& data_path() {
  static const std::string path = [] {
    try {
      return bench::data_file("seed_case_study.npz");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_trainer_step: %s\n", e.what());
      std::exit(2);
    }
  }();
  return path;
}
constexpr double kLr = 0.1;

struct Args {
  int runs = 9, epochs = 1000, global_batch = 256;  // 256: 2 steps an epoch
  std::string backend, bin, before;
  bool worker = false;
};

int count(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end || v < 1 || v > 1000000) {
    std::fprintf(stderr, "%s %s: expected an integer in [1, 1000000]\n", option.c_str(), text.c_str());
    std::exit(2);
  }
  return static_cast<int>(v);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--library-worker") a.worker = true;
    else if (k == "--runs") a.runs = std::max(1, count(k, value()));
    else if (k == "--epochs") a.epochs = std::max(2, count(k, value()));
    else if (k == "--global-batch") a.global_batch = 2 * std::max(1, count(k, value()) / 2);  // 2 workers
    else if (k == "--backend") a.backend = value();
    else if (k == "--bin") a.bin = value();
    else if (k == "--before") a.before = value();
    else {
      std::fprintf(stderr, "unknown argument %s (usage: bench_trainer_step [--runs N] [--epochs E] [--global-batch B] [--backend B] "
                   "[--bin DIR] [--before TRAINER])\n",
                   k.c_str());
      std::exit(2);
    }
  }
  return a;
}

/// The library loop, as a user writes it from the textbook (one rank of it).
int library_worker(const Args& a) {
  set_num_threads(1);
  parallel::InitOptions io;
  io.backend = a.backend;
  auto pg = parallel::init_process_group(io);
  auto data = load_npy_dataset(data_path() + ":x", data_path() + ":y", 10);
  Generator g(0);
  auto model = std::make_shared<parallel::DDP>(nn::mlp({64, 32, 10}, "relu", &g), pg);
  auto sampler = std::make_shared<DistributedSampler>(data->size());
  DataLoader loader(data, {a.global_batch / pg->size()}, sampler);
  optim::SGD opt(model->parameters(), optim::SGDOptions{kLr});
  pg->barrier()->wait();
  const double t = bench::now_s();
  std::int64_t steps = 0;
  for (int e = 0; e < a.epochs; ++e) {
    loader.set_epoch(e);
    for (Batch& b : loader) {
      opt.zero_grad();
      cross_entropy(model->forward(b.x), b.y).backward();
      opt.step();
      ++steps;
    }
  }
  const double us = (bench::now_s() - t) / steps * 1e6;
  if (pg->rank() == 0) std::printf("step_us=%f steps=%lld backend=%s\n", us, static_cast<long long>(steps), pg->backend_name().c_str());
  parallel::destroy_process_group();
  return 0;
}

std::string run(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen((cmd + " 2>&1").c_str(), "r")) {
    char buf[1024];
    while (fgets(buf, sizeof buf, p)) out += buf;
    if (pclose(p) != 0) {
      std::fprintf(stderr, "failed: %s\n%s\n", cmd.c_str(), out.c_str());
      std::exit(1);
    }
  }
  return out;
}

double number_after(const std::string& out, const std::string& key) {
  const auto pos = out.find(key);
  if (pos == std::string::npos) {
    std::fprintf(stderr, "no '%s' in:\n%s\n", key.c_str(), out.c_str());
    std::exit(1);
  }
  return std::stod(out.substr(pos + key.size()));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string self_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<std::size_t>(n));
  return p.substr(0, p.rfind('/'));
}

/// Median and spread; against the loop, also the median of the runs' own ratios (each
/// trainer run over the loop run just before it: robust to the machine's load drifting).
void report(const char* name, const std::vector<double>& v, const std::vector<double>& loop) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double m = median(v);
  std::printf("   %-36s median %7.1f us  (runs %.1f .. %.1f)", name, m, *lo, *hi);
  if (&v != &loop) {
    std::vector<double> paired;
    for (std::size_t i = 0; i < v.size(); ++i) paired.push_back(v[i] / loop[i]);
    std::printf("  %.2fx the loop (paired %.2fx)", m / median(loop), median(paired));
  }
  std::printf("\n");
}

/// The word after `key` in `out` ("" when absent).
std::string word_after(const std::string& out, const std::string& key) {
  const auto pos = out.find(key);
  if (pos == std::string::npos) return "";
  const auto begin = pos + key.size();
  return out.substr(begin, out.find_first_of("\n \",}", begin) - begin);
}

/// Time per step of one phalanx-train run, from its JSON summary; it must have run on `backend`.
double trainer_us(const std::string& command, const std::string& backend) {
  const std::string out = run("PHALANX_PROGRESS=0 " + command);
  if (word_after(out, "\"backend\":\"") != backend) {
    std::fprintf(stderr, "phalanx-train ran on another backend than the loop (%s):\n%s\n", backend.c_str(), out.c_str());
    std::exit(1);
  }
  return number_after(out, "\"seconds\":") / number_after(out, "\"steps\":") * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.worker) return library_worker(a);

  const std::string bin = a.bin.empty() ? self_dir() + "/../bin" : a.bin;
  const std::string self = self_dir() + "/bench_trainer_step";
  const std::string launch = bin + "/phalanx-run --nproc-per-node 2 ";
  const std::string backend = a.backend.empty() ? "" : " --backend " + a.backend;
  const std::string epochs = " --epochs " + std::to_string(a.epochs) + " --global-batch " + std::to_string(a.global_batch);
  const std::string args = " --train-x " + data_path() + ":x --train-y " + data_path() + ":y --model 64-32-10 --lr 0.1" + epochs + backend;
  const std::string trainer = launch + bin + "/phalanx-train" + args;
  const std::string metrics = "/tmp/bench_trainer_step_" + std::to_string(::getpid()) + ".jsonl";

  set_num_threads(1);  // as both sides' workers do
  bench::print_environment("bench_trainer_step");
  std::printf("textbook demo: MLP 64-32-10, seed_case_study.npz, global batch %d on 2 workers, SGD lr 0.1, %d epochs\n",
              a.global_batch, a.epochs);

  std::vector<double> loop, plain, with_metrics, before;
  std::string backend_used;
  for (int r = 0; r < a.runs; ++r) {
    const std::string lo = run(launch + self + " --library-worker" + epochs + backend);
    loop.push_back(number_after(lo, "step_us="));
    if (backend_used.empty()) backend_used = word_after(lo, "backend=");
    // The trainer's summary: "seconds" covers every step (set-up and the final save excluded).
    plain.push_back(trainer_us(trainer, backend_used));
    with_metrics.push_back(trainer_us(trainer + " --metrics " + metrics, backend_used));
    if (!a.before.empty()) before.push_back(trainer_us(launch + a.before + args, backend_used));
  }
  std::remove(metrics.c_str());

  std::printf("backend %s, %d runs each (alternating), time per step:\n", backend_used.c_str(), a.runs);
  report("library loop (bench_ddp_step's)", loop, loop);
  report("phalanx-train", plain, loop);
  report("phalanx-train --metrics (a record a step)", with_metrics, loop);
  if (!before.empty()) report(("--before " + a.before).c_str(), before, loop);
  std::printf("   ratio phalanx-train / loop: %.2f (bar <= 1.2)\n", median(plain) / median(loop));
  const bench::Summary l = bench::summarise(loop), t = bench::summarise(plain), m = bench::summarise(with_metrics);
  const std::string what = "textbook demo step under phalanx-run, 2 workers, " + backend_used + ", global batch " +
                           std::to_string(a.global_batch);
  bench::result_row("bench_trainer_step", "phalanx-train: " + what, t, "library loop", l, "us", 1,
                    std::string("<= 1.2: ") + (t.median / l.median <= 1.2 ? "met" : "NOT met"));
  bench::result_row("bench_trainer_step", "phalanx-train --metrics: " + what, m, "library loop", l, "us", 1, "-");
  bench::print_load_at_end();
  return 0;
}
