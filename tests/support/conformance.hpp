#pragma once
// One conformance suite for every backend and world size: each collective and reduce op
// against closed-form values. Throws on the first mismatch, naming rank, op and element.
#include <cmath>
#include <cstdlib>
#include <string>

#include "support/multirank.hpp"

namespace phalanx::test {

/// The backend the conformance suites run on: PHALANX_TEST_BACKEND (ctest sets it for the
/// example out-of-tree backend, storecomm), else gloo. The Gloo plugin's allreduce algorithm
/// comes from its own variables (PHALANX_GLOO_ALLREDUCE, ...; tests/CMakeLists.txt).
inline std::string conformance_backend() {
  const char* b = std::getenv("PHALANX_TEST_BACKEND");
  return b && *b ? b : "gloo";
}

inline void expect_values(int rank, const char* what, const Tensor& t, const std::function<double(std::int64_t)>& f) {
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const double got = t.dtype() == DType::Float32 ? t.data<float>()[i]
                                                   : static_cast<double>(t.data<std::int64_t>()[i]);
    const double want = f(i);
    if (std::abs(got - want) > 1e-5 * std::max(1.0, std::abs(want)))
      throw std::runtime_error(detail::concat("rank ", rank, ": ", what, " element ", i, " is ", got,
                                              ", expected ", want));
  }
}

inline Tensor ramp(std::int64_t n, double scale, DType dtype = DType::Float32) {
  Tensor t = Tensor::empty({n}, dtype);
  for (std::int64_t i = 0; i < n; ++i) {
    if (dtype == DType::Float32)
      t.data<float>()[i] = static_cast<float>(scale * static_cast<double>((i % 7) + 1));
    else
      t.data<std::int64_t>()[i] = static_cast<std::int64_t>(scale) * ((i % 7) + 1);
  }
  return t;
}

inline void run_conformance(ProcessGroup& pg, const std::vector<std::int64_t>& sizes = {1, 1000, 70000}) {
  const int r = pg.rank(), W = pg.size();
  double fact = 1;
  for (int k = 1; k <= W; ++k) fact *= k;
  for (std::int64_t n : sizes) {
    auto base = [](std::int64_t i) { return static_cast<double>((i % 7) + 1); };
    // allreduce, every op, float32
    const struct {
      ReduceOp op;
      const char* name;
      std::function<double(std::int64_t)> want;
    } cases[] = {
        {ReduceOp::Sum, "allreduce sum", [&](std::int64_t i) { return base(i) * W * (W + 1) / 2; }},
        {ReduceOp::Avg, "allreduce avg", [&](std::int64_t i) { return base(i) * (W + 1) / 2.0; }},
        {ReduceOp::Min, "allreduce min", [&](std::int64_t i) { return base(i); }},
        {ReduceOp::Max, "allreduce max", [&](std::int64_t i) { return base(i) * W; }},
        {ReduceOp::Product, "allreduce product", [&](std::int64_t i) { return std::pow(base(i), W) * fact; }},
    };
    for (const auto& c : cases) {
      Tensor t = ramp(n, r + 1);
      pg.allreduce(t, c.op)->wait();
      expect_values(r, c.name, t, c.want);
    }
    // int64 sum and max
    Tensor ti = ramp(n, r + 1, DType::Int64);
    pg.allreduce(ti, ReduceOp::Sum)->wait();
    expect_values(r, "allreduce int64 sum", ti, [&](std::int64_t i) { return base(i) * W * (W + 1) / 2; });
    // broadcast from the last rank
    Tensor b = ramp(n, r + 1);
    pg.broadcast(b, W - 1)->wait();
    expect_values(r, "broadcast", b, [&](std::int64_t i) { return base(i) * W; });
    // allgather
    std::vector<Tensor> outs;
    for (int k = 0; k < W; ++k) outs.push_back(zeros({n}));
    pg.allgather(outs, ramp(n, r + 1))->wait();
    for (int k = 0; k < W; ++k) expect_values(r, "allgather", outs[k], [&](std::int64_t i) { return base(i) * (k + 1); });
    // reduce_scatter: inputs[j] = (r+1) * (j+1) * base
    std::vector<Tensor> ins;
    for (int j = 0; j < W; ++j) ins.push_back(ramp(n, (r + 1) * (j + 1)));
    Tensor rs = zeros({n});
    pg.reduce_scatter(rs, ins, ReduceOp::Sum)->wait();
    expect_values(r, "reduce_scatter", rs, [&](std::int64_t i) { return base(i) * (r + 1) * W * (W + 1) / 2; });
    // reduce to rank 0 (others unchanged)
    Tensor red = ramp(n, r + 1);
    pg.reduce(red, 0, ReduceOp::Max)->wait();
    expect_values(r, "reduce", red, [&](std::int64_t i) { return base(i) * (r == 0 ? W : r + 1); });
    // gather to rank W-1
    std::vector<Tensor> gouts;
    if (r == W - 1)
      for (int k = 0; k < W; ++k) gouts.push_back(zeros({n}));
    pg.gather(gouts, ramp(n, r + 1), W - 1)->wait();
    if (r == W - 1)
      for (int k = 0; k < W; ++k) expect_values(r, "gather", gouts[k], [&](std::int64_t i) { return base(i) * (k + 1); });
    // scatter from rank 0: rank k gets (k + 10) * base
    std::vector<Tensor> sins;
    if (r == 0)
      for (int k = 0; k < W; ++k) sins.push_back(ramp(n, k + 10));
    Tensor so = zeros({n});
    pg.scatter(so, sins, 0)->wait();
    expect_values(r, "scatter", so, [&](std::int64_t i) { return base(i) * (r + 10); });
    pg.barrier()->wait();
    // point to point around a ring
    if (W > 1) {
      Tensor out = ramp(n, r + 1), in = zeros({n});
      auto s = pg.send(out, (r + 1) % W, 7);
      auto v = pg.recv(in, (r + W - 1) % W, 7);
      if (r % 2 == 0) {
        s->wait();
        v->wait();
      } else {
        v->wait();
        s->wait();
      }
      const int from = (r + W - 1) % W;
      expect_values(r, "send/recv", in, [&](std::int64_t i) { return base(i) * (from + 1); });
    }
  }
  // asynchronous issue: several operations in flight complete in order
  std::vector<Tensor> ts;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(ramp(100, r + 1 + k));
    works.push_back(pg.allreduce(ts.back(), ReduceOp::Sum));
  }
  for (int k = 0; k < 8; ++k) {
    works[k]->wait();
    if (!works[k]->is_completed()) throw std::runtime_error("work not completed after wait");
    expect_values(r, "async allreduce", ts[k], [&](std::int64_t i) {
      double s = 0;
      for (int q = 0; q < W; ++q) s += q + 1 + k;
      return static_cast<double>((i % 7) + 1) * s;
    });
  }
}

}  // namespace phalanx::test
