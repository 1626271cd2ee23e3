// The MPI plugin's conformance worker, run by ctest under `mpirun --oversubscribe -np N`
// (tests/backends/mpi_tests.cmake): init_process_group() on backend mpi (auto under mpirun,
// or PHALANX_BACKEND=mpi), the conformance suite, 16-bit float sums, tags, tensors of the
// sim test accelerator staged through host memory (byte for byte the CPU results), and a
// second group after the first is destroyed (MPI stays initialised). Exit 0 and one line
// per rank on success; a failure prints "FAILED" and exits 1 (the plugin then aborts the job).
// `--fail-rank R`: rank R exits with status 3 at once while the others wait in a barrier:
// the job must end (MPI_Abort from the plugin's exit handler), not hang.
// `--threads` (2 ranks): the thread rule. By default (MPI_THREAD_SINGLE) an operation, a
// wait or is_completed() from a thread other than the group's creator is a one-line
// ConfigError and the group still works; with PHALANX_MPI_THREADS=serialized the same calls
// work from any thread. Either way: sends and receives completed by is_completed() polls,
// unwaited requests at the group's destruction (their Works fail, the next group receives
// only its own messages), and a receive that times out.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "phalanx/backends/plugin_registry.hpp"
#include "support/conformance.hpp"
#include "support/staging_check.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

void check_half_sums(ProcessGroup& pg) {
  const int r = pg.rank(), W = pg.size();
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tensor t = to_dtype(full({1000}, static_cast<float>(r + 1)), dt);
    pg.allreduce(t, ReduceOp::Sum)->wait();
    const Tensor f = to_dtype(t, DType::Float32);
    for (std::int64_t i = 0; i < 1000; ++i)
      REQUIRE_RANK(r, f.data<float>()[i] == static_cast<float>(W * (W + 1) / 2),
                   detail::concat(dtype_name(dt), " sum element ", i, " is ", f.data<float>()[i]));
  }
  // avg divides the sum once, for reduce_scatter and reduce as well
  std::vector<Tensor> ins;
  for (int j = 0; j < W; ++j) ins.push_back(full({5}, static_cast<float>((r + 1) * (j + 1))));
  Tensor rs = zeros({5});
  pg.reduce_scatter(rs, ins, ReduceOp::Avg)->wait();
  expect_values(r, "reduce_scatter avg", rs, [&](std::int64_t) { return (r + 1) * (W + 1) / 2.0; });
  Tensor red = full({5}, static_cast<float>(r + 1));
  pg.reduce(red, 0, ReduceOp::Avg)->wait();
  expect_values(r, "reduce avg", red, [&](std::int64_t) { return r == 0 ? (W + 1) / 2.0 : r + 1.0; });
  // 16-bit floats take sum only, in reduce and reduce_scatter as in allreduce (the MPI user
  // op sums: a max would silently be a sum).
  const auto refused = [&](const char* what, const std::function<void()>& call) {
    try {
      call();
    } catch (const TypeError& e) {
      REQUIRE_RANK(r, std::string(e.what()).find("tensors support sum only") != std::string::npos, e.what());
      return;
    }
    REQUIRE_RANK(r, false, detail::concat(what, " was accepted"));
  };
  refused("reduce of float16 with max", [&] { pg.reduce(to_dtype(full({4}, 1.f), DType::Float16), 0, ReduceOp::Max); });
  refused("reduce_scatter of bfloat16 with min", [&] {
    std::vector<Tensor> in;
    for (int j = 0; j < W; ++j) in.push_back(to_dtype(full({4}, 1.f), DType::BFloat16));
    pg.reduce_scatter(to_dtype(zeros({4}), DType::BFloat16), in, ReduceOp::Min);
  });
}

