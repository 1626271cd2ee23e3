// Waits that fit the machine: gloo's small-message mesh spins only while the job's ranks on
// this machine fit its usable cores (BackendConfig::ranks_on_machine, counted over every
// launcher); past that it blocks, so ranks that outnumber the cores do not take turns on
// them (two launchers of 2 workers on 2 cores: 80 ms a step spinning, < 1 ms blocking).
// What shows it: the CPU time a rank burns while its peer sleeps before a collective.
#include <doctest/doctest.h>

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <thread>

#include <phalanx/core/cpu_count.hpp>
#include <phalanx/phalanx.hpp>

#include "../../parallel/rendezvous/src/host_topology.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

double cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Rank 0's CPU time (ms) in a 4-byte allreduce that rank 1 joins 300 ms late.
int cpu_ms_while_waiting(int ranks_on_machine, int port) {
  static int groups = 0;  // a fresh store prefix for each group
  ++groups;
  const auto results = run_processes(2, [&](int rank) {
    BackendConfig cfg;
    cfg.rank = rank;
    cfg.size = 2;
    cfg.local_world_size = 2;
    cfg.ranks_on_machine = ranks_on_machine;
    cfg.store = store_client(port, "waits" + std::to_string(groups));
    cfg.timeout = std::chrono::seconds(20);
    auto pg = create_process_group("gloo", cfg);
    Tensor t = ones({1});
    pg->allreduce(t)->wait();  // both connected and warm
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const double c0 = cpu_seconds();
    pg->allreduce(t)->wait();
    const double used = cpu_seconds() - c0;
    return rank == 0 ? std::min(250, static_cast<int>(used * 1000)) : 0;
  });
  return results[1].exit_code == 0 ? results[0].exit_code : -1;
}

}  // namespace

TEST_CASE("usable_cores: at least 1, at most the affinity mask's CPUs; a narrower mask lowers it") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  const int n = usable_cores();
  CHECK(n >= 1);
  CHECK(n <= CPU_COUNT(&set));
  const auto r = run_processes(1, [](int) {
    cpu_set_t one;
    CPU_ZERO(&one);
    cpu_set_t all;
    CPU_ZERO(&all);
    ::sched_getaffinity(0, sizeof all, &all);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &all)) {
        CPU_SET(c, &one);
        break;
      }
    if (::sched_setaffinity(0, sizeof one, &one) != 0) return 3;
    return usable_cores();
  });
  CHECK(r[0].exit_code == 1);
}

TEST_CASE("ranks on a machine: counted by machine, not by host") {
  parallel::HostTopology t;
  t.host_of_rank = {"h0", "h1", "h2", "h3"};  // four launchers (GROUP_RANK differs)
  t.machine_of_rank = {"m", "m", "other", "m"};
  CHECK(t.ranks_on_machine(0) == 3);
  CHECK(t.ranks_on_machine(2) == 1);
  CHECK(t.ranks_on_machine(3) == 3);
  CHECK(parallel::machine_identity() == parallel::machine_identity());
  CHECK(!parallel::machine_identity().empty());
}

TEST_CASE("gloo blocks instead of spinning when the machine's ranks outnumber its cores") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  ::unsetenv("PHALANX_GLOO_BUSY_POLL");
  const int blocking = cpu_ms_while_waiting(usable_cores() + 1, port);
  const int spinning = cpu_ms_while_waiting(1, port);
  CAPTURE(blocking);
  CAPTURE(spinning);
  CHECK(blocking >= 0);
  CHECK(blocking < 60);    // a few wake-ups, not 300 ms of polling
  CHECK(spinning > 150);   // the control: with the cores to spare it spins (fast wake-up)
  // PHALANX_GLOO_BUSY_POLL decides when set, either way.
  ::setenv("PHALANX_GLOO_BUSY_POLL", "1", 1);
  CHECK(cpu_ms_while_waiting(usable_cores() + 1, port) > 150);
  ::setenv("PHALANX_GLOO_BUSY_POLL", "0", 1);
  CHECK(cpu_ms_while_waiting(1, port) < 60);
  ::setenv("PHALANX_GLOO_BUSY_POLL", "maybe", 1);
  CHECK(cpu_ms_while_waiting(1, port) == -1);  // a one-line ConfigError, not a silent default
  ::unsetenv("PHALANX_GLOO_BUSY_POLL");
}
