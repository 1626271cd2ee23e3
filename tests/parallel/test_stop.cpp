// Stop on request (parallel/stop.hpp): a stop noted on any one rank stops every rank at the
// same step, over gloo and shm, with 2 and 3 ranks as processes; a real signal is noted, not
// fatal; save_on_stop writes a checkpoint that verifies and posts the step for phalanx-run.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <nlohmann/json.hpp>

#include <phalanx/phalanx.hpp>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

ProcessGroupPtr process_rank_group(const std::string& backend, int rank, int world, int port) {
  BackendConfig cfg;
  cfg.rank = rank;
  cfg.size = world;
  cfg.local_rank = rank;
  cfg.local_world_size = world;
  cfg.store = store_client(port, "stop_" + backend);
  cfg.timeout = std::chrono::seconds(20);
  return create_process_group(backend, cfg);
}

}  // namespace

TEST_CASE("StopVote: a stop noted on one rank stops every rank at the next step, the same step everywhere") {
  std::vector<std::string> backends{"gloo"};
  if (backend_available("shm")) backends.push_back("shm");
  for (const auto& backend : backends)
    for (int world : {2, 3})
      for (int noter = 0; noter < world; noter += world - 1) {
        CAPTURE(backend);
        CAPTURE(world);
        CAPTURE(noter);
        TcpStoreServer server(TcpStoreOptions{});
        const int port = server.port();
        const auto results = run_processes(world, [&](int rank) {
          parallel::clear_stop_request();
          auto pg = process_rank_group(backend, rank, world, port);
          parallel::StopVote vote(pg, Device::cpu(), std::chrono::milliseconds(0));  // a vote every step
          for (int step = 0; step < 50; ++step) {
            if (rank == noter && step == 5) parallel::request_stop(SIGUSR1);
            if (vote.stop_now()) return step == 6 && vote.agreed_signal() == SIGUSR1 ? 0 : 10 + step;
            pg->allreduce(ones({4}))->wait();  // the step's own collectives, between the votes
          }
          return 3;  // never stopped
        });
        for (int r = 0; r < world; ++r) {
          CAPTURE(r);
          CHECK(results[r].exit_code == 0);
        }
      }
}

TEST_CASE("StopVote: votes about every interval, every rank at the same steps, and stops together") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(3, [&](int rank) {
    parallel::clear_stop_request();
    auto pg = process_rank_group("gloo", rank, 3, port);
    parallel::StopVote vote(pg, Device::cpu(), std::chrono::milliseconds(20));
    for (int step = 0; step < 2000; ++step) {
      // The ranks' step times differ (1 and 2 ms): the slowest rank's proposal (10) wins.
      std::this_thread::sleep_for(std::chrono::microseconds(rank == 2 ? 2000 : 1000));
      if (rank == 1 && step == 100) parallel::request_stop(SIGTERM);
      if (vote.stop_now()) {
        if (vote.steps_between_votes() < 5 || vote.steps_between_votes() > 20) return 200;
        return step - 100;  // the same on every rank; within two intervals of the request
      }
      pg->allreduce(ones({4}))->wait();  // a collective of the step's own: only if the votes stay in step
    }
    return 201;
  });
  CHECK(results[0].exit_code == results[1].exit_code);
  CHECK(results[0].exit_code == results[2].exit_code);
  CHECK(results[0].exit_code > 0);
  CHECK(results[0].exit_code <= 40);
}

TEST_CASE("StopVote: no stop noted, no stop; finish() drains the vote in flight") {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(2, [&](int rank) {
    parallel::clear_stop_request();
    auto pg = process_rank_group("gloo", rank, 2, port);
    parallel::StopVote vote(pg, Device::cpu(), std::chrono::milliseconds(0));
    for (int step = 0; step < 30; ++step)
      if (vote.stop_now()) return 4;
    if (rank == 1) parallel::request_stop(SIGTERM);  // after the last vote was issued: not in it
    if (vote.finish()) return 5;
    if (vote.finish()) return 6;  // nothing in flight any more
    return 0;
  });
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
}