void check_tags(ProcessGroup& pg) {
  const int r = pg.rank(), W = pg.size();
  if (W < 2 || r > 1) return;
  // Rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first: matched by tag, not order.
  if (r == 0) {
    auto a = pg.send(full({3}, 1.f), 1, 1);
    auto b = pg.send(full({3}, 2.f), 1, 2);
    a->wait();
    b->wait();
  } else {
    Tensor two = zeros({3}), one = zeros({3});
    auto b = pg.recv(two, 0, 2);
    auto a = pg.recv(one, 0, 1);
    b->wait();
    a->wait();
    expect_values(r, "recv tag 1", one, [](std::int64_t) { return 1.0; });
    expect_values(r, "recv tag 2", two, [](std::int64_t) { return 2.0; });
  }
}

void require_thread_error(int r, const std::string& what, const std::string& error) {
  REQUIRE_RANK(r, error.find("called from a thread other than the one that created the process group") !=
                          std::string::npos && error.find("PHALANX_MPI_THREADS=serialized") != std::string::npos &&
                      error.find('\n') == std::string::npos,
               what + ": got '" + error + "'");
}

int run_thread_checks(int rank) {
  const char* env = std::getenv("PHALANX_MPI_THREADS");
  const char* async = std::getenv("PHALANX_MPI_ASYNC");
  const bool single = !(env && std::string(env) == "serialized") && !(async && std::string(async) == "1");
  auto pg = parallel::init_process_group();
  const int r = pg->rank(), W = pg->size(), peer = 1 - r;
  REQUIRE_RANK(r, W == 2, "--threads runs on 2 ranks");
  // 1. A collective from another thread.
  Tensor t = ones({4});
  const std::string e1 = on_other_thread([&] { pg->allreduce(t)->wait(); });
  if (single) {
    require_thread_error(r, "allreduce from another thread", e1);
    expect_values(r, "the refused allreduce left its tensor", t, [](std::int64_t) { return 1.0; });
  } else {
    REQUIRE_RANK(r, e1.empty(), "allreduce from another thread at serialized: " + e1);
  }
  pg->allreduce(t)->wait();  // the group is not broken by a refused call
  expect_values(r, "allreduce after", t, [&](std::int64_t) { return single ? W : W * W; });
  // 2. A ring posted here, waited on from another thread (single: refused, still pending).
  Tensor out = full({1000}, static_cast<float>(r + 1)), in = zeros({1000});
  auto s = pg->send(out, peer, 3);
  auto v = pg->recv(in, peer, 3);
  const std::string e2 = on_other_thread([&] { v->wait(); });
  const std::string e3 = on_other_thread([&] { (void)s->is_completed(); });
  if (single) {
    require_thread_error(r, "wait from another thread", e2);
    require_thread_error(r, "is_completed from another thread", e3);
  } else {
    REQUIRE_RANK(r, e2.empty() && e3.empty(), "wait from another thread at serialized: " + e2 + e3);
  }
  s->wait();
  v->wait();
  expect_values(r, "recv", in, [&](std::int64_t) { return peer + 1.0; });
  // 3. Completed by is_completed() polls alone (no wait), 1 MiB (MPI's rendezvous protocol).
  Tensor big = full({1 << 18}, static_cast<float>(r + 10)), got = zeros({1 << 18});
  auto bs = pg->send(big, peer, 4);
  auto bv = pg->recv(got, peer, 4);
  while (!bs->is_completed() || !bv->is_completed()) std::this_thread::yield();
  bs->wait();
  bv->wait();
  expect_values(r, "polled recv", got, [&](std::int64_t) { return peer + 10.0; });
  // Sends whose Works are dropped unwaited (fire and forget) still arrive, in order.
  if (r == 0) {
    for (int k = 0; k < 50; ++k) pg->send(full({16}, static_cast<float>(k)), 1, 6);
  } else {
    for (int k = 0; k < 50; ++k) {
      Tensor x = zeros({16});
      pg->recv(x, 0, 6)->wait();
      expect_values(r, "unwaited send", x, [&](std::int64_t) { return k; });
    }
  }
  pg->barrier()->wait();
  // 4. At serialized, a whole ring posted and waited on from another thread.
  if (!single) {
    Tensor x = zeros({8});
    const std::string e4 = on_other_thread([&] {
      auto a = pg->send(full({8}, 7.f), peer, 5);
      auto b = pg->recv(x, peer, 5);
      a->wait();
      b->wait();
    });
    REQUIRE_RANK(r, e4.empty(), "send/recv from another thread at serialized: " + e4);
    expect_values(r, "recv on another thread", x, [](std::int64_t) { return 7.0; });
  }
  // 5. Requests nobody waits for when the group is destroyed: a receive never matched (tag
  // 9), and sends never received (tag 8: 4 bytes, sent eagerly; tag 7: 1 MiB, waiting for
  // its receiver). Their Works fail; the next group receives only its own messages.
  WorkPtr stale_recv, stale_small, stale_big;
  if (r == 0) {
    stale_recv = pg->recv(zeros({4}), 1, 9);
  } else {
    stale_small = pg->send(full({1}, -1.f), 0, 8);
    stale_big = pg->send(full({1 << 18}, -1.f), 0, 7);
  }
  pg->barrier()->wait();
  pg.reset();
  parallel::destroy_process_group();
  for (const WorkPtr& w : {stale_recv, stale_small, stale_big}) {
    if (!w) continue;
    bool failed = false;
    try {
      w->wait();  // a small send may have completed before the group went
    } catch (const CommError& e) {
      failed = std::string(e.what()).find("destroyed") != std::string::npos;
      REQUIRE_RANK(r, failed, std::string("unwaited ") + w->op() + ": " + e.what());
    }
    REQUIRE_RANK(r, failed || w->op() == "send", std::string("unwaited ") + w->op() + " completed");
  }
  auto again = parallel::init_process_group();
  Tensor m = zeros({1}), big2 = zeros({1 << 18});
  if (r == 1) {
    again->send(full({1}, 5.f), 0, 8)->wait();
    again->send(full({1 << 18}, 6.f), 0, 7)->wait();
  } else {
    again->recv(m, 1, 8)->wait();
    again->recv(big2, 1, 7)->wait();
    expect_values(r, "the next group's message (not the stale one)", m, [](std::int64_t) { return 5.0; });
    expect_values(r, "the next group's 1 MiB message", big2, [](std::int64_t) { return 6.0; });
  }
  again->barrier()->wait();
  again.reset();
  parallel::destroy_process_group();
  // 6. A receive nobody sends: TimeoutError at the group's timeout (1 s), not a hang.
  parallel::InitOptions opt;
  opt.timeout = std::chrono::milliseconds(1000);
  auto shortlived = parallel::init_process_group(opt);
  shortlived->barrier()->wait();
  if (r == 0) {
    const auto start = std::chrono::steady_clock::now();
    std::string e6;
    try {
      shortlived->recv(zeros({4}), 1, 11)->wait();
    } catch (const TimeoutError& e) {
      e6 = e.what();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE_RANK(r, e6.find("timed out after 1 s") != std::string::npos && secs < 10,
                 detail::concat("recv with no sender: '", e6, "' after ", secs, " s"));
  }
  shortlived.reset();
  parallel::destroy_process_group();
  // 8. Two live groups on one thread: a send of group B whose Work is the one this thread
  // used for group A's waited send (the thread's spare) is not failed when A is destroyed
  // or aborted; A's end concerns A's operations only.
  for (const bool abort_a : {false, true}) {
    BackendConfig cfg;
    cfg.rank = r;
    cfg.size = W;
    cfg.timeout = std::chrono::milliseconds(5000);
    ProcessGroupPtr a = create_process_group("mpi", cfg), b = create_process_group("mpi", cfg);
    std::string e8;
    if (r == 0) {
      a->send(full({4}, 1.f), peer, 1)->wait();
      auto w = b->send(full({1 << 18}, 2.f), peer, 2);  // 1 MiB: pending until rank 1 receives it
      if (abort_a)
        a->abort(nullptr);
      else
        a.reset();
      b->barrier()->wait();
      try {
        w->wait();
      } catch (const std::exception& e) {
        e8 = e.what();
      }
    } else {
      Tensor y = zeros({4}), z = zeros({1 << 18});
      a->recv(y, peer, 1)->wait();
      a.reset();
      b->barrier()->wait();
      b->recv(z, peer, 2)->wait();
      expect_values(r, "group B's message", z, [](std::int64_t) { return 2.0; });
    }
    b->barrier()->wait();
    REQUIRE_RANK(r, e8.empty(), std::string("group B's send after group A was ") + (abort_a ? "aborted" : "destroyed") +
                                    ": " + e8);
  }
  // 9. An abort from another thread ends at once a receive nobody sends: its Work is complete
  // with the abort's error, seen from any thread (at single, no poll may run there).
  {
    BackendConfig cfg;
    cfg.rank = r;
    cfg.size = W;
    cfg.timeout = std::chrono::milliseconds(5000);
    ProcessGroupPtr g = create_process_group("mpi", cfg);
    auto w = g->recv(zeros({4}), peer, 13);
    std::thread([&] { g->abort(std::make_exception_ptr(CommError("the test aborted group 9"))); }).join();
    const std::string e9 = on_other_thread([&] {
      if (!w->is_completed()) throw CommError("still pending after the abort");
      w->wait();
    });
    REQUIRE_RANK(r, e9.find("the test aborted group 9") != std::string::npos,
                 "a receive left to its waiter, after an abort from another thread: '" + e9 + "'");
    g.reset();
  }
  // 7. A receive whose message is too long (MPI_ERR_TRUNCATE), completed before its wait by
  // another post's test of the open requests: its Work fails with MPI's error, it does not
  // report success over a partly written tensor. Last: the failure breaks the group.
  auto trunc = parallel::init_process_group(opt);
  if (r == 0) {
    Tensor small = zeros({10}), y = zeros({4});
    auto v = trunc->recv(small, 1, 12);
    trunc->barrier()->wait();
    try {
      trunc->recv(y, 1, 13)->wait();  // its post tests tag 12's request (MPI_THREAD_SINGLE)
    } catch (const CommError&) {
    }  // at serialized the completion thread may have broken the group first
    std::string e7;
    try {
      v->wait();
    } catch (const CommError& e) {
      e7 = e.what();
    }
    REQUIRE_RANK(r, e7.find("TRUNCATE") != std::string::npos,
                 "a receive of 10 floats given 1000: '" + e7 + "' (expected MPI_ERR_TRUNCATE)");
  } else {
    trunc->send(full({1000}, 1.f), 0, 12)->wait();
    trunc->barrier()->wait();
    trunc->send(full({4}, 2.f), 0, 13);  // eager; not waited (rank 0's group may be broken)
  }
  trunc.reset();
  parallel::destroy_process_group();
  std::printf("mpi threads (%s): passed on rank %d of %d\n", single ? "single" : "serialized", rank < 0 ? r : rank, W);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  try {
    if (argc == 2 && std::strcmp(argv[1], "--threads") == 0) return run_thread_checks(rank);
    auto pg = parallel::init_process_group();
    rank = pg->rank();
    if (argc == 3 && std::strcmp(argv[1], "--fail-rank") == 0) {
      if (rank == std::atoi(argv[2])) {
        std::fprintf(stderr, "rank %d fails on purpose (exit status 3)\n", rank);
        return 3;
      }
      pg->barrier()->wait();  // never completes: the job is ended first
      std::printf("rank %d: the barrier completed without the failed rank\n", rank);
      return 1;
    }
    REQUIRE_RANK(rank, pg->backend_name() == "mpi", "backend " + pg->backend_name());
    const int W = pg->size();
    run_conformance(*pg, {1, 1000, 70000});
    check_half_sums(*pg);
    check_tags(*pg);
    check_sim_staging(*pg, {1, 70000}, DType::BFloat16, W - 1);
    parallel::destroy_process_group();
    // A second group in the same process: MPI was initialised once and stays so.
    auto again = parallel::init_process_group();
    Tensor t = ones({4});
    again->allreduce(t)->wait();
    expect_values(rank, "allreduce on a second group", t, [&](std::int64_t) { return W; });
    again->barrier()->wait();
    parallel::destroy_process_group();
    std::printf("mpi conformance: passed on rank %d of %d\n", rank, W);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi conformance: FAILED on rank %d: %s\n", rank, e.what());
    return 1;
  }
}
