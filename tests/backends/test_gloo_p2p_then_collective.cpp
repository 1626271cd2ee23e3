// Collectives after an uneven number of sends and receives (PyTorch allows it): rank 0 sends
// to ranks 1 and 2, each of them receives once, then barrier, allreduce and broadcast. The
// group's sequence number counts the sends and receives, so a backend that tagged its
// collectives with it (Gloo did) gave the ranks different tags and hung until the timeout.
// A receive posted before the collectives with the tag of one of them (tag 1: the second
// collective's count) must not catch any collective's message. On gloo, shm and the
// hierarchical group (gloo within and between hosts), on forked ranks.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "phalanx/backends/hierarchical_process_group.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

ProcessGroupPtr make_group(const std::string& backend, int rank, int world, int port, const std::string& prefix) {
  TcpStoreOptions o;
  o.port = port;
  BackendConfig cfg;
  cfg.rank = rank;
  cfg.size = world;
  cfg.store = std::make_shared<PrefixStore>(prefix, std::make_shared<TcpStore>(o));
  cfg.timeout = std::chrono::seconds(8);  // a hang fails (TimeoutError: exit code 1) in seconds, not 300 s
  cfg.hostname = "127.0.0.1";
  cfg.local_rank = rank;
  cfg.local_world_size = world;
  if (backend != "hierarchical") return create_process_group(backend, cfg);
  HierarchyOptions h;
  h.host_of_rank = {"a", "a", "b"};
  return create_hierarchical_process_group(cfg, h);
}

int uneven_p2p_then_collectives(const std::string& backend, int rank, int port) {
  constexpr int W = 3;
  auto pg = make_group(backend, rank, W, port, backend);
  // Uneven: rank 0 issues two sends, ranks 1 and 2 one receive each.
  Tensor msg = full({5}, 10.f);
  Tensor early = zeros({3});
  WorkPtr late_recv;
  if (rank == 0) {
    auto a = pg->send(msg, 1, 0);
    auto b = pg->send(msg, 2, 0);
    a->wait();
    b->wait();
  } else {
    Tensor in = zeros({5});
    pg->recv(in, 0, 0)->wait();
    REQUIRE_RANK(rank, in.data<float>()[4] == 10.f, "the message from rank 0");
    // Posted before the collectives, with a tag a collective's count takes: it must get
    // rank 0's message sent after them, not a collective's bytes.
    if (rank == 1) late_recv = pg->recv(early, 0, 1);
  }
  pg->barrier()->wait();
  Tensor t = full({4}, static_cast<float>(rank + 1));
  pg->allreduce(t)->wait();
  REQUIRE_RANK(rank, t.data<float>()[0] == 6.f && t.data<float>()[3] == 6.f,
               detail::concat("allreduce gave ", t.data<float>()[0]));
  Tensor b = full({7}, rank == 2 ? 42.f : -1.f);
  pg->broadcast(b, 2)->wait();
  REQUIRE_RANK(rank, b.data<float>()[6] == 42.f, detail::concat("broadcast gave ", b.data<float>()[6]));
  if (rank == 0) pg->send(full({3}, 5.f), 1, 1)->wait();
  if (late_recv) {
    late_recv->wait();
    REQUIRE_RANK(rank, early.data<float>()[0] == 5.f && early.data<float>()[2] == 5.f,
                 detail::concat("the receive with tag 1 got ", early.data<float>()[0]));
  }
  pg->barrier()->wait();  // nobody leaves while another still waits for it
  return 0;
}

}  // namespace

TEST_CASE("collectives after an uneven number of sends and receives: gloo, shm, hierarchical") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  for (const std::string backend : {"gloo", "shm", "hierarchical"}) {
    CAPTURE(backend);
    const auto results =
        run_processes(3, [&](int rank) { return uneven_p2p_then_collectives(backend, rank, port); },
                      std::chrono::seconds(40));
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(results[r].exit_code == 0);
    }
  }
}
