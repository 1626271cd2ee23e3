// A peer that ends cleanly (destroys its group, or exits 0) while the others still run
// collectives: uneven inputs. The survivors get a PeerFinishedError naming the peer, its
// collective count and parallel::Join within a fraction of a second, on shm and on gloo;
// a crash is still a death.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

/// A steady-clock time stamp shared by the forked ranks (CLOCK_MONOTONIC is system-wide).
struct Shared {
  std::atomic<std::int64_t> peer_left_ns{0};  ///< when the finishing rank began to leave
  std::atomic<std::int64_t> latency_ns{-1};   ///< the survivor's error, after that
};

Shared* shared_page() {
  void* p = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) Shared;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

/// DestroyInCatch: destroy_process_group() inside a catch block (the rank leaves because of
/// an error); ExitFromThread: another thread calls exit(0) while the main thread is inside a
/// collective. Neither is a clean end.
enum class End { Destroy, Exit0, Exit3, Kill, DestroyInCatch, ExitFromThread };

/// Rank `finisher` runs `few` allreduces then ends as `how`; the other runs one more and
/// returns 0 when its error is the expected kind (PeerFinishedError for a clean end, another
/// CommError saying `crash_word` for a crash), 4..7 otherwise. `host_store`: rank 0 serves
/// the store (no launcher), else the test process does.
std::vector<ProcResult> run_uneven(const std::string& backend, End how, Shared* sh, int finisher = 1,
                                   bool host_store = false, const std::string& crash_word = "died") {
  const int few = 3;
  std::unique_ptr<TcpStoreServer> server;
  int port = 0;
  if (host_store) {
    TcpStoreServer probe(TcpStoreOptions{});  // a free port, then released for rank 0
    port = probe.port();
  } else {
    server = std::make_unique<TcpStoreServer>(TcpStoreOptions{});
    port = server->port();
  }
  return run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port, backend);
    if (!host_store) ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions o;
    o.timeout = 20s;  // the end must be seen long before this
    auto pg = parallel::init_process_group(o);
    Tensor t = ones({256});
    for (int i = 0; i < few; ++i) pg->allreduce(t)->wait();
    if (rank == finisher && how == End::ExitFromThread) {
      std::thread([sh] {
        std::this_thread::sleep_for(300ms);
        sh->peer_left_ns = now_ns();
        std::fflush(stderr);
        std::exit(0);
      }).detach();
      pg->allreduce(t)->wait();  // the survivor joins after 1 s: still running at the exit
      return 9;
    }
    if (rank != finisher && how == End::ExitFromThread) {
      // The finisher posted its part of allreduce #3 before it exited, so that one may still
      // complete here; #4 finds it gone. SIGPIPE ignored, as phalanx-run does for its workers
      // (a write to the dead peer's socket must fail, not kill).
      ::signal(SIGPIPE, SIG_IGN);
      std::this_thread::sleep_for(1s);
      try {
        pg->allreduce(t)->wait();
      } catch (const CommError&) {
        // seen below with the next one's error
      }
    }
    if (rank == finisher) {
      std::this_thread::sleep_for(300ms);  // the other is waiting in allreduce #3 by then
      pg.reset();
      sh->peer_left_ns = now_ns();
      std::fflush(stderr);
      switch (how) {
        case End::Destroy: parallel::destroy_process_group(); return 0;
        case End::Exit0: std::exit(0);
        case End::Exit3: std::exit(3);
        case End::Kill: ::raise(SIGKILL);
        case End::DestroyInCatch:
          try {
            throw std::runtime_error("data loader: corrupt shard 7");
          } catch (const std::exception&) {
            parallel::destroy_process_group();
          }
          return 1;
        case End::ExitFromThread: break;
      }
      return 9;
    }
    try {
      pg->allreduce(t)->wait();
    } catch (const PeerFinishedError& e) {
      sh->latency_ns = now_ns() - sh->peer_left_ns;
      const std::string what = e.what();
      std::fprintf(stderr, "rank %d saw: %s\n", rank, e.what());
      const bool clean = how == End::Destroy || how == End::Exit0;
      if (!clean) return 4;
      const std::string want = detail::concat("rank ", finisher, " finished");
      if (what.find("allreduce #3") == std::string::npos || what.find(want) == std::string::npos ||
          what.find("after 3 collectives") == std::string::npos || what.find("parallel::Join") == std::string::npos)
        return 5;
      return 0;
    } catch (const CommError& e) {
      sh->latency_ns = now_ns() - sh->peer_left_ns;
      std::fprintf(stderr, "rank %d saw: %s\n", rank, e.what());
      const bool clean = how == End::Destroy || how == End::Exit0;
      if (clean) return 6;
      return std::string(e.what()).find(crash_word) != std::string::npos ? 0 : 7;
    }
    return 8;
  }, 60s);
}

