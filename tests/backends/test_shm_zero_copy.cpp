// shm's zero-copy buffers (ProcessGroup::symmetric_zeros, docs/shm.md "Zero-copy buffers"):
// memory every rank maps, reduced in place with no staging copies. The results equal the
// staged path's bit for bit (every dtype and op, W = 2..4, one slice or many), a part of a
// buffer reduces in place too, a rank whose tensor is elsewhere fails the signature check
// with both calls named, the memory outlives the group, nothing is left in /dev/shm, and
// PHALANX_SHM_ZERO_COPY=0 hands out ordinary memory.
#include <doctest/doctest.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mount.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "support/conformance.hpp"
#include "support/dev_shm.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

bool in_shared_memory(const Tensor& t) { return t.impl()->storage()->borrowed(); }

/// Rank q's input of n elements: distinct per rank, with a fractional part (the order of the
/// sum shows in the bits).
Tensor input_of(int q, std::int64_t n, DType dt) {
  Generator g(static_cast<std::uint64_t>(q * 31 + n));
  if (dt == DType::Int64) return ramp(n, q + 1, DType::Int64);
  return to_dtype(randn({n}, &g) * 100.f, dt);
}

}  // namespace

TEST_CASE("shm zero-copy: every dtype and op equals the staged path bit for bit, W = 2..4") {
  for (int W = 2; W <= 4; ++W) {
    CAPTURE(W);
    auto store = std::make_shared<MemoryStore>();
    run_threads(W, [&](int rank) {
      auto pg = make_thread_group("shm", rank, W, std::make_shared<PrefixStore>("zc", store));
      // 5: slices shorter than a rank count; 300000: large, every rank a long slice.
      for (std::int64_t n : {5, 300000}) {
        struct Case {
          DType dt;
          ReduceOp op;
        };
        for (const Case c : {Case{DType::Float32, ReduceOp::Sum}, Case{DType::Float32, ReduceOp::Avg},
                             Case{DType::Float32, ReduceOp::Max}, Case{DType::Float32, ReduceOp::Product},
                             Case{DType::Int64, ReduceOp::Sum}, Case{DType::Int64, ReduceOp::Min},
                             Case{DType::Float16, ReduceOp::Sum}, Case{DType::BFloat16, ReduceOp::Sum}}) {
          const std::string what = detail::concat(dtype_name(c.dt), " ", reduce_op_name(c.op), " n = ", n);
          Tensor zc = pg->symmetric_zeros(n, c.dt);
          REQUIRE_RANK(rank, in_shared_memory(zc), what + ": not in the shared segment");
          REQUIRE_RANK(rank, zc.numel() == n && zc.dtype() == c.dt, what);
          const Tensor zero = zeros({n}, c.dt);
          REQUIRE_RANK(rank, std::memcmp(zc.raw_data(), zero.raw_data(), zc.nbytes()) == 0, what + ": not zeroed");
          const Tensor x = input_of(rank, n, c.dt);
          zc.copy_(x);
          Tensor staged = x.clone();
          pg->allreduce(zc, c.op)->wait();
          pg->allreduce(staged, c.op)->wait();
          REQUIRE_RANK(rank, std::memcmp(zc.raw_data(), staged.raw_data(), zc.nbytes()) == 0,
                       what + ": the in-place result differs from the staged one");
          // Again on the same buffer (the ranks' next step): the previous results are inputs now.
          pg->allreduce(zc, c.op)->wait();
          pg->allreduce(staged, c.op)->wait();
          REQUIRE_RANK(rank, std::memcmp(zc.raw_data(), staged.raw_data(), zc.nbytes()) == 0, what + ", again");
        }
      }
      // The float32 sum in rank order 0..W-1, element by element (the closed form).
      const std::int64_t n = 100003;
      Tensor zc = pg->symmetric_zeros(n, DType::Float32);
      zc.copy_(input_of(rank, n, DType::Float32));
      pg->allreduce(zc)->wait();
      std::vector<Tensor> in;
      for (int q = 0; q < W; ++q) in.push_back(input_of(q, n, DType::Float32));
      for (std::int64_t i = 0; i < n; ++i) {
        float want = in[0].data<float>()[i];
        for (int q = 1; q < W; ++q) want += in[q].data<float>()[i];
        if (zc.data<float>()[i] != want) REQUIRE_RANK(rank, false, detail::concat("element ", i, " is not the sum"));
      }
    });
  }
}

