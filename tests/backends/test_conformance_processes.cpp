// The conformance suite across real processes: forked ranks, torchrun-style environment,
// init_process_group() over a TCP store hosted by the parent (as phalanx-run does).
#include <doctest/doctest.h>

#include "support/conformance.hpp"

using namespace phalanx;
using namespace phalanx::test;

// The backend under test: gloo, or PHALANX_TEST_BACKEND; ctest runs this case again for each
// allreduce algorithm of the Gloo plugin and on the example backend (tests/CMakeLists.txt).
TEST_CASE("conformance of the backend under test: world sizes 2 to 4, processes over loopback TCP") {
  const std::string backend = conformance_backend();
  CAPTURE(backend);
  for (int world = 2; world <= 4; ++world) {
    CAPTURE(world);
    TcpStoreServer server(TcpStoreOptions{});
    const int port = server.port();
    const auto results = run_processes(world, [&](int rank) {
      set_rank_env(rank, world, port, backend);
      ::setenv("PHALANX_STORE_HOSTED", "1", 1);
      auto pg = parallel::init_process_group();
      REQUIRE_RANK(rank, pg->backend_name() == backend, pg->backend_name());
      REQUIRE_RANK(rank, default_world().rank == rank && default_world().size == world, "default world");
      run_conformance(*pg, {1, 1000, 300000});
      parallel::destroy_process_group();
      return 0;
    });
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(results[r].exit_code == 0);
    }
  }
}

TEST_CASE("rank 0 hosts the store itself when no launcher does") {
  // Find a free port, then let rank 0 bind it.
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port);
    ::unsetenv("PHALANX_STORE_HOSTED");
    auto pg = parallel::init_process_group();
    Tensor t = ones({10});
    pg->allreduce(t)->wait();
    REQUIRE_RANK(rank, t.data<float>()[0] == 2.f, "allreduce");
    pg->barrier()->wait();  // rank 0 (the store host) stays until everyone is done
    parallel::destroy_process_group();
    return 0;
  });
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
}
