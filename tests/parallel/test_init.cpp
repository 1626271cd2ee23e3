// init_process_group: environment parsing, backend selection, rendezvous checks.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <utility>
#include <vector>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using namespace std::chrono_literals;

namespace {
struct EnvGuard {
  std::vector<std::string> names = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                    "MASTER_PORT", "PHALANX_BACKEND", "PHALANX_CONFIG", "OMPI_COMM_WORLD_RANK",
                                    "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "PHALANX_TIMEOUT",
                                    "PHALANX_STORE_HOSTED", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID"};
  EnvGuard() { clear(); }
  ~EnvGuard() { clear(); }
  void clear() {
    for (auto& n : names) ::unsetenv(n.c_str());
  }
};
}  // namespace

TEST_CASE("no variables at all: a world of one on the built-in backend") {
  EnvGuard env;
  const auto e = parallel::read_launch_env();
  CHECK(e.world_size == 1);
  CHECK(e.source == "none");
  auto pg = parallel::init_process_group();
  CHECK(pg->backend_name() == "single");
  CHECK(parallel::is_initialized());
  CHECK_THROWS_AS(parallel::init_process_group(), ConfigError);
  parallel::destroy_process_group();
  CHECK_FALSE(parallel::is_initialized());
}

TEST_CASE("torchrun, OpenMPI and SLURM variables") {
  EnvGuard env;
  ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  auto e = parallel::read_launch_env();
  CHECK(e.source == "openmpi");
  CHECK(e.rank == 2);
  CHECK(e.world_size == 4);
  ::setenv("RANK", "1", 1);  // torchrun names take priority
  ::setenv("WORLD_SIZE", "3", 1);
  e = parallel::read_launch_env();
  CHECK(e.source == "env");
  CHECK(e.rank == 1);
  CHECK(e.local_rank == 1);
  env.clear();
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_STEP_ID", "0", 1);  // a task of srun
  e = parallel::read_launch_env();
  CHECK(e.source == "slurm");
  CHECK(e.rank == 5);
  env.clear();
  ::setenv("PMI_RANK", "3", 1);  // MPICH, Intel MPI
  ::setenv("PMI_SIZE", "6", 1);
  e = parallel::read_launch_env();
  CHECK(e.source == "pmi");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 6);
  std::string source;
  CHECK(launch_world_size(&source) == 6);
  CHECK(source == "PMI_SIZE");
}