TEST_CASE("shm zero-copy: a part of a buffer reduces in place; the buffer outlives its group") {
  const int W = 2;
  auto store = std::make_shared<MemoryStore>();
  run_threads(W, [&](int rank) {
    Tensor keep;
    {
      auto pg = make_thread_group("shm", rank, W, std::make_shared<PrefixStore>("part", store));
      Tensor zc = pg->symmetric_zeros(1000, DType::Float32);
      zc.fill_(static_cast<float>(rank + 1));
      // Elements 100..599 only: the rest of the buffer stays as it was.
      Tensor part = zc.narrow_rows(100, 600);
      REQUIRE_RANK(rank, part.is_contiguous(), "narrow of a 1-D tensor");
      pg->allreduce(part)->wait();
      for (std::int64_t i = 0; i < 1000; ++i) {
        const float want = i >= 100 && i < 600 ? 3.f : static_cast<float>(rank + 1);
        if (zc.data<float>()[i] != want) REQUIRE_RANK(rank, false, detail::concat("element ", i));
      }
      keep = zc;
      pg->barrier()->wait();
    }
    // The group is gone; the memory is still this rank's, readable and writable.
    REQUIRE_RANK(rank, keep.data<float>()[150] == 3.f, "the buffer after its group");
    keep.fill_(7.f);
    REQUIRE_RANK(rank, keep.data<float>()[999] == 7.f, "the buffer after its group");
  });
}

TEST_CASE("shm zero-copy: one rank's buffer against another's ordinary tensor fails naming both calls") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto before = shm_names();
  const auto results = run_processes(2, [&](int rank) {
    BackendConfig cfg;
    cfg.rank = rank;
    cfg.size = 2;
    cfg.store = store_client(port, "mixed");
    cfg.timeout = std::chrono::seconds(30);
    cfg.local_rank = rank;
    cfg.local_world_size = 2;
    auto pg = create_process_group("shm", cfg);
    Tensor zc = pg->symmetric_zeros(10, DType::Float32);
    // Each buffer's segment is unlinked once both ranks attached: /dev/shm holds nothing new.
    for (const auto& n : shm_names())
      if (!before.count(n)) REQUIRE_RANK(rank, false, "left in /dev/shm: " + n);
    Tensor t = rank == 0 ? zc : ones({10});
    try {
      pg->allreduce(t)->wait();
    } catch (const CommError& e) {
      const std::string m = e.what();
      REQUIRE_RANK(rank, m.find("allreduce in place(40 bytes, float32, sum, zero-copy buffer tag") != std::string::npos, m);
      REQUIRE_RANK(rank, m.find("allreduce(40 bytes, float32, sum)") != std::string::npos, m);
      return 0;
    }
    return 1;
  });
  for (std::size_t r = 0; r < results.size(); ++r) {
    CAPTURE(r);
    CHECK(results[r].exit_code == 0);
  }
}

TEST_CASE("shm zero-copy: PHALANX_SHM_ZERO_COPY=0, one rank, another device: ordinary memory") {
  {
    ::setenv("PHALANX_SHM_ZERO_COPY", "0", 1);
    auto store = std::make_shared<MemoryStore>();
    run_threads(2, [&](int rank) {
      auto pg = make_thread_group("shm", rank, 2, std::make_shared<PrefixStore>("off", store));
      Tensor t = pg->symmetric_zeros(64, DType::Float32);
      REQUIRE_RANK(rank, !in_shared_memory(t), "PHALANX_SHM_ZERO_COPY=0 still gave shared memory");
      t.fill_(1.f);
      pg->allreduce(t)->wait();
      REQUIRE_RANK(rank, t.data<float>()[63] == 2.f, "ordinary memory reduces as before");
    });
    ::unsetenv("PHALANX_SHM_ZERO_COPY");
  }
  auto store = std::make_shared<MemoryStore>();
  run_threads(1, [&](int rank) {
    auto pg = make_thread_group("shm", rank, 1, std::make_shared<PrefixStore>("one", store));
    REQUIRE_RANK(rank, !in_shared_memory(pg->symmetric_zeros(8, DType::Float32)), "one rank needs no shared memory");
  });
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("shm", rank, 2, std::make_shared<PrefixStore>("sim", store));
    const Tensor t = pg->symmetric_zeros(8, DType::Float32, Device::sim());
    REQUIRE_RANK(rank, t.device() == Device::sim() && t.numel() == 8, "a sim device tensor");
    bool refused = false;
    try {
      pg->symmetric_zeros(-1, DType::Float32);
    } catch (const ValueError&) {
      refused = true;
    }
    REQUIRE_RANK(rank, refused, "a negative numel is a ValueError");
  });
}

