// Destroying a group with a send or receive still pending (its peer never posts the match):
// Backend::on_close ends the wait, the destructor returns at once (not at the timeout, nor
// when the peer leaves), and the Work fails with "the process group was destroyed before it
// completed". Gloo (UnboundBuffer::abortWaitRecv/Send) and shm (both the caller's-thread
// and the worker-thread paths), on two forked ranks; the peer keeps its group until after.
// Where operations run on a worker thread, an allreduce running when the group is destroyed
// (its peer joins 0.5 s later) is not disturbed: it completes with the right sum. None of
// this runs the group's failure hook.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

void expect_destroyed(int rank, const WorkPtr& w, const char* op) {
  REQUIRE_RANK(rank, w->is_completed(), detail::concat(op, ": not completed after the group was destroyed"));
  try {
    w->wait();
  } catch (const CommError& e) {
    const std::string m = e.what();
    REQUIRE_RANK(rank, m.find("destroyed before it completed") != std::string::npos, m);
    REQUIRE_RANK(rank, m.find(op) != std::string::npos, m);
    return;
  }
  REQUIRE_RANK(rank, false, detail::concat(op, ": the Work succeeded"));
}

int pending_p2p_then_destroy(const std::string& backend, bool with_collective, int rank, int port,
                             const std::string& prefix) {
  StorePtr store = store_client(port, prefix);
  BackendConfig cfg;
  cfg.rank = rank;
  cfg.size = 2;
  cfg.store = std::make_shared<PrefixStore>("pg", store);
  cfg.timeout = std::chrono::seconds(20);
  cfg.hostname = "127.0.0.1";
  cfg.local_rank = rank;
  cfg.local_world_size = 2;
  auto pg = create_process_group(backend, cfg);
  // Ending a pending send/recv at destruction is not a failure of the job: the failure hook
  // (which posts this rank's failure record under parallel::init_process_group) stays silent.
  auto hook_calls = std::make_shared<std::atomic<int>>(0);
  pg->set_failure_hook([hook_calls](std::exception_ptr e, const std::string&) {
    ++*hook_calls;
    return e;
  });
  pg->barrier()->wait();
  Tensor sum = full({1000}, static_cast<float>(rank + 1));
  if (rank == 0) {
    if (with_collective) {
      store->wait({"posted"}, std::chrono::seconds(30));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 1 is destroying its group
      pg->allreduce(sum)->wait();
    }
    // Keeps its group (posting nothing else) until rank 1 has destroyed its own.
    store->wait({"done"}, std::chrono::seconds(30));
    return 0;
  }
  Tensor in = zeros({16});
  Tensor out = ones({1 << 20});  // 4 MB: more than shm's ring holds, so the send waits too
  WorkPtr r = pg->recv(in, 0, 3);
  WorkPtr s = pg->send(out, 0, 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both posted and waiting
  REQUIRE_RANK(rank, !r->is_completed() && !s->is_completed(), "nothing matched them");
  WorkPtr a;
  if (with_collective) {
    a = pg->allreduce(sum);  // runs on the worker, waiting for rank 0
    store->set("posted", Bytes{1});
    // Time for the worker to take it up: on a loaded machine it could still be queued when
    // the group goes, and a queued operation ends "destroyed before it ran" by design (rank
    // 0 joins 500 ms after "posted", so the allreduce is still running when the group goes).
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto t0 = std::chrono::steady_clock::now();
  pg.reset();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  store->set("done", Bytes{1});
  // With the allreduce: the destructor waited for it (about 0.5 s), not for the timeout.
  REQUIRE_RANK(rank, took < (with_collective ? 3.0 : 2.0), detail::concat("destroying the group took ", took, " s"));
  if (with_collective) {
    a->wait();  // throws if on_close disturbed it
    REQUIRE_RANK(rank, sum.data<float>()[0] == 3.f && sum.data<float>()[999] == 3.f,
                 detail::concat("the allreduce gave ", sum.data<float>()[0]));
  }
  expect_destroyed(rank, r, "recv");
  expect_destroyed(rank, s, "send");
  REQUIRE_RANK(rank, hook_calls->load() == 0,
               detail::concat("the failure hook ran ", hook_calls->load(), " time(s) while the group was destroyed"));
  return 0;
}

}  // namespace

TEST_CASE("destroying a group with a pending send and receive ends them at once, a running allreduce completes") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  int i = 0;
  for (const std::string variant : {"gloo", "shm", "shm-worker"}) {
    CAPTURE(variant);
    const std::string backend = variant == "gloo" ? "gloo" : "shm";
    const std::string prefix = "close" + std::to_string(i++);
    const auto results = run_processes(2, [&](int rank) {
      if (variant == "shm-worker") ::setenv("PHALANX_SHM_INLINE", "0", 1);
      return pending_p2p_then_destroy(backend, variant != "shm", rank, port, prefix);
    }, std::chrono::seconds(40));
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(results[r].exit_code == 0);
    }
  }
}
