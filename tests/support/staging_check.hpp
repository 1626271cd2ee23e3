#pragma once
// A backend that stages device tensors through host memory must give the same bytes as on the
// CPU: every operation runs on CPU tensors, then on sim tensors (the sim test accelerator runs
// the CPU kernels, so any difference is the backend mishandling device memory). Used by
// tests/parallel/test_ddp_devices.cpp (Gloo) and tests/backends/mpi_conformance_worker.cpp (MPI).
#include <cstdint>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "support/multirank.hpp"

namespace phalanx::test {

/// Every collective and send/recv on sim tensors of each size in `sizes` equals it on CPU
/// tensors, byte for byte; `half` is the 16-bit float type allreduced; reduce goes to `reduce_root`.
inline void check_sim_staging(ProcessGroup& pg, const std::vector<std::int64_t>& sizes, DType half,
                              int reduce_root) {
  const int rank = pg.rank(), W = pg.size();
  const int next = (rank + 1) % W, prev = (rank + W - 1) % W;
  for (std::int64_t n : sizes) {
    Generator g(static_cast<std::uint64_t>(rank * 1000 + n));
    const Tensor x = randn({n}, &g), xi = randint(1000, {n}, &g);
    std::vector<std::string> got[2];  // each result's bytes, CPU run then sim run
    for (int d = 0; d < 2; ++d) {
      const Device dev = d == 0 ? Device::cpu() : Device::sim();
      const auto put = [&](const Tensor& t) { return t.clone().to(dev); };
      const auto keep = [&](const Tensor& t) {
        REQUIRE_RANK(rank, t.device() == dev, "the result stays on its device");
        const Tensor h = t.to(Device::cpu());
        got[d].emplace_back(static_cast<const char*>(h.raw_data()), h.nbytes());
      };
      const auto many = [&](const Tensor& like) {
        std::vector<Tensor> v;
        for (int r = 0; r < W; ++r) v.push_back(Tensor::empty(like.shape(), like.dtype(), dev));
        return v;
      };
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        Tensor t = put(x);
        pg.allreduce(t, op)->wait();
        keep(t);
      }
      Tensor ti = put(xi), th = to_dtype(put(x), half);
      pg.allreduce(ti)->wait();
      pg.allreduce(th)->wait();
      keep(ti);
      keep(th);
      Tensor b = put(x);
      pg.broadcast(b, W - 1)->wait();
      keep(b);
      auto gathered = many(x);
      pg.allgather(gathered, put(x))->wait();
      for (auto& t : gathered) keep(t);
      Tensor rs = Tensor::empty({n}, DType::Float32, dev);
      std::vector<Tensor> rs_in;
      for (int r = 0; r < W; ++r) rs_in.push_back(put(x * static_cast<float>(r + 1)));
      pg.reduce_scatter(rs, rs_in)->wait();
      keep(rs);
      Tensor red = put(x);
      pg.reduce(red, reduce_root)->wait();
      keep(red);  // elsewhere than at the root: left as it was
      auto at_root = many(x);
      pg.gather(at_root, put(x), 0)->wait();
      if (rank == 0)
        for (auto& t : at_root) keep(t);
      Tensor sc = Tensor::empty({n}, DType::Float32, dev);
      std::vector<Tensor> sc_in;
      for (int r = 0; r < W; ++r) sc_in.push_back(put(x + static_cast<float>(r)));
      pg.scatter(sc, sc_in, W - 1)->wait();
      keep(sc);
      if (W > 1) {
        Tensor sent = put(x), received = Tensor::empty({n}, DType::Float32, dev);
        auto s = pg.send(sent, next, 3);
        auto v = pg.recv(received, prev, 3);
        s->wait();
        v->wait();
        keep(received);
      }
    }
    REQUIRE_RANK(rank, got[0].size() == got[1].size(), "as many results");
    for (std::size_t i = 0; i < got[0].size(); ++i)
      REQUIRE_RANK(rank, got[0][i] == got[1][i], detail::concat("n = ", n, ": result ", i, " differs on sim"));
  }
}

}  // namespace phalanx::test