namespace {

/// A 2-rank shm group in a forked process (a 20 s timeout: a wait that ends at it fails the
/// callers' "at once" checks).
ProcessGroupPtr process_group(int port, const std::string& prefix, int rank) {
  BackendConfig cfg;
  cfg.rank = rank;
  cfg.size = 2;
  cfg.store = store_client(port, prefix);
  cfg.store->set_timeout(std::chrono::seconds(20));
  cfg.timeout = std::chrono::seconds(20);
  cfg.local_rank = rank;
  cfg.local_world_size = 2;
  return create_process_group("shm", cfg);
}

}  // namespace

TEST_CASE("shm zero-copy: a rank that exits before symmetric_zeros fails the others at once, named") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  for (int dead = 0; dead < 2; ++dead) {
    CAPTURE(dead);
    const auto before = shm_names();
    const auto results = run_processes(2, [&](int rank) {
      auto pg = process_group(port, "gone" + std::to_string(dead), rank);
      pg->barrier()->wait();
      if (rank == dead) ::_exit(3);  // killed before its buffer: its group never learns
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto start = std::chrono::steady_clock::now();
      try {
        pg->symmetric_zeros(1000, DType::Float32);
      } catch (const CommError& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const std::string m = e.what();
        REQUIRE_RANK(rank, m.find(detail::concat("rank ", dead, " (pid")) != std::string::npos, m);
        REQUIRE_RANK(rank, s < 5, detail::concat("failed only after ", s, " s: ", m));
        return 0;
      }
      return 1;
    });
    CHECK(results[dead].exit_code == 3);
    CHECK(results[1 - dead].exit_code == 0);
    for (const auto& n : shm_names()) CHECK_MESSAGE(before.count(n), "left in /dev/shm: " << n);
  }
}

TEST_CASE("shm zero-copy: a rank asking another size fails at once, never past its buffer") {
  auto store = std::make_shared<MemoryStore>();
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("shm", rank, 2, std::make_shared<PrefixStore>("size", store));
    // Rank 0 makes the segment: 4 KiB slots; rank 1 wants 400 KB in it.
    const std::int64_t n = rank == 0 ? 10 : 100000;
    std::string error;
    try {
      Tensor t = pg->symmetric_zeros(n, DType::Float32);
      REQUIRE_RANK(rank, rank == 0, "a 400 KB tensor over rank 0's 4 KiB slot");
    } catch (const ValueError& e) {
      error = e.what();
    }
    if (rank == 1)
      REQUIRE_RANK(rank, error.find("symmetric_zeros(100000, float32): rank 0 asked for 40 bytes") != std::string::npos,
                   error);
  });
}

TEST_CASE("shm zero-copy: PHALANX_SHM_ZERO_COPY on one rank only: rank 0's choice holds everywhere") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  for (int off = 0; off < 2; ++off) {
    CAPTURE(off);
    const auto results = run_processes(2, [&](int rank) {
      if (rank == off) ::setenv("PHALANX_SHM_ZERO_COPY", "0", 1);
      auto pg = process_group(port, "env" + std::to_string(off), rank);
      Tensor t = pg->symmetric_zeros(64, DType::Float32);
      REQUIRE_RANK(rank, in_shared_memory(t) == (off != 0), "not rank 0's choice");
      t.fill_(static_cast<float>(rank + 1));
      pg->allreduce(t)->wait();
      REQUIRE_RANK(rank, t.data<float>()[63] == 3.f, "the sum");
      return 0;
    });
    CHECK(results[0].exit_code == 0);
    CHECK(results[1].exit_code == 0);
  }
}

