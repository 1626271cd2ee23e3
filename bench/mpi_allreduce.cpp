// MPI plugin vs raw OpenMPI: float32 in-place sum allreduce, 4 B ... 64 MiB, in one run,
// one process per rank (docs/mpi.md). Raw: MPI_Allreduce(MPI_IN_PLACE, ..., MPI_COMM_WORLD),
// exactly ../shared/anchors/mpi_allreduce.c's loop. Phalanx: pg->allreduce(t)->wait() on
// backend mpi, what DDP calls. The two loops alternate, 5 times per size; each figure is
// the median of the 5 (rank 0's clock; iterations per loop as in the anchor); the best of
// the 5 beside it (the anchor's statistic: on a shared machine, noise only adds time).
//   mpirun --oversubscribe -np 2 build/bench/bench_mpi_allreduce
// (as root add --allow-run-as-root). PHALANX_MPI_ASYNC=1 measures the worker-thread mode.
// Optional arguments: [max_bytes [iterations]]: only the sizes up to max_bytes, and that many
// iterations per timed loop (e.g. `... bench_mpi_allreduce 4 200000` to profile the 4-byte path).
//
// The raw column above runs at the plugin's thread level: MPI_THREAD_SINGLE by default, so
// both columns pay what a plain MPI program pays; MPI_THREAD_SERIALIZED with
// PHALANX_MPI_THREADS=serialized or PHALANX_MPI_ASYNC=1 (OpenMPI 4.1 then locks inside every
// call, ~0.1 us per small allreduce on this machine, both columns). `--raw-single
// [max_bytes [iterations]]` times raw OpenMPI as the anchor and a plain MPI program run it:
// MPI_Init (MPI_THREAD_SINGLE), no Phalanx; run it as a separate job next to the plugin's
// run (docs/mpi.md, "Speed").
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"  // print_environment: the lines every benchmark prints first

using namespace phalanx;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const std::size_t kSizes[] = {4, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20};

int iterations_for(std::size_t bytes, int iterations) {
  return iterations > 0 ? iterations : bytes <= 65536 ? 2000 : bytes <= (4u << 20) ? 50 : 10;
}

/// The thread level MPI runs at (the plugin chose it when it initialised MPI).
const char* level_name() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
         : level == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
         : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                          : "MPI_THREAD_MULTIPLE";
}

/// --raw-single: raw OpenMPI only, initialised as a plain MPI program (MPI_THREAD_SINGLE).
int raw_single(std::size_t max_bytes, int iterations) {
  MPI_Init(nullptr, nullptr);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0)
    std::printf("raw OpenMPI alone (MPI_Init: MPI_THREAD_SINGLE), allreduce float32 sum in place, %d ranks, "
                "us per call: median of 5 | best of 5\n%10s %12s | %12s\n", size, "bytes", "raw single", "raw single");
  for (std::size_t bytes : kSizes) {
    if (bytes > max_bytes) break;
    const int n = static_cast<int>(bytes / 4);
    std::vector<float> a(static_cast<std::size_t>(n), 1.f);
    const int it = iterations_for(bytes, iterations);
    for (int i = 0; i < 5; ++i) MPI_Allreduce(MPI_IN_PLACE, a.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    std::vector<double> raw;
    for (int rep = 0; rep < 5; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < it; ++i) MPI_Allreduce(MPI_IN_PLACE, a.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      raw.push_back((MPI_Wtime() - t0) / it);
    }
    if (rank == 0) {
      std::printf("%10zu %12.3f | %12.3f\n", bytes, median(raw) * 1e6, *std::min_element(raw.begin(), raw.end()) * 1e6);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  const bool single = argc > 1 && std::strcmp(argv[1], "--raw-single") == 0;
  if (single) --argc, ++argv;
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64u << 20;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 0;  // 0: the anchor's counts
  if (max_bytes < 4 || iterations < 0) {
    std::fprintf(stderr, "usage: bench_mpi_allreduce [--raw-single] [max_bytes >= 4 [iterations >= 1]]\n");
    return 2;
  }
  if (single) return raw_single(max_bytes, iterations);
  auto pg = parallel::init_process_group();  // initialises MPI (backend mpi under mpirun)
  if (pg->backend_name() != "mpi") {
    std::fprintf(stderr, "bench_mpi_allreduce: run it under mpirun (the backend is '%s', not mpi)\n",
                 pg->backend_name().c_str());
    return 2;
  }
  const int rank = pg->rank();
  if (rank == 0) {
    bench::print_environment("bench_mpi_allreduce");
    std::printf("allreduce float32 sum in place, %d ranks, us per call: median of 5 | best of 5; "
                "speed = raw time / Phalanx time; raw at the plugin's MPI thread level, %s (compare --raw-single)\n",
                pg->size(), level_name());
    std::printf("%10s %12s %12s %7s | %12s %12s %7s\n", "bytes", "raw OpenMPI", "Phalanx mpi", "speed", "raw OpenMPI",
                "Phalanx mpi", "speed");
  }
  for (std::size_t bytes : kSizes) {
    if (bytes > max_bytes) break;
    const std::int64_t n = static_cast<std::int64_t>(bytes / 4);
    Tensor t = ones({n});
    float* a = t.data<float>();
    const int it = iterations_for(bytes, iterations);
    for (int i = 0; i < 5; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, a, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      pg->allreduce(t)->wait();
    }
    std::vector<double> raw, ours;
    for (int rep = 0; rep < 5; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < it; ++i)
        MPI_Allreduce(MPI_IN_PLACE, a, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      raw.push_back((MPI_Wtime() - t0) / it);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int i = 0; i < it; ++i) pg->allreduce(t)->wait();
      ours.push_back((MPI_Wtime() - t0) / it);
    }
    if (rank == 0) {
      const double r = median(raw), o = median(ours);
      const double rb = *std::min_element(raw.begin(), raw.end()), ob = *std::min_element(ours.begin(), ours.end());
      std::printf("%10zu %12.3f %12.3f %6.3fx | %12.3f %12.3f %6.3fx\n", bytes, r * 1e6, o * 1e6, r / o, rb * 1e6,
                  ob * 1e6, rb / ob);
      std::fflush(stdout);
    }
  }
  parallel::destroy_process_group();
  return 0;
}
