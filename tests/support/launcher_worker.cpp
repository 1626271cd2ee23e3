// A worker program for the launcher tests. Modes:
//   env DIR             record the environment, allreduce once, exit 0
//   fail R CODE DIR     rank R exits with CODE after the first allreduce; the others keep
//                       allreducing (they block on the dead rank)
//   selfkill R DIR      rank R kills itself with SIGKILL mid-job
//   sleep DIR           sleep (for SIGINT tests)
//   fail-once DIR       rank 1 fails on the first attempt only; then everyone succeeds
//   spin DIR            allreduce until stopped; a rank whose collective fails (a peer
//                       died) says so and exits 1, as a survivor does
//   print-sleep DIR     print a line, then sleep (live output)
//   print-crash SIG DIR print two lines, then die by SIG (abort or segv)
//   progress DIR        rank 0 draws a '\r' progress bar (40 redraws, 25 ms apart), ends it
//                       with a newline and prints "bar done"; PHALANX_PROGRESS is recorded
//   uneven DIR          uneven inputs: rank 1 runs 3 more allreduces and returns 0 from main
//                       (its group alive); the others allreduce on, print their error, exit 1
//   kill-node1-once DIR on the first attempt, the first rank of node 1 (RANK == LOCAL_WORLD_SIZE)
//                       kills itself with SIGKILL after one allreduce; then everyone succeeds
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

namespace {
std::string env(const char* n) {
  const char* v = std::getenv(n);
  return v ? v : "";
}
void write_pid(const std::string& dir, int rank) {
  std::ofstream(dir + "/pid_" + std::to_string(rank) + "_" + env("PHALANX_RESTART_COUNT")) << ::getpid();
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rank = std::atoi(env("RANK").c_str());
  const std::string dir = argv[argc - 1];
  write_pid(dir, rank);
  if (mode == "sleep") {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "print-sleep") {
    std::printf("rank %d is up\n", rank);  // no fflush: the launcher makes stdout line-buffered
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "print-crash") {
    std::printf("rank %d about to crash\n", rank);
    std::printf("the last words of rank %d\n", rank);
    if (std::string(argv[2]) == "segv") ::raise(SIGSEGV);
    std::abort();
  }
  if (mode == "progress") {
    std::ofstream(dir + "/progress_env_" + std::to_string(rank)) << env("PHALANX_PROGRESS");
    if (rank == 0) {
      for (int i = 1; i <= 40; ++i) {
        std::printf("\rstep %d/40", i);
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      }
      std::printf("\n");
    }
    std::printf("bar done\n");
    return 0;
  }
  if (mode == "env") {
    std::ofstream f(dir + "/env_" + std::to_string(rank));
    for (const char* n : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "PHALANX_RESTART_COUNT", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PHALANX_STORE_HOSTED",
                          "PHALANX_LINE_BUFFERED", "PYTHONUNBUFFERED"})
      f << n << "=" << env(n) << "\n";
    f << "TOKEN_LEN=" << env("PHALANX_RDZV_TOKEN").size() << "\n";
  }
  if (mode == "fail-once" && rank == 1 && env("PHALANX_RESTART_COUNT") == "0") {
    std::printf("failing on purpose on the first attempt\n");
    return 1;
  }
  auto pg = parallel::init_process_group();
  const int world = pg->size();
  Tensor t = full({16}, rank + 1.0);
  pg->allreduce(t)->wait();
  if (t.data<float>()[0] != world * (world + 1) / 2.f) {
    std::fprintf(stderr, "wrong allreduce result %f\n", t.data<float>()[0]);
    return 9;
  }
  if (mode == "spin") {
    std::ofstream(dir + "/ready_" + std::to_string(rank) + "_" + env("PHALANX_RESTART_COUNT")) << "1";
    try {
      for (;;) {
        pg->allreduce(t)->wait();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d lost a peer: %s\n", rank, e.what());
      return 1;
    }
  }
  if (mode == "uneven") {
    if (rank == 1) {
      for (int i = 0; i < 3; ++i) pg->allreduce(t)->wait();
      std::printf("rank 1 ran out of batches\n");
      return 0;
    }
    try {
      for (;;) pg->allreduce(t)->wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return 1;
    }
  }
  if (mode == "kill-node1-once" && env("PHALANX_RESTART_COUNT") == "0" && env("RANK") == env("LOCAL_WORLD_SIZE")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::raise(SIGKILL);
  }
  if (mode == "kill-node1-once" && env("PHALANX_RESTART_COUNT") == "0") {
    try {
      for (;;) pg->allreduce(t)->wait();
    } catch (const std::exception&) {
      return 1;  // a survivor
    }
  }
  if (mode == "fail" || mode == "selfkill") {
    const int victim = std::atoi(argv[2]);
    if (rank == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::printf("rank %d going down\n", rank);
      std::fflush(stdout);
      if (mode == "selfkill") ::raise(SIGKILL);
      return std::atoi(argv[3]);
    }
    for (;;) pg->allreduce(t)->wait();  // blocks on the victim; stopped by the launcher
  }
  std::printf("rank %d done\n", rank);
  parallel::destroy_process_group();
  return 0;
}
