// Every collective and reduce op on every backend, world sizes 1-4, ranks as threads over
// an in-memory store (gloo connects them over loopback TCP).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

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

// The backend under test: gloo, or PHALANX_TEST_BACKEND; ctest runs this case again for each
// allreduce algorithm of the Gloo plugin and on the example backend (tests/CMakeLists.txt).
TEST_CASE("conformance of the backend under test: world sizes 1 to 4, threads") {
  const std::string backend = conformance_backend();
  CAPTURE(backend);
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    auto store = std::make_shared<MemoryStore>();
    CHECK_NOTHROW(run_threads(world, [&](int rank) {
      auto pg = make_thread_group(backend, rank, world, std::make_shared<PrefixStore>("w", store));
      REQUIRE_RANK(rank, pg->backend_name() == backend, pg->backend_name());
      REQUIRE_RANK(rank, pg->rank() == rank && pg->size() == world, "group identity");
      run_conformance(*pg);
    }));
  }
}

namespace {

// Which allreduce algorithm ran, told by its result: 2^24 + 1 rounds to 2^24 in float32, so a
// sum of 2^24, 1 and -2^24 is 0 or 1 depending on which two are added first, and each of
// Gloo's algorithms adds the ranks' contributions in an order of its own (gloo/allreduce.cc,
// allreduce_halving_doubling.h, allreduce_ring_chunked.h; measured to match on 3 and 4 ranks):
//  - rank order, ((x0 + x1) + x2) + x3: halving-doubling (alone or on the sync mesh: auto) and
//    ring_chunked (the 4th rank adds 0 here, so halving-doubling's (x0 + x1) + (x2 + x3) is it too);
//  - ring (gloo::allreduce): chunk j of W starts at rank j - 1 and travels down the ring to rank j;
//  - bcube: on 3 ranks the owner of chunk j adds the two others in rank order; on 4 it is
//    halving-doubling.
// Halving-doubling and ring_chunked cannot be told apart this way; the others can.
enum class SumOrder { RankOrder, Ring, Bcube };

const char* order_name(SumOrder o) {
  return o == SumOrder::Ring ? "ring" : o == SumOrder::Bcube ? "bcube" : "rank (halving-doubling, ring_chunked)";
}

/// The order the Gloo plugin's settings select for a message of `bytes` (docs/algorithms.md).
SumOrder selected_order(std::size_t bytes) {
  const char* algo = std::getenv("PHALANX_GLOO_ALLREDUCE");
  const std::string a = algo ? algo : "";
  if (a == "ring") return SumOrder::Ring;
  if (a == "bcube") return SumOrder::Bcube;
  if (a == "ring_chunked" || a == "halving_doubling") return SumOrder::RankOrder;
  // auto: halving-doubling on the sync mesh up to PHALANX_GLOO_SYNC_MAX_BYTES, else the ring
  const char* max = std::getenv("PHALANX_GLOO_SYNC_MAX_BYTES");
  return max && *max && std::stoull(max) < bytes ? SumOrder::Ring : SumOrder::RankOrder;
}

/// The ranks in the order `o` adds them for element i of n (n a multiple of 2 W).
std::vector<int> sum_order(SumOrder o, int W, std::int64_t i, std::int64_t n) {
  const int chunk = static_cast<int>(i / (n / W));
  std::vector<int> seq;
  if (o == SumOrder::Ring) {
    for (int k = 1; k <= W; ++k) seq.push_back(((chunk - k) % W + W) % W);
  } else if (o == SumOrder::Bcube && W == 3) {
    seq.push_back(chunk);
    for (int r = 0; r < W; ++r)
      if (r != chunk) seq.push_back(r);
  } else {
    for (int r = 0; r < W; ++r) seq.push_back(r);
  }
  return seq;
}

}  // namespace

// Part of the conformance cases that ctest runs per algorithm: the algorithm that the
// environment names is the one that ran (a plugin that ignored PHALANX_GLOO_ALLREDUCE, or fell
// back to another algorithm, fails here).
TEST_CASE("conformance of the backend under test: allreduce adds in the order of the algorithm selected") {
  if (conformance_backend() != "gloo") {
    MESSAGE("the summation order is checked for gloo only");
    return;
  }
  const std::int64_t n = 48;
  const SumOrder order = selected_order(n * sizeof(float));
  CAPTURE(order_name(order));
  static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const float vals[3] = {16777216.f, 1.f, -16777216.f};
  // element i: rank perms[i % 6][k] holds vals[k]; a 4th rank holds 0
  auto value = [&](int rank, std::int64_t i) {
    for (int k = 0; k < 3; ++k)
      if (perms[i % 6][k] == rank) return vals[k];
    return 0.f;
  };
  for (int W : {3, 4}) {
    CAPTURE(W);
    auto store = std::make_shared<MemoryStore>();
    CHECK_NOTHROW(run_threads(W, [&](int rank) {
      auto pg = make_thread_group("gloo", rank, W, std::make_shared<PrefixStore>("order", store));
      Tensor t = zeros({n});
      for (std::int64_t i = 0; i < n; ++i) t.data<float>()[i] = value(rank, i);
      pg->allreduce(t)->wait();
      for (std::int64_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r : sum_order(order, W, i, n)) want += value(r, i);
        const float got = t.data<float>()[i];
        REQUIRE_RANK(rank, got == want,
                     detail::concat("element ", i, " is ", got, "; the ", order_name(order), " order gives ", want));
      }
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

TEST_CASE("Bool tensors (masks) are broadcast and gathered byte for byte, never reduced") {
  auto store = std::make_shared<MemoryStore>();
  CHECK_NOTHROW(run_threads(2, [&](int rank) {
    auto pg = make_thread_group("gloo", rank, 2, std::make_shared<PrefixStore>("bool", store));
    Tensor m = rank == 0 ? tril(ones({3, 3}, DType::Bool)) : zeros({3, 3}, DType::Bool);
    pg->broadcast(m, 0)->wait();
    const bool same = m.to_vector<bool>() == tril(ones({3, 3}, DType::Bool)).to_vector<bool>();
    REQUIRE_RANK(rank, same, "broadcast");
    std::vector<Tensor> all{zeros({2}, DType::Bool), zeros({2}, DType::Bool)};
    pg->allgather(all, full({2}, rank, DType::Bool))->wait();
    const bool gathered = all[0].to_vector<bool>() == std::vector<bool>(2, false) &&
                          all[1].to_vector<bool>() == std::vector<bool>(2, true);
    REQUIRE_RANK(rank, gathered, "allgather");
  }));
  BackendConfig cfg;
  auto pg = create_process_group("single", cfg);
  CHECK_THROWS_WITH_AS(pg->allreduce(ones({2}, DType::Bool)),
                       "allreduce: bool tensors cannot be reduced; convert them to int64 or float32", TypeError);
  CHECK_THROWS_AS(pg->reduce(ones({2}, DType::Bool), 0), TypeError);
  CHECK_THROWS_AS(pg->reduce_scatter(ones({2}, DType::Bool), {ones({2}, DType::Bool)}), TypeError);
}
