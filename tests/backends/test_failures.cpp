// What happens when things go wrong: ranks that never arrive, die mid-collective,
// plugins that are missing or incompatible. Never a hang.
#include <doctest/doctest.h>

#include <signal.h>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_CASE("a rank that never joins: the others get a TimeoutError naming it, within the timeout") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 3, port);  // world of 3, rank 2 never starts
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions o;
    o.timeout = 1500ms;
    const auto t0 = Clock::now();
    try {
      parallel::init_process_group(o);
    } catch (const TimeoutError& e) {
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const std::string what = e.what();
      if (what.find("rank(s) 2 of 3 never joined") == std::string::npos) {
        std::fprintf(stderr, "unexpected message: %s\n", e.what());
        return 4;
      }
      return secs < 5.0 ? 0 : 5;
    }
    return 6;
  }, 30s);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
}

TEST_CASE("a rank that never enters a collective: TimeoutError naming the op, then the group is broken") {
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store, 1s);
    if (rank == 1) {  // joins the group, then never calls allreduce (but stays alive)
      std::this_thread::sleep_for(3s);
      return;
    }
    const auto t0 = Clock::now();
    Tensor t = ones({100});
    auto work = pg->allreduce(t);
    bool timed_out = false;
    try {
      work->wait();
    } catch (const TimeoutError& e) {
      timed_out = std::string(e.what()).find("allreduce #0 on rank 0 of 2 (gloo)") != std::string::npos;
    }
    REQUIRE_RANK(rank, timed_out, "allreduce should time out with a message naming it");
    REQUIRE_RANK(rank, Clock::now() - t0 < 5s, "within the timeout");
    try {
      pg->allreduce(t)->wait();
      REQUIRE_RANK(rank, false, "a broken group must refuse new work");
    } catch (const CommError& e) {
      REQUIRE_RANK(rank, std::string(e.what()).find("broken") != std::string::npos, e.what());
    }
  });
}

TEST_CASE("a rank killed mid-collective: the survivor gets a CommError quickly, not a hang") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto t0 = Clock::now();
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions o;
    o.timeout = 20s;  // the failure must be seen long before this
    auto pg = parallel::init_process_group(o);
    Tensor t = ones({1 << 16});
    for (int i = 0; i < 5; ++i) pg->allreduce(t)->wait();
    if (rank == 1) ::raise(SIGKILL);
    try {
      for (int i = 0; i < 1000; ++i) pg->allreduce(t)->wait();
    } catch (const CommError& e) {
      std::fprintf(stderr, "rank 0 saw: %s\n", e.what());
      return std::string(e.what()).find("allreduce #") != std::string::npos ? 0 : 4;
    }
    return 5;
  }, 60s);
  CHECK(results[1].signal == SIGKILL);
  CHECK(results[0].exit_code == 0);
  CHECK(Clock::now() - t0 < 15s);
}

TEST_CASE("plugins: missing, ABI mismatch, unavailable; each with its own error") {
  CHECK_THROWS_WITH_AS(create_process_group("nosuch", BackendConfig{}),
                       doctest::Contains("Available backends: single, "), PluginNotFoundError);
  try {
    create_process_group("nosuch", BackendConfig{});
  } catch (const PluginNotFoundError& e) {
    CHECK(std::string(e.what()).find("gloo") != std::string::npos);
    CHECK(std::string(e.what()).find("libphalanx_nosuch.so") != std::string::npos);
  }
  BackendConfig cfg;
  CHECK_THROWS_WITH_AS(create_process_group("badabi", cfg, PHALANX_TEST_PLUGIN_DIR),
                       doctest::Contains("built for plugin ABI 999"), PluginAbiError);
  CHECK_THROWS_WITH_AS(create_process_group("unavailable", cfg, PHALANX_TEST_PLUGIN_DIR),
                       doctest::Contains("cannot run here: no frobnicator on this machine"),
                       BackendUnavailableError);
  std::string reason;
  CHECK_FALSE(backend_available("unavailable", &reason));
  CHECK(backend_available("gloo"));
  CHECK(backend_available("single"));
  const auto dirs = plugin_search_path("/explicit");
  CHECK(dirs.front() == "/explicit");
  CHECK_THROWS_AS(create_process_group("single", [] { BackendConfig c; c.size = 2; c.rank = 0; return c; }()),
                  ConfigError);
}
