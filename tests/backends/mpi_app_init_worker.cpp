// MPI initialised by the application before Phalanx (tests/backends/mpi_tests.cmake, 2 ranks
// under mpirun): the plugin takes the level MPI has (MPI_Query_thread) and acts on it
// (docs/mpi.md, "Threads"). Argument:
//   multiple      MPI_Init_thread(MPI_THREAD_MULTIPLE): operations from any thread work
//   single        MPI_Init (MPI_THREAD_SINGLE): another thread's operation is refused, one line
//   single-async  MPI_Init, then PHALANX_MPI_ASYNC=1: init fails with a ConfigError that says
//                 MPI was initialised before the group
// The application finalises MPI itself. Prints "mpi app init (<mode>): passed on rank R".
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "support/conformance.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

void run(const std::string& mode, int r) {
  if (mode == "single-async") {
    ::setenv("PHALANX_MPI_ASYNC", "1", 1);
    try {
      parallel::init_process_group();
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      REQUIRE_RANK(r, what.find("MPI runs at MPI_THREAD_SINGLE") != std::string::npos &&
                          what.find("MPI was initialised before this group") != std::string::npos &&
                          what.find('\n') == std::string::npos,
                   "got '" + what + "'");
      return;
    }
    REQUIRE_RANK(r, false, "PHALANX_MPI_ASYNC=1 on an application's MPI_THREAD_SINGLE was accepted");
  }
  auto pg = parallel::init_process_group();
  REQUIRE_RANK(r, pg->backend_name() == "mpi", "backend " + pg->backend_name());
  Tensor t = ones({4});
  const std::string e = on_other_thread([&] { pg->allreduce(t)->wait(); });
  if (mode == "multiple") {
    REQUIRE_RANK(r, e.empty(), "allreduce from another thread at MPI_THREAD_MULTIPLE: " + e);
    expect_values(r, "allreduce from another thread", t, [](std::int64_t) { return 2.0; });
  } else {
    REQUIRE_RANK(r, e.find("called from a thread other than the one that created the process group") !=
                        std::string::npos, "allreduce from another thread at MPI_THREAD_SINGLE: '" + e + "'");
    pg->allreduce(t)->wait();
    expect_values(r, "allreduce on the group's thread", t, [](std::int64_t) { return 2.0; });
  }
  // The application's own traffic on MPI_COMM_WORLD does not mix with the group's.
  int mine = r + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  REQUIRE_RANK(r, sum == 3, detail::concat("the application's allreduce gave ", sum));
  pg->barrier()->wait();
  pg.reset();
  parallel::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "multiple" && mode != "single" && mode != "single-async") {
    std::fprintf(stderr, "usage: mpi_app_init_worker multiple|single|single-async\n");
    return 2;
  }
  int provided = 0;
  if (mode == "multiple") {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  } else {
    MPI_Init(nullptr, nullptr);
  }
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  int status = 0;
  try {
    run(mode, r);
    std::printf("mpi app init (%s): passed on rank %d\n", mode.c_str(), r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi app init (%s): FAILED on rank %d: %s\n", mode.c_str(), r, e.what());
    status = 1;
  }
  std::fflush(stdout);
  if (status != 0) MPI_Abort(MPI_COMM_WORLD, status);
  MPI_Finalize();
  return status;
}