TEST_CASE("sbatch's batch script is not a task of srun: a one-line error, not a wait for tasks that never start") {
  EnvGuard env;
  ::setenv("SLURM_PROCID", "0", 1);  // what sbatch -n 2 gives its batch script
  ::setenv("SLURM_NTASKS", "2", 1);
  CHECK_THROWS_WITH_AS(parallel::read_launch_env(), doctest::Contains("not a task of srun (no SLURM_STEP_ID)"),
                       ConfigError);
  ::setenv("SLURM_STEP_ID", "4294967291", 1);  // a reserved step id (batch script)
  CHECK_THROWS_AS(parallel::read_launch_env(), ConfigError);
  ::setenv("SLURM_STEP_ID", "3", 1);  // srun's fourth step
  CHECK(parallel::read_launch_env().world_size == 2);
  ::unsetenv("SLURM_STEP_ID");
  ::setenv("SLURM_NTASKS", "1", 1);  // sbatch -n 1 (the default): one process, as before
  CHECK(parallel::read_launch_env().world_size == 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("RANK", "0", 1);  // the way out the message names
  ::setenv("WORLD_SIZE", "1", 1);
  CHECK(parallel::read_launch_env().world_size == 1);
}

TEST_CASE("srun: rank 0 placed off the step's first node is a one-line error naming both nodes") {
  EnvGuard env;
  const auto results = run_processes(1, [&](int) {
    // srun --distribution=arbitrary with a hostfile listing n2 first: task 0 on n2.
    for (const auto& [k, v] : std::vector<std::pair<const char*, const char*>>{
             {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_ID", "7"},
             {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURMD_NODENAME", "n2"}})
      ::setenv(k, v, 1);
    parallel::InitOptions o;
    o.timeout = 2s;
    try {
      parallel::init_process_group(o);
      return 7;
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      std::fprintf(stderr, "%s\n", m.c_str());
      return m.find("rank 0 runs on node n2, not on the step's first node n1") != std::string::npos ? 0 : 3;
    } catch (const std::exception& e) {  // before: "cannot listen on n1:...", or a resolver error
      std::fprintf(stderr, "%s\n", e.what());
      return 4;
    }
  }, 60s);
  CHECK(results[0].exit_code == 0);
}

TEST_CASE("a malformed launch world size is an error, not a world of one; check_consistent needs a group") {
  EnvGuard env;
  for (const char* bad : {"2 ", "2x", "0", "-3", " "}) {
    CAPTURE(bad);
    ::setenv("WORLD_SIZE", bad, 1);
    // Before the fix "2 " counted as a world of one, so a worker trained alone.
    CHECK_THROWS_WITH_AS(launch_world_size(), doctest::Contains("is not a positive integer"), ValueError);
  }
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK(launch_world_size() == 2);
  // No group and a world of two: comparing settings with itself alone would pass silently.
  CHECK_THROWS_WITH_AS(parallel::check_consistent({{"a", "1"}}), doctest::Contains("init_process_group() first"),
                       ValueError);
}

TEST_CASE("a failed init leaves nothing behind: rank 0's store server is gone, a later init starts clean") {
  EnvGuard env;
  int port = 0;
  {
    TcpStoreServer probe{TcpStoreOptions{}};
    port = probe.port();
  }
  const auto results = run_processes(1, [&](int) {
    set_rank_env(0, 2, port);  // rank 1 never comes
    ::unsetenv("PHALANX_STORE_HOSTED");
    parallel::InitOptions o;
    o.timeout = 500ms;
    try {
      parallel::init_process_group(o);
      return 7;
    } catch (const TimeoutError&) {
    }
    try {
      TcpStoreOptions so;
      so.port = port;
      TcpStoreServer again(so);  // before the fix: the failed init's server still held the port
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 4;
    }
    return parallel::is_initialized() ? 5 : 0;
  }, 60s);
  CHECK(results[0].exit_code == 0);
}

TEST_CASE("bad values are clear errors") {
  EnvGuard env;
  ::setenv("RANK", "abc", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK_THROWS_WITH_AS(parallel::read_launch_env(), doctest::Contains("RANK='abc' is not an integer"), ConfigError);
  ::setenv("RANK", "2", 1);
  CHECK_THROWS_WITH_AS(parallel::read_launch_env(), doctest::Contains("rank 2 is not below the world size 2"),
                       ConfigError);
  ::unsetenv("WORLD_SIZE");
  CHECK_THROWS_WITH_AS(parallel::read_launch_env(), doctest::Contains("WORLD_SIZE is not"), ConfigError);
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK_THROWS_WITH_AS(parallel::init_process_group(), doctest::Contains("MASTER_ADDR is not set"), ConfigError);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "99999", 1);
  CHECK_THROWS_AS(parallel::read_launch_env(), ConfigError);
  ::setenv("PHALANX_TIMEOUT", "soon", 1);
  CHECK_THROWS_WITH_AS(default_timeout(), doctest::Contains("PHALANX_TIMEOUT='soon'"), ConfigError);
}

TEST_CASE("one range for the operation timeout, whichever way it is given") {
  EnvGuard env;
  for (const char* bad : {"1e10", "1e30", "0", "-5", "0.0001", "inf", "nan", "20s"}) {
    CAPTURE(bad);
    ::setenv("PHALANX_TIMEOUT", bad, 1);
    const std::string expect = std::string("PHALANX_TIMEOUT='") + bad + "' is not a number of seconds in [0.001, 1e+06]";
    CHECK_THROWS_WITH_AS(default_timeout(), doctest::Contains(expect.c_str()), ConfigError);
  }
  ::setenv("PHALANX_TIMEOUT", "1e6", 1);
  CHECK(default_timeout() == std::chrono::milliseconds(1000000000));
  ::setenv("PHALANX_TIMEOUT", "0.001", 1);
  CHECK(default_timeout() == std::chrono::milliseconds(1));
  ::unsetenv("PHALANX_TIMEOUT");
  CHECK(default_timeout() == kDefaultTimeout);
  parallel::InitOptions o;
  o.timeout = std::chrono::hours(24 * 365);
  CHECK_THROWS_WITH_AS(parallel::init_process_group(o), doctest::Contains("is outside [1 ms, 1e+06 s]"), ConfigError);
}

TEST_CASE("backend priority: argument > PHALANX_BACKEND > config file > auto") {
  EnvGuard env;
  parallel::InitOptions o;
  CHECK(parallel::resolve_backend(o, 1) == "single");
  CHECK(parallel::resolve_backend(o, 2) == "auto");
  const std::string cfg = "/tmp/phalanx_cfg_" + std::to_string(::getpid()) + ".json";
  { std::ofstream(cfg) << R"({"backend": "from-config"})"; }
  ::setenv("PHALANX_CONFIG", cfg.c_str(), 1);
  CHECK(parallel::resolve_backend(o, 2) == "from-config");
  ::setenv("PHALANX_BACKEND", "from-env", 1);
  CHECK(parallel::resolve_backend(o, 2) == "from-env");
  o.backend = "from-arg";
  CHECK(parallel::resolve_backend(o, 2) == "from-arg");
  { std::ofstream(cfg) << "{not json"; }
  ::unsetenv("PHALANX_BACKEND");
  o.backend = "";
  CHECK_THROWS_WITH_AS(parallel::resolve_backend(o, 2), doctest::Contains("is not valid JSON"), ConfigError);
  std::remove(cfg.c_str());
}

TEST_CASE("an explicitly named backend that cannot load is an error even in a world of one") {
  EnvGuard env;
  parallel::InitOptions o;
  o.backend = "nosuch";
  CHECK_THROWS_AS(parallel::init_process_group(o), PluginNotFoundError);
  CHECK_FALSE(parallel::is_initialized());
  o.backend = "gloo";  // a world of one on a real backend works (in-memory rendezvous)
  auto pg = parallel::init_process_group(o);
  CHECK(pg->backend_name() == "gloo");
  Tensor t = ones({4});
  pg->allreduce(t)->wait();
  CHECK(t.data<float>()[0] == 1.f);
  parallel::destroy_process_group();
}

TEST_CASE("workers that disagree on the world size, or share a rank, are rejected") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    if (rank == 1) ::setenv("WORLD_SIZE", "3", 1);  // a misconfigured worker
    parallel::InitOptions o;
    o.timeout = 3s;
    try {
      parallel::init_process_group(o);
    } catch (const ConfigError& e) {
      return std::string(e.what()).find("world size") != std::string::npos ? 0 : 4;
    } catch (const PeerFailedError& e) {
      // rank 1 of a world of 3 would wait for rank 2; rank 0's posted failure ends the wait
      const std::string m = e.what();
      return rank == 1 && m.find("rank 0 failed: ") != std::string::npos && m.find("world size") != std::string::npos
                 ? 0
                 : 5;
    }
    return 6;
  }, 30s);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);

  TcpStoreServer server2(TcpStoreOptions{});
  const int port2 = server2.port();
  results = run_processes(2, [&](int) {
    set_rank_env(0, 2, port2);  // both think they are rank 0
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions o;
    o.timeout = 2s;
    try {
      parallel::init_process_group(o);
    } catch (const ConfigError& e) {
      return std::string(e.what()).find("rank 0 is taken twice") != std::string::npos ? 0 : 4;
    } catch (const TimeoutError& e) {
      return 0;  // the first one in waits for rank 1, which never comes
    }
    return 6;
  }, 30s);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
}

TEST_CASE("file:// rendezvous") {
  const std::string path = "/tmp/phalanx_rdzv_" + std::to_string(::getpid());
  std::remove(path.c_str());
  const auto results = run_processes(3, [&](int rank) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "3", 1);
    ::setenv("PHALANX_BACKEND", "gloo", 1);
    parallel::InitOptions o;
    o.init_method = "file://" + path;
    auto pg = parallel::init_process_group(o);
    Tensor t = full({8}, rank + 1.0);
    pg->allreduce(t)->wait();
    return t.data<float>()[0] == 6.f ? 0 : 3;
  }, 60s);
  for (auto& r : results) CHECK(r.exit_code == 0);
  std::remove(path.c_str());
}