TEST_CASE("StopOnSignal: SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 are noted, not fatal; the old handlers come back") {
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) {
    CAPTURE(sig);
    const auto results = run_processes(1, [&](int) {
      parallel::clear_stop_request();
      {
        parallel::StopOnSignal handlers;
        ::raise(sig);
        if (!parallel::stop_requested() || parallel::stop_signal() != sig) return 4;
        // A world of one: the vote is this process's flag, at once.
        parallel::StopVote vote(make_world_of_one(), Device::cpu());
        if (!vote.stop_now() || vote.agreed_signal() != sig) return 5;
      }
      ::raise(sig);  // the default action again: dies by it
      return 6;
    });
    CHECK(results[0].signal == sig);
  }
}

TEST_CASE("StopOnSignal: the same signal twice ends the process at once; another one is only noted") {
  const auto results = run_processes(2, [&](int rank) {
    parallel::clear_stop_request();
    parallel::StopOnSignal handlers;
    ::raise(SIGUSR1);
    ::raise(rank == 0 ? SIGTERM : SIGUSR1);  // rank 0: another signal; rank 1: the same again
    return parallel::stop_signal() == SIGUSR1 ? 0 : 4;
  });
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].signal == SIGUSR1);
}

TEST_CASE("save_on_stop: rank 0 writes a checkpoint that verifies and posts its step; every rank waits for it") {
  const std::string dir = "/tmp/phalanx_save_on_stop_" + std::to_string(::getpid());
  std::system(("rm -rf " + dir).c_str());
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    auto pg = parallel::init_process_group();
    parallel::CheckpointDir ck(dir);
    if (rank == 0) ck.lock();
    parallel::CheckpointState s;
    if (rank == 0) {
      s.model.set("0.weight", ones({3, 2}));
      s.step = 17;
      s.world_size = 2;
      s.global_batch = 8;
      s.micro_batch = 4;
    }
    const std::string path = parallel::save_on_stop(*pg, ck, s, SIGTERM);
    // Every rank is past the barrier only when the file is complete.
    if (::access((dir + "/checkpoint-0000000017.npz").c_str(), F_OK) != 0) return 4;
    if ((rank == 0) != !path.empty()) return 5;
    parallel::destroy_process_group();
    return 0;
  });
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  parallel::CheckpointExpect any;
  any.world_size = parallel::kAnyWorld;  // written by the 2-worker job, read here in a world of one
  const auto loaded = parallel::load_checkpoint(dir + "/checkpoint-0000000017.npz", any);
  CHECK(loaded.manifest.step == 17);
  // The record phalanx-run reads, under the first attempt's prefix.
  TcpStoreOptions co;
  co.port = port;
  TcpStore client(co);
  const Bytes b = client.get("phalanx/r0/stopped");
  const auto j = nlohmann::json::parse(b.begin(), b.end());
  CHECK(j["step"] == 17);
  CHECK(j["path"] == dir + "/checkpoint-0000000017.npz");
  CHECK(j["signal"] == SIGTERM);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("save_on_stop: when rank 0 cannot save, every rank throws and the record says so") {
  const std::string dir = "/tmp/phalanx_save_on_stop_fail_" + std::to_string(::getpid());
  std::system(("rm -rf " + dir).c_str());
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  const auto results = run_processes(2, [&](int rank) {
    set_rank_env(rank, 2, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    auto pg = parallel::init_process_group();
    parallel::CheckpointDir ck(dir);
    parallel::CheckpointState s;
    s.model.set("0.weight", ones({3, 2}));
    s.step = 9;
    s.world_size = 2;
    s.global_batch = 8;
    s.micro_batch = 4;
    pg->barrier()->wait();  // every rank has its CheckpointDir
    if (rank == 0) std::system(("rm -rf " + dir + " && touch " + dir).c_str());  // a file where the folder was
    try {
      parallel::save_on_stop(*pg, ck, s, SIGTERM);
      return 4;  // reported a save that did not happen
    } catch (const IoError& e) {
      const std::string m = e.what();
      if (rank == 1 && m.find("rank 0 could not save the checkpoint of step 9 when the job was asked to stop") ==
                           std::string::npos)
        return 5;
    }
    parallel::destroy_process_group();
    return 0;
  });
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  TcpStoreOptions co;
  co.port = port;
  TcpStore client(co);
  const Bytes b = client.get("phalanx/r0/stopped");
  const auto j = nlohmann::json::parse(b.begin(), b.end());
  CHECK(j["step"] == 9);
  CHECK(j["path"] == "");
  CHECK(!j.value("error", std::string()).empty());
  std::system(("rm -rf " + dir).c_str());
}
