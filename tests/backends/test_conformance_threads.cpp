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

TEST_CASE("16-bit floats: gloo's reduce sums them as floats; reduce and reduce_scatter refuse other ops") {
  auto store = std::make_shared<MemoryStore>();
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    CAPTURE(dtype_name(dt));
    CHECK_NOTHROW(run_threads(3, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, 3, std::make_shared<PrefixStore>(dtype_name(dt), store));
      Tensor t = to_dtype(full({5}, 1.5 + rank), dt);
      pg->reduce(t, 1)->wait();
      const float got = to_dtype(t, DType::Float32).data<float>()[4];
      REQUIRE_RANK(rank, got == (rank == 1 ? 7.5f : 1.5f + rank), got);
    }));
  }
  BackendConfig cfg;
  auto pg = create_process_group("single", cfg);
  CHECK_THROWS_WITH_AS(pg->reduce(to_dtype(zeros({2}), DType::Float16), 0, ReduceOp::Max),
                       doctest::Contains("reduce: float16 tensors support sum only"), TypeError);
  CHECK_THROWS_WITH_AS(pg->reduce_scatter(to_dtype(zeros({2}), DType::BFloat16), {to_dtype(zeros({2}), DType::BFloat16)},
                                          ReduceOp::Min),
                       doctest::Contains("reduce_scatter: bfloat16 tensors support sum only"), TypeError);
}
