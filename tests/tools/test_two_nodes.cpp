// Jobs that span hosts, posed on this machine: ranks told (PHALANX_HOST_ID) that they sit on
// different hosts get the hierarchical group (shm or gloo within a host, gloo between the
// leaders); the conformance suite passes on it and DDP equals one process. W = 4 (2 + 2) with
// two launchers (--nnodes 2), W = 3 (2 + 1) with forked ranks (phalanx-run puts as many
// workers on every node). And auto on one host: shm when its plugin can run, gloo when asked.
#include <doctest/doctest.h>

#include "support/hierarchy_checks.hpp"
#include "tools/launcher_harness.hpp"

using namespace phalanx;
using namespace phalanx::test;
using namespace launcher_harness;

namespace {

std::string intra_name() { return backend_available("shm") ? "shm" : "gloo"; }

/// Forks `hosts.size()` ranks with a launcher's environment; rank r is on host hosts[r].
std::vector<ProcResult> run_on_hosts(const std::vector<int>& hosts, const std::string& backend,
                                     const std::function<void(const ProcessGroupPtr&)>& body) {
  const int world = static_cast<int>(hosts.size());
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  return run_processes(world, [&](int rank) {
    set_rank_env(rank, world, port, backend);
    if (backend.empty()) ::unsetenv("PHALANX_BACKEND");
    int local = 0, local_world = 0;
    for (int q = 0; q < world; ++q) {
      if (hosts[q] != hosts[rank]) continue;
      if (q < rank) ++local;
      ++local_world;
    }
    ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(local_world).c_str(), 1);
    ::setenv("PHALANX_HOST_ID", ("host-" + std::to_string(hosts[rank])).c_str(), 1);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    ::setenv("PHALANX_TIMEOUT", "30", 1);
    auto pg = parallel::init_process_group();
    body(pg);
    pg->barrier()->wait();  // no rank leaves while another still connects or computes
    parallel::destroy_process_group();
    return 0;
  }, std::chrono::seconds(50));
}

void check_all_zero(const std::vector<ProcResult>& results) {
  for (std::size_t r = 0; r < results.size(); ++r) {
    CAPTURE(r);
    CHECK(results[r].exit_code == 0);
  }
}

}  // namespace

TEST_CASE("W = 4 as two launchers of two workers, each its own host: hierarchical, conformance, DDP") {
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  const std::string dir = make_dir();
  const std::string expected = "hierarchical:" + intra_name() + "+gloo";
  auto args = [&](int node) {
    return std::vector<std::string>{"--nnodes", "2", "--nproc-per-node", "2", "--node-rank", std::to_string(node),
                                    "--master-addr", "127.0.0.1", "--master-port", std::to_string(port),
                                    "--rdzv-token", "hier-test", PHALANX_HIERARCHY_WORKER, expected, dir};
  };
  Launch n1 = start(args(1), dir, {{"PHALANX_HOST_ID", "node-1"}});
  Launch n0 = start(args(0), dir, {{"PHALANX_HOST_ID", "node-0"}});
  const int c0 = finish(n0, 50s), c1 = finish(n1, 50s);
  INFO(slurp(dir + "/launcher.out"));
  CHECK(c0 == 0);
  CHECK(c1 == 0);
  for (int r = 0; r < 4; ++r) CHECK(slurp(dir + "/ok_" + std::to_string(r)) == expected);
}

TEST_CASE("W = 3 on two hosts (2 + 1): hierarchical, conformance, DDP") {
  const std::string expected = "hierarchical:" + intra_name() + "+gloo";
  check_all_zero(run_on_hosts({0, 0, 1}, "", [&](const ProcessGroupPtr& pg) {
    REQUIRE_RANK(pg->rank(), pg->backend_name() == expected, pg->backend_name());
    run_conformance(*pg);
    check_ddp_equals_one_process(pg);
  }));
}

TEST_CASE("hosts interleaved by rank (0 and 2 on one host, 1 on another), and 'hierarchical' named on one host") {
  check_all_zero(run_on_hosts({0, 1, 0}, "", [&](const ProcessGroupPtr& pg) { run_conformance(*pg, {1, 1000}); }));
  check_all_zero(run_on_hosts({0, 0}, "hierarchical", [&](const ProcessGroupPtr& pg) {
    REQUIRE_RANK(pg->rank(), pg->backend_name().rfind("hierarchical:", 0) == 0, pg->backend_name());
    run_conformance(*pg, {1, 1000});
  }));
}

TEST_CASE("auto on one host picks shared memory when its plugin can run; gloo when asked") {
  const std::string want = intra_name();
  check_all_zero(run_on_hosts({0, 0}, "", [&](const ProcessGroupPtr& pg) {
    REQUIRE_RANK(pg->rank(), pg->backend_name() == want, pg->backend_name());
    Tensor t = full({4}, pg->rank() + 1.0);
    pg->allreduce(t)->wait();
    REQUIRE_RANK(pg->rank(), t.data<float>()[3] == 3.f, "allreduce");
  }));
  check_all_zero(run_on_hosts({0, 0}, "gloo", [&](const ProcessGroupPtr& pg) {
    REQUIRE_RANK(pg->rank(), pg->backend_name() == "gloo", pg->backend_name());
  }));
}

TEST_CASE("a rank of the other host dies mid-job: both ranks of the first host fail soon, naming the failure") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = run_on_hosts({0, 0, 1}, "", [&](const ProcessGroupPtr& pg) {
    Tensor t = ones({1000});
    pg->allreduce(t)->wait();
    if (pg->rank() == 2) ::_exit(3);  // gone without a word: its connections close
    try {
      for (;;) pg->allreduce(t)->wait();
    } catch (const CommError& e) {
      ::_exit(std::string(e.what()).find("allreduce") != std::string::npos ? 7 : 8);
    }
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(results[2].exit_code == 3);
  CHECK(results[0].exit_code == 7);
  CHECK(results[1].exit_code == 7);
  CHECK(secs < 20);  // well within PHALANX_TIMEOUT (30 s): the failure travels, nobody waits it out
}

TEST_CASE("a hierarchical group needs one host identity per rank") {
  BackendConfig cfg;
  cfg.size = 2;
  cfg.store = std::make_shared<MemoryStore>();
  HierarchyOptions h;
  h.host_of_rank = {"a"};
  CHECK_THROWS_WITH_AS(create_hierarchical_process_group(cfg, h), doctest::Contains("give one per rank"), ConfigError);
}