TEST_CASE("shm zero-copy: a group made again under the same store prefix gets new buffers that reduce") {
  // An elastic restart: the old group's symm/<k> keys (names already unlinked) are still in
  // the store; the new group's ranks must meet in the new segments, not the old names.
  auto store = std::make_shared<MemoryStore>();
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    run_threads(2, [&](int rank) {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20 * round));
      auto pg = make_thread_group("shm", rank, 2, std::make_shared<PrefixStore>("again", store));
      for (int k = 0; k < 2; ++k) {
        Tensor t = pg->symmetric_zeros(100 + k, DType::Float32);
        REQUIRE_RANK(rank, in_shared_memory(t), "not shared");
        t.fill_(static_cast<float>(rank + 1 + round));
        pg->allreduce(t)->wait();
        REQUIRE_RANK(rank, t.data<float>()[99] == static_cast<float>(3 + 2 * round), "the sum");
      }
      pg->barrier()->wait();
    });
  }
}

TEST_CASE("shm zero-copy: too little /dev/shm: every rank falls back alike, and reduces") {
  if (::geteuid() != 0) {
    MESSAGE("SKIPPED: needs root (unshare, mount) to give the ranks a 24 MiB /dev/shm");
    return;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // One child in a mount namespace of its own with a 24 MiB /dev/shm (the group's segment
  // takes about 9 MiB at W = 2); the ranks are its children.
  const pid_t outer = ::fork();
  if (outer == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=24m") != 0)
      ::_exit(77);
    TcpStoreServer server(TcpStoreOptions{});
    const int port = server.port();
    const auto results = run_processes(2, [&](int rank) {
      auto pg = process_group(port, "small", rank);
      // 2 x 8 MiB do not fit beside the group's segment: ordinary memory on both ranks.
      Tensor big = pg->symmetric_zeros(2 << 20, DType::Float32);
      if (in_shared_memory(big)) return 3;
      Tensor small = pg->symmetric_zeros(1000, DType::Float32);  // then one that fits
      if (!in_shared_memory(small)) return 4;
      big.fill_(static_cast<float>(rank + 1));
      small.fill_(static_cast<float>(rank + 1));
      pg->allreduce(big)->wait();
      pg->allreduce(small)->wait();
      if (big.data<float>()[(2 << 20) - 1] != 3.f || small.data<float>()[999] != 3.f) return 5;
      return 0;
    });
    ::_exit(results[0].exit_code == 0 && results[1].exit_code == 0 ? 0
                                                                     : 10 + results[0].exit_code * 16 + results[1].exit_code);
  }
  int status = 0;
  ::waitpid(outer, &status, 0);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    MESSAGE("SKIPPED: no mount namespace here");
    return;
  }
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("shm zero-copy: abort() ends a symmetric_zeros waiting for a peer, and refuses later ones") {
  // The failure watcher aborts the group when another rank posts its failure; that rank may
  // still be alive (and in the group) for a while: the wait must not last until the timeout.
  auto store = std::make_shared<MemoryStore>();
  std::atomic<bool> done{false};
  run_threads(2, [&](int rank) {
    auto pg = make_thread_group("shm", rank, 2, std::make_shared<PrefixStore>("abort", store), std::chrono::seconds(20));
    if (rank == 1) {  // never makes the buffer; stays in the group until rank 0 is done
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(25);
      while (!done.load() && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::thread watcher([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      pg->abort(std::make_exception_ptr(CommError("watcher: rank 1 posted its failure")));
    });
    const auto start = std::chrono::steady_clock::now();
    std::string first, second;
    try {
      pg->symmetric_zeros(1000, DType::Float32);
    } catch (const CommError& e) {
      first = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    watcher.join();
    try {
      pg->symmetric_zeros(1000, DType::Float32);
    } catch (const CommError& e) {
      second = e.what();
    }
    done = true;
    REQUIRE_RANK(rank, first.find("aborted") != std::string::npos, first);
    REQUIRE_RANK(rank, s < 5, detail::concat("ended only after ", s, " s"));
    REQUIRE_RANK(rank, second == "watcher: rank 1 posted its failure", second);
  });
}
