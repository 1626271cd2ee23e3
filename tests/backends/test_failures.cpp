// What happens when things go wrong: ranks that never arrive, die mid-collective,
// plugins that are missing or incompatible. Never a hang.
#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <cstddef>
#include <cstring>

#include "phalanx/backends/backend.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/plugin_abi.h"
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

TEST_CASE("once an operation fails, the operations queued behind it fail at once; the hook runs once") {
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, store, 1s);
    if (rank == 1) {  // never enters a collective, stays alive
      std::this_thread::sleep_for(5s);
      return;
    }
    std::atomic<int> hook_calls{0};
    pg->set_failure_hook([&](std::exception_ptr, const std::string&) -> std::exception_ptr {
      ++hook_calls;
      return nullptr;
    });
    Tensor t = ones({64});
    const auto t0 = Clock::now();
    std::vector<WorkPtr> works;
    for (int i = 0; i < 4; ++i) works.push_back(pg->allreduce(t));
    int timeouts = 0;
    for (auto& w : works) {
      try {
        w->wait();
      } catch (const TimeoutError&) {
        ++timeouts;  // the first's error, kind kept, for all
      }
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr, "[failures] 4 queued allreduces failed after %.3f s, hook called %d time(s)\n", secs,
                 hook_calls.load());
    // Before the fix each queued allreduce ran and timed out in turn (4 s), each calling the hook.
    REQUIRE_RANK(rank, timeouts == 4, "every queued operation fails with the first failure");
    REQUIRE_RANK(rank, hook_calls == 1, "the failure hook runs for the first failure only");
    REQUIRE_RANK(rank, secs < 3.0, "the queued operations fail at once, not one timeout each");
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace {
// The vtable slot of a virtual member function (Itanium C++ ABI: the pointer holds 1 + the
// slot's byte offset). A virtual a probe class adds comes right after its base's own, so
// its slot is the number of slots the base has: a virtual added anywhere moves it.
template <class M>
std::ptrdiff_t vtable_slot(M m) {
  struct Rep {
    std::ptrdiff_t ptr, adj;
  } r;
  static_assert(sizeof(M) == sizeof(Rep), "Itanium member-function pointer");
  std::memcpy(&r, &m, sizeof r);
  return (r.ptr - 1) / static_cast<std::ptrdiff_t>(sizeof(void*));
}
struct KernelsProbe : DeviceKernels {
  virtual void probe_slot() {}
};
struct BackendProbe : Backend {
  virtual void probe_slot() {}
};
}  // namespace

TEST_CASE("plugin ABI: PHALANX_PLUGIN_ABI_VERSION changes with the layouts plugins share") {
  // A plugin built against other headers calls a vtable slot or a member offset that means
  // something else here: the loader can refuse it only if the version moved with the layout.
  // On a failure here: bump PHALANX_PLUGIN_ABI_VERSION (plugin_abi.h) and add its row.
  struct Layout {
    unsigned abi;
    std::size_t backend_size;
    std::ptrdiff_t backend_slots, kernel_slots;
  };
  const Layout known[] = {
      {8, 40, 16, 58},  // before the stream-ordering events
      {9, 40, 16, 65},  // DeviceKernels' event_* / stream_wait_event / set_comm_stream; Backend's flag
      {10, 40, 16, 66},  // DeviceKernels' gemm_bf16; TensorImpl's strides (views)
      {11, 40, 16, 67},  // DeviceKernels' event_handle; Work's device done event
      {12, 40, 17, 67},  // Backend's alloc_symmetric (zero-copy buffers)
  };
  const Layout now{PHALANX_PLUGIN_ABI_VERSION, sizeof(Backend), vtable_slot(&BackendProbe::probe_slot),
                   vtable_slot(&KernelsProbe::probe_slot)};
  const Layout* row = nullptr;
  for (const auto& l : known)
    if (l.abi == now.abi) row = &l;
  INFO("ABI ", now.abi, ": sizeof(Backend) ", now.backend_size, ", Backend's vtable slots ", now.backend_slots,
       ", DeviceKernels' ", now.kernel_slots);
  REQUIRE_MESSAGE(row != nullptr, "no recorded layout for this ABI version: add its row");
  CHECK(row->backend_size == now.backend_size);
  CHECK(row->backend_slots == now.backend_slots);
  CHECK(row->kernel_slots == now.kernel_slots);
}
#endif

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