void check_clean(const std::string& backend, End how, int finisher = 1, bool host_store = false) {
  Shared* sh = shared_page();
  const auto results = run_uneven(backend, how, sh, finisher, host_store);
  const int survivor = 1 - finisher;
  CHECK(results[finisher].exit_code == 0);
  CHECK(results[survivor].exit_code == 0);
  const double ms = sh->latency_ns.load() / 1e6;
  MESSAGE(backend, ": the peer's clean end to PeerFinishedError: ", ms, " ms");
  CHECK(ms >= 0);
  CHECK(ms < 2000);
  ::munmap(sh, sizeof(Shared));
}

}  // namespace

TEST_CASE("shm: a peer that destroys its group after fewer collectives: PeerFinishedError naming Join, fast") {
  check_clean("shm", End::Destroy);
}

TEST_CASE("gloo: a peer that destroys its group after fewer collectives: PeerFinishedError naming Join, fast") {
  check_clean("gloo", End::Destroy);
}

TEST_CASE("shm and gloo: a peer that exits 0 without destroying its group counts as finished") {
  check_clean("shm", End::Exit0);
  check_clean("gloo", End::Exit0);
}

TEST_CASE("gloo: rank 0 hosting the store finishes first: it keeps the store up for the survivor to read why") {
  check_clean("gloo", End::Destroy, /*finisher=*/0, /*host_store=*/true);
}

TEST_CASE("a crash is still a death, not a finish: kill -9 (shm), exit(3) (shm, gloo)") {
  Shared* sh = shared_page();
  auto r = run_uneven("shm", End::Kill, sh);
  CHECK(r[1].signal == SIGKILL);
  CHECK(r[0].exit_code == 0);
  r = run_uneven("shm", End::Exit3, sh);
  CHECK(r[1].exit_code == 3);
  CHECK(r[0].exit_code == 0);
  r = run_uneven("gloo", End::Exit3, sh, 1, false, "closed its connection");
  CHECK(r[1].exit_code == 3);
  CHECK(r[0].exit_code == 0);
  ::munmap(sh, sizeof(Shared));
}

TEST_CASE("shm without init_process_group: a destroyed group is a PeerFinishedError with the count") {
  auto store = std::make_shared<MemoryStore>();
  std::string seen;
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("shm", rank, 2, store, 10s);
    Tensor t = ones({64});
    for (int i = 0; i < 2; ++i) pg->allreduce(t)->wait();
    if (rank == 0) {
      pg.reset();  // finished after 2
      return;
    }
    try {
      pg->barrier()->wait();  // #2: the peer is gone (or going)
    } catch (const PeerFinishedError& e) {
      seen = e.what();
    }
  });
  INFO(seen);
  CHECK(seen.find("barrier #2 on rank 1 of 2 (shm): rank 0 finished") != std::string::npos);
  CHECK(seen.find("after 2 collectives while this rank is in barrier #2") != std::string::npos);
  CHECK(seen.find("parallel::Join") != std::string::npos);
}

TEST_CASE("a rank that leaves in an error handler, or exits 0 mid-collective, is no clean end") {
  // destroy_process_group() while an exception is handled: a failure on shm, a lost
  // connection on gloo; never "finished ... Join".
  Shared* sh = shared_page();
  auto r = run_uneven("shm", End::DestroyInCatch, sh, 1, false, "failed");
  CHECK(r[1].exit_code == 1);
  CHECK(r[0].exit_code == 0);
  r = run_uneven("gloo", End::DestroyInCatch, sh, 1, false, "closed its connection");
  CHECK(r[1].exit_code == 1);
  CHECK(r[0].exit_code == 0);
  // exit(0) from another thread while this rank's main thread waits in allreduce #3: the
  // exit handler sees the operation in flight and posts nothing; the survivor reads a death.
  r = run_uneven("shm", End::ExitFromThread, sh, 1, false, "died");
  CHECK(r[1].exit_code == 0);
  CHECK(r[0].exit_code == 0);
  r = run_uneven("gloo", End::ExitFromThread, sh, 1, false, "closed its connection");
  CHECK(r[1].exit_code == 0);
  CHECK(r[0].exit_code == 0);
  ::munmap(sh, sizeof(Shared));
}
