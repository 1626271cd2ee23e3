// Every collective and reduce op on every backend, world sizes 1-4, ranks as threads over
// an in-memory store (gloo connects them over loopback TCP).
#include <doctest/doctest.h>

#include "support/conformance.hpp"

using namespace phalanx;
using namespace phalanx::test;

TEST_CASE("world of one (built-in 'single' backend)") {
  BackendConfig cfg;
  auto pg = create_process_group("single", cfg);
  CHECK(pg->backend_name() == "single");
  run_conformance(*pg);
  CHECK_THROWS_AS(pg->send(zeros({1}), 0), ValueError);
}

TEST_CASE("gloo, world sizes 1 to 4, threads") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    auto store = std::make_shared<MemoryStore>();
    CHECK_NOTHROW(run_threads(world, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, world, std::make_shared<PrefixStore>("w", store));
      REQUIRE_RANK(rank, pg->rank() == rank && pg->size() == world, "group identity");
      run_conformance(*pg);
    }));
  }
}

TEST_CASE("argument errors are raised at the call, naming the op") {
  BackendConfig cfg;
  auto pg = create_process_group("single", cfg);
  CHECK_THROWS_WITH_AS(pg->broadcast(zeros({2}), 3), doctest::Contains("broadcast: root 3 is outside [0, 1)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(pg->allgather({zeros({2}), zeros({2})}, zeros({2})),
                       doctest::Contains("expected 1 output tensors"), ValueError);
  CHECK_THROWS_AS(pg->allgather({zeros({3})}, zeros({2})), ShapeError);
  CHECK_THROWS_AS(pg->allreduce(Tensor()), ValueError);
  CHECK_THROWS_AS(pg->allreduce(zeros({2}, DType::Int64), ReduceOp::Avg), TypeError);
}
