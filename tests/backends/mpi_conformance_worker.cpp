// The MPI plugin's conformance worker, run by ctest under `mpirun --oversubscribe -np N`
// (tests/backends/mpi_tests.cmake): init_process_group() on backend mpi (auto under mpirun,
// or PHALANX_BACKEND=mpi), the conformance suite, 16-bit float sums, tags, tensors of the
// sim test accelerator staged through host memory (byte for byte the CPU results), and a
// second group after the first is destroyed (MPI stays initialised). Exit 0 and one line
// per rank on success; a failure prints "FAILED" and exits 1 (the plugin then aborts the job).
// `--fail-rank R`: rank R exits with status 3 at once while the others wait in a barrier:
// the job must end (MPI_Abort from the plugin's exit handler), not hang.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

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

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  try {
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
