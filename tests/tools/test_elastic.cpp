// Elastic jobs (phalanx-run --nnodes MIN:MAX), two launchers on loopback posing as nodes
// (PHALANX_HOST_ID): a node's launcher killed mid-job, the survivor goes on; started again,
// it rejoins; in exact mode the final weights equal one process's byte for byte. Also the
// time from the node's death to the survivors' next step, and the one-line errors.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "elastic_support.hpp"
#include "trainer_harness.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using trainer_test::slurp;

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

using Node = elastic_test::Launcher;
using elastic_test::finish;
using elastic_test::has;
using elastic_test::has_checkpoint;
using elastic_test::Reaper;
using elastic_test::remove_case_dir;
using elastic_test::wait_for;

/// A launcher started with `args` (split on spaces), its output in `out`, as node `host`.
Node start(const std::string& args, const std::string& out, const std::string& host) {
  std::vector<std::string> words;
  std::string w;
  for (char c : args + " ")
    if (c == ' ') {
      if (!w.empty()) words.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  Node n;
  n.out = out;
  n.pid = ::fork();
  if (n.pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("PHALANX_HOST_ID", host.c_str(), 1);
    ::setenv("PHALANX_RDZV_SECRET", "elastic-test-secret", 1);
    std::vector<char*> argv;
    for (auto& s : words) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return n;
}

/// The trainer's data and batch arguments for the case study in `d`.
std::string data_args(const std::string& d) {
  return " --train-x " + d + "/x.npy --train-y " + d + "/y.npy --init " + d + "/init.npz --global-batch 64";
}

/// Leaves `d`/ck1 with steps 1..3 and `d`/ck0 with steps 1..6 of the 8 each held.
void drop_late_steps(const std::string& d) {
  for (int s = 4; s <= 8; ++s) {
    char b[64];
    std::snprintf(b, sizeof b, "/checkpoint-%010d.npz", s);
    std::filesystem::remove(d + "/ck1" + b);
    if (s > 6) std::filesystem::remove(d + "/ck0" + b);
  }
}

struct TwoNodes {
  int c0, c1;
  std::string o0, o1;
};

/// Node 0 (`run` + "/ck0") forms the rounds, node 1 (`run` + "/ck1") joins; both run to
/// their end: their exit codes and outputs.
TwoNodes run_two_nodes(const std::string& run, const std::string& d) {
  Node n0 = start(run + "/ck0", d + "/n0.txt", "a"), n1;
  Reaper reaper{{&n0, &n1}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  n1 = start(run + "/ck1", d + "/n1.txt", "b");
  TwoNodes r;
  r.c0 = finish(n0, 60s);
  r.c1 = finish(n1, 20s);
  r.o0 = slurp(n0.out);
  r.o1 = slurp(n1.out);
  return r;
}

}  // namespace

TEST_CASE("elastic 1:2, no shared folder: a node dies, the job goes on; it rejoins empty, exact bytes") {
  const std::string d = trainer_test::case_study_dir("phalanx_elastic");
  // 2400 steps: long enough that the one-node stretch cannot finish before the rejoin.
  const std::string data = data_args(d) + " --lr 0.1 --momentum 0.9 --epochs 300 --shuffle --seed 5 "
                           "--exact --micro-batch 16";
  const trainer_test::Result one =
      trainer_test::run_command(std::string(PHALANX_TRAIN) + data + " --save " + d + "/one.npz", d + "/one.txt");
  REQUIRE(one.code == 0);
  // Two workers a node on the flat Gloo mesh: one node alone is not much faster than two.
  // --max-restarts 1: the death spends it, the join must not.
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --nproc-per-node 2 --backend gloo "
                          "--rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) +
                          " --rdzv-id elastic-test --rdzv-last-call 5 --max-restarts 1 " + PHALANX_TRAIN + data +
                          " --checkpoint-every 20 --resume --save " + d + "/el.npz --checkpoint-dir " + d;
  // No shared folder: each node its own (node 1's stays empty but for what it receives).
  Node n0 = start(run + "/ck0", d + "/n0.txt", "a"), n1, n1b;
  Reaper reaper{{&n0, &n1, &n1b}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));  // node 0 hosts: it binds the port first
  n1 = start(run + "/ck1", d + "/n1.txt", "b");
  REQUIRE(wait_for(n0.out, "round 0: node 0 of 2 (world size 4)", 30s));
  const auto until = Clock::now() + 30s;
  while (!has_checkpoint(d + "/ck0") && Clock::now() < until) std::this_thread::sleep_for(5ms);
  REQUIRE(has_checkpoint(d + "/ck0"));
  const std::size_t mark = slurp(n0.out).size();
  ::kill(n1.pid, SIGKILL);  // the node's launcher dies; its workers die with it
  const auto killed = Clock::now();
  CHECK(finish(n1, 5s) == 128 + SIGKILL);
  REQUIRE(wait_for(n0.out, "resumed at step", 20s, mark));
  const double death_to_step = std::chrono::duration<double>(Clock::now() - killed).count();
  const std::string mid = slurp(n0.out);
  INFO(mid);
  CHECK(has(mid, "round 1: node 0 of 1 (world size 2)"));
  CHECK(has(mid, "is gone: no keep-alive"));
  MESSAGE("from the node's death to the survivor's next step: " << death_to_step << " s");
  CHECK(death_to_step <= 5.0);
  std::filesystem::remove_all(d + "/ck1");  // it comes back with an empty folder
  n1b = start(run + "/ck1", d + "/n1b.txt", "b");
  const int c0 = finish(n0, 60s), c1 = finish(n1b, 60s);
  const std::string o0 = slurp(n0.out), o1 = slurp(n1b.out);
  INFO("node 0:\n" << o0 << "\nnode 1 again:\n" << o1);
  CHECK(c0 == 0);
  CHECK(c1 == 0);
  CHECK(has(o0, "round 2: node 0 of 2 (world size 4)"));
  CHECK(has(o0, "ended for a change of membership (a node joins): not counted as a restart"));
  CHECK(has(o0, "\"world_size\":4"));  // the last round ran on both nodes
  CHECK(has(o1, "node 1 of 2 (world size 4)"));
  CHECK(has(o1, "received the checkpoint of step"));  // from node 0, into its empty folder
  CHECK(has_checkpoint(d + "/ck1"));
  CHECK(slurp(d + "/el.npz") == slurp(d + "/one.npz"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic 2:3: fewer than MIN nodes after --rdzv-timeout is one line") {
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_min");
  Node n0 = start(std::string(PHALANX_RUN) + " --nnodes 2:3 --rdzv-endpoint 127.0.0.1:" +
                      std::to_string(free_port()) + " --rdzv-id J --rdzv-timeout 0.5 /bin/true",
                  d + "/n0.txt", "a");
  const int code = finish(n0, 20s);
  const std::string o = slurp(n0.out);
  INFO(o);
  CHECK(code == 1);
  CHECK(has(o, "1 node(s) in the job after waiting 0.5 s (--rdzv-timeout), fewer than the 2 --nnodes 2:3 needs"));
  remove_case_dir(d);
}

TEST_CASE("elastic: a node with another --rdzv-id is refused; the job runs without it") {
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_id");
  const std::string ep = " --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port());
  Node n0 = start(std::string(PHALANX_RUN) + " --nnodes 1:2 --rdzv-last-call 1" + ep + " --rdzv-id J /bin/true",
                  d + "/n0.txt", "a");
  Reaper reaper{{&n0}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  Node n1 = start(std::string(PHALANX_RUN) + " --nnodes 1:2" + ep + " --rdzv-id OTHER /bin/true", d + "/n1.txt", "b");
  const int c1 = finish(n1, 20s), c0 = finish(n0, 20s);
  const std::string o0 = slurp(n0.out), o1 = slurp(n1.out);
  INFO(o0 << o1);
  CHECK(c1 == 2);
  CHECK(has(o1, "belongs to another job"));
  CHECK(c0 == 0);
  CHECK(has(o0, "round 0: node 0 of 1"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a size the program cannot run on stops after its second occurrence, not all restarts") {
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_size");
  // 3 workers do not divide exact mode's 4 micro-batches a step.
  Node n0 = start(std::string(PHALANX_RUN) + " --nnodes 1:2 --nproc-per-node 3 --backend gloo --rdzv-last-call 0.1 "
                      "--rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) + " --rdzv-id J --max-restarts 5 " +
                      PHALANX_TRAIN + data_args(d) + " --lr 0.1 --epochs 1 --exact --micro-batch 16",
                  d + "/n0.txt", "a");
  const int code = finish(n0, 40s);
  const std::string o = slurp(n0.out);
  INFO(o);
  CHECK(code == 1);
  CHECK(has(o, "the same failure came before any training step twice at world size 3"));
  CHECK_FALSE(has(o, "round 2:"));
  remove_case_dir(d);
}

TEST_CASE("normal mode under an elastic launcher: a mid-epoch checkpoint of 2 workers resumes on 1 and on 4") {
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_normal");
  const std::string train = std::string(PHALANX_TRAIN) + data_args(d) + " --lr 0.1 --momentum 0.9 --epochs 2 "
                            "--shuffle --seed 5";
  const std::string run = std::string(PHALANX_RUN) + " --standalone --backend gloo --nproc-per-node ";
  using trainer_test::run_command;
  REQUIRE(run_command(train + " --save " + d + "/one.npz", d + "/one.txt").code == 0);
  const auto two = run_command(run + "2 " + train + " --checkpoint-dir " + d + "/ck --checkpoint-every 3 "
                               "--keep-checkpoints 10 --save " + d + "/two.npz", d + "/two.txt");
  INFO(two.out);
  REQUIRE(two.code == 0);
  const std::string mid = d + "/ck/checkpoint-0000000003.npz";  // step 3 of epoch 1's 8
  REQUIRE(std::filesystem::exists(mid));
  // Outside an elastic job the world size must match.
  const auto refused = run_command(train + " --resume-from " + mid + " --save " + d + "/no.npz", d + "/no.txt");
  CHECK(refused.code != 0);
  CHECK(has(refused.out, "resume with the same number of workers"));
  // In one (the launcher sets PHALANX_ELASTIC=1): B / W a worker, the sampler from step 3.
  for (const int w : {1, 4}) {
    const std::string save = d + "/r" + std::to_string(w) + ".npz";
    const auto r = run_command("PHALANX_ELASTIC=1 " + run + std::to_string(w) + " " + train + " --resume-from " +
                                   mid + " --save " + save,
                               d + "/r.txt");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(has(r.out, "resumed at step 3"));
    CHECK(has(r.out, "\"steps\":16"));
    // DDP's mean over W workers rounds differently from one process's: close, not equal.
    CHECK(trainer_test::max_weight_diff(save, d + "/one.npz") < 1e-5);
    CHECK(trainer_test::max_weight_diff(save, d + "/two.npz") < 1e-5);
  }
  remove_case_dir(d);
}

TEST_CASE("elastic: a node's launcher asked to stop leaves; the job goes on without it, not counted") {
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_leave");
  const std::string data = data_args(d) + " --lr 0.1 --epochs 300 --exact --micro-batch 16";
  REQUIRE(trainer_test::run_command(std::string(PHALANX_TRAIN) + data + " --save " + d + "/one.npz", d + "/one.txt")
              .code == 0);
  // --max-restarts 0: a node that leaves must not spend a restart.
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --nproc-per-node 2 --backend gloo "
                          "--rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) +
                          " --rdzv-id leave-test --rdzv-last-call 5 --max-restarts 0 " + PHALANX_TRAIN + data +
                          " --checkpoint-every 20 --resume --save " + d + "/el.npz --checkpoint-dir " + d;
  Node n0 = start(run + "/ck0", d + "/n0.txt", "a"), n1;
  Reaper reaper{{&n0, &n1}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  n1 = start(run + "/ck1", d + "/n1.txt", "b");
  REQUIRE(wait_for(n0.out, "round 0: node 0 of 2 (world size 4)", 30s));
  const auto until = Clock::now() + 30s;
  while (!has_checkpoint(d + "/ck0") && Clock::now() < until) std::this_thread::sleep_for(5ms);
  ::kill(n1.pid, SIGTERM);  // a preemption notice
  const int c1 = finish(n1, 30s), c0 = finish(n0, 60s);
  const std::string o0 = slurp(n0.out), o1 = slurp(n1.out);
  INFO("node 0:\n" << o0 << "\nnode 1:\n" << o1);
  CHECK(c1 == 128 + SIGTERM);
  CHECK(has(o1, "this node leaves the job; the others go on"));
  CHECK(c0 == 0);
  CHECK(has(o0, "it leaves the job"));
  CHECK(has(o0, "(a node left): not counted as a restart"));
  CHECK(has(o0, "round 1: node 0 of 1 (world size 2)"));
  CHECK_FALSE(has(o0, "round 2:"));  // the node that left is not taken back
  CHECK(slurp(d + "/el.npz") == slurp(d + "/one.npz"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a node with another --nproc-per-node is refused before it is admitted") {
  // Each node makes WORLD_SIZE = members x its own count: admitted, this node's workers
  // would see world size 4 and ranks 2, 3 beside the host's world size 2.
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_nproc");
  const std::string ep = " --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port());
  const std::string prog = d + "/w.sh";
  {
    std::FILE* f = std::fopen(prog.c_str(), "w");
    std::fputs("echo \"worker world=$WORLD_SIZE rank=$RANK\"\n", f);
    std::fclose(f);
  }
  Node n0 = start(std::string(PHALANX_RUN) + " --nnodes 1:2 --rdzv-id J --rdzv-last-call 3" + ep + " /bin/sh " + prog,
                  d + "/n0.txt", "a");
  Reaper reaper{{&n0}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  Node n1 = start(std::string(PHALANX_RUN) + " --nnodes 1:2 --nproc-per-node 2 --rdzv-id J" + ep + " /bin/sh " + prog,
                  d + "/n1.txt", "b");
  const int c1 = finish(n1, 20s), c0 = finish(n0, 20s);
  const std::string o0 = slurp(n0.out), o1 = slurp(n1.out);
  INFO(o0 << o1);
  CHECK(c1 == 2);
  CHECK(has(o1, "--nproc-per-node is 2 on this node but 1 on the node that hosts the job's store"));
  CHECK_FALSE(has(o1, "world=4"));
  CHECK(c0 == 0);
  CHECK(has(o0, "round 0: node 0 of 1"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a join does not spend a restart when a stopped peer's exit fails a worker first") {
  // Node 0's launcher stops its worker at once when it closes the round for the join; node
  // 1's notices on its next tick (0.25 s here). Meanwhile node 1's worker, like a DDP
  // worker whose peer vanished, fails on its own: a consequence of the stop, not a failure.
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_joinfail");
  const std::string prog = d + "/w.sh";
  {
    std::FILE* f = std::fopen(prog.c_str(), "w");
    std::fprintf(f,
                 "D=%s\n"
                 "if [ \"$PHALANX_RESTART_COUNT\" -ge 1 ]; then echo \"worker world=$WORLD_SIZE\"; exit 0; fi\n"
                 "if [ \"$GROUP_RANK\" = 0 ]; then\n"
                 "  trap 'rm -f $D/up; exit 143' TERM\n"
                 "  touch $D/up\n"
                 "  while :; do sleep 0.01; done\n"
                 "fi\n"
                 "while [ ! -e $D/up ]; do sleep 0.01; done\n"
                 "touch $D/ready\n"
                 "while [ -e $D/up ]; do sleep 0.01; done\n"
                 "exit 1\n",
                 d.c_str());
    std::fclose(f);
  }
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:3 --rdzv-id J --rdzv-last-call 1 --max-restarts 0 "
                          "--rdzv-endpoint 127.0.0.1:" + std::to_string(free_port());
  Node n0 = start(run + " /bin/sh " + prog, d + "/n0.txt", "a"), n1, n2;
  Reaper reaper{{&n0, &n1, &n2}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  n1 = start(run + " --monitor-interval 0.25 /bin/sh " + prog, d + "/n1.txt", "b");
  const auto until = Clock::now() + 20s;
  while (!std::filesystem::exists(d + "/ready") && Clock::now() < until) std::this_thread::sleep_for(5ms);
  REQUIRE(std::filesystem::exists(d + "/ready"));
  n2 = start(run + " /bin/sh " + prog, d + "/n2.txt", "c");
  const int c0 = finish(n0, 30s), c1 = finish(n1, 30s), c2 = finish(n2, 30s);
  const std::string o0 = slurp(n0.out);
  INFO(o0 << slurp(n1.out) << slurp(n2.out));
  CHECK(c0 == 0);
  CHECK(c1 == 0);
  CHECK(c2 == 0);
  CHECK(has(o0, "ended for a change of membership (a node joins): not counted as a restart"));
  CHECK(has(o0, "round 1: node 0 of 3"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a launcher asked to stop between rounds leaves; the next round does not wait for it") {
  // Round 0 fails on node 0; node 2's worker ignores the stop, so the host waits for node
  // 2's report (its --term-timeout) while node 1 has reported and waits for the verdict.
  // Node 1's launcher then gets SIGTERM: it leaves. The host must not put it in round 1
  // (its keep-alive has not lapsed yet), wait for it there and count it as a failure.
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_between");
  const std::string prog = d + "/w.sh";
  {
    std::FILE* f = std::fopen(prog.c_str(), "w");
    std::fprintf(f,
                 "D=%s\n"
                 "if [ \"$PHALANX_RESTART_COUNT\" -ge 1 ]; then echo \"worker world=$WORLD_SIZE\"; exit 0; fi\n"
                 "case $GROUP_RANK in\n"
                 "0) while [ ! -e $D/fail ]; do sleep 0.02; done; exit 1;;\n"
                 "1) touch $D/up1; exec sleep 30;;\n"
                 "*) trap '' TERM; touch $D/up2; while :; do sleep 0.05; done;;\n"
                 "esac\n",
                 d.c_str());
    std::fclose(f);
  }
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:3 --rdzv-id J --rdzv-last-call 10 --max-restarts 1 "
                          "--rdzv-keep-alive 3 --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port());
  Node n0 = start(run + " /bin/sh " + prog, d + "/n0.txt", "a"), n1, n2;
  Reaper reaper{{&n0, &n1, &n2}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  n1 = start(run + " /bin/sh " + prog, d + "/n1.txt", "b");
  REQUIRE(wait_for(n1.out, "launcher id 1", 20s));
  n2 = start(run + " --term-timeout 4 /bin/sh " + prog, d + "/n2.txt", "c");
  const auto until = Clock::now() + 20s;
  while (!(std::filesystem::exists(d + "/up1") && std::filesystem::exists(d + "/up2")) && Clock::now() < until)
    std::this_thread::sleep_for(5ms);
  REQUIRE(std::filesystem::exists(d + "/up2"));
  std::FILE* fail = std::fopen((d + "/fail").c_str(), "w");
  std::fclose(fail);
  REQUIRE(wait_for(n1.out, "node 1: stopped", 20s));  // it reported; it waits for the verdict
  std::this_thread::sleep_for(2500ms);  // node 2 reports 4 s after its stop
  ::kill(n1.pid, SIGTERM);
  const int c1 = finish(n1, 20s), c0 = finish(n0, 30s), c2 = finish(n2, 30s);
  const std::string o0 = slurp(n0.out);
  INFO(o0 << slurp(n1.out) << slurp(n2.out));
  CHECK(c1 == 128 + SIGTERM);
  CHECK(c0 == 0);
  CHECK(c2 == 0);
  CHECK(has(o0, "round 1: 2 node(s), world size 2 (restarts counted: 1 of 1)"));
  CHECK_FALSE(has(o0, "giving up"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a node without --checkpoint-dir beside one with it is one line, not a hang") {
  // The host runs round 0 alone; the joiner, without a folder, makes round 1, where only the
  // host's rank would enter the resume's checkpoint sharing (a collective).
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_nodir");
  const std::string train = std::string(PHALANX_TRAIN) + data_args(d) + " --lr 0.1 --epochs 3000 --exact --micro-batch 16";
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --backend gloo --rdzv-id J --rdzv-last-call 0.2 "
                          "--max-restarts 0 --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) + " ";
  Node n0 = start(run + train + " --checkpoint-dir " + d + "/ck0", d + "/n0.txt", "a"), n1;
  Reaper reaper{{&n0, &n1}};
  REQUIRE(wait_for(n0.out, "round 0: node 0 of 1", 20s));
  n1 = start(run + train, d + "/n1.txt", "b");
  const int c0 = finish(n0, 30s), c1 = finish(n1, 10s);
  const std::string o0 = slurp(n0.out);
  INFO(o0 << slurp(n1.out));
  CHECK(c0 == 1);
  CHECK(c1 == 1);
  CHECK(has(o0, "checkpoint dir differs across ranks: rank 0 has given, rank 1 has none"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: with --resume-from, a node that joins with an empty folder gets the job's newest checkpoint") {
  // The host runs round 0 alone from --resume-from and checkpoints into its own folder; in
  // round 1 the joiner's folder is empty: it must not fall back to --resume-from's step.
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_resume_from");
  const std::string train = std::string(PHALANX_TRAIN) + data_args(d) + " --lr 0.1 --exact --micro-batch 16";
  REQUIRE(trainer_test::run_command(train + " --epochs 1 --checkpoint-dir " + d + "/pre --checkpoint-every 5",
                                    d + "/pre.txt")
              .code == 0);
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --backend gloo --rdzv-id J --rdzv-last-call 0.2 "
                          "--rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) + " " + train +
                          " --epochs 3000 --checkpoint-every 20 --resume-from " + d +
                          "/pre/checkpoint-0000000005.npz --checkpoint-dir " + d;
  Node n0 = start(run + "/ck0", d + "/n0.txt", "a"), n1;
  Reaper reaper{{&n0, &n1}};
  REQUIRE(wait_for(n0.out, "resumed at step 5", 20s));
  n1 = start(run + "/ck1", d + "/n1.txt", "b");
  REQUIRE(wait_for(n0.out, "round 1: node 0 of 2 (world size 2)", 20s));
  const bool received = wait_for(n1.out, "received the checkpoint of step", 20s);
  std::this_thread::sleep_for(500ms);
  const std::string o0 = slurp(n0.out), o1 = slurp(n1.out);
  INFO(o0 << o1);
  CHECK(received);
  CHECK_FALSE(has(o0, "resume step differs across ranks"));
  CHECK_FALSE(has(o0, "giving up"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a node killed during the first round's last call is dropped, not counted (--max-restarts 0)") {
  // It registered (an id, a keep-alive) and died before it read round 0's members: its
  // keep-alive (4 s) has not lapsed when the last call ends, so the host puts it in round 0.
  // It never ran a worker of the round: the job goes on with the host, no restart spent.
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_lastcall");
  const std::string prog = d + "/w.sh";
  {
    std::FILE* f = std::fopen(prog.c_str(), "w");
    std::fputs("echo \"worker world=$WORLD_SIZE round=$PHALANX_RESTART_COUNT\"\n", f);
    std::fclose(f);
  }
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --rdzv-id J --rdzv-last-call 2 --rdzv-keep-alive 4 "
                          "--max-restarts 0 --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) + " /bin/sh " +
                          prog;
  Node n0 = start(run, d + "/n0.txt", "a"), n1;
  Reaper reaper{{&n0, &n1}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  n1 = start(run, d + "/n1.txt", "b");
  REQUIRE(wait_for(n1.out, "(launcher id 1)", 20s));
  ::kill(n1.pid, SIGKILL);
  CHECK(finish(n1, 5s) == 128 + SIGKILL);
  const int c0 = finish(n0, 30s);
  const std::string o0 = slurp(n0.out);
  INFO(o0);
  REQUIRE(has(o0, "round 0: node 0 of 2"));  // the case: the dead node was put in the round
  CHECK(c0 == 0);
  CHECK(has(o0, "(launcher id 1) died before it started round 0: it was never in the round"));
  CHECK(has(o0, "(a node died before it started): not counted as a restart"));
  CHECK(has(o0, "round 1: node 0 of 1"));
  CHECK(has(o0, "worker world=1 round=1"));
  CHECK_FALSE(has(o0, "giving up"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a launcher waiting to be admitted exits 1 naming the host when the host's launcher dies") {
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_hostdies");
  const std::string port = std::to_string(free_port());
  // MIN 2: the host waits in round 0's last call (30 s) with the other launcher waiting.
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 2:3 --rdzv-id J --rdzv-last-call 30 "
                          "--rdzv-endpoint 127.0.0.1:" + port + " /bin/true";
  Node n0 = start(run, d + "/n0.txt", "a"), n1;
  Reaper reaper{{&n0, &n1}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  n1 = start(run, d + "/n1.txt", "b");
  REQUIRE(wait_for(n1.out, "waits to be admitted", 20s));
  std::this_thread::sleep_for(300ms);  // the host has seen its keep-alive
  ::kill(n0.pid, SIGKILL);
  CHECK(finish(n0, 5s) == 128 + SIGKILL);
  const int c1 = finish(n1, 20s);
  const std::string o1 = slurp(n1.out);
  INFO(o1);
  CHECK(c1 == 1);
  CHECK(has(o1, "phalanx-run: lost the job's store: the launcher that hosts it (127.0.0.1:" + port + ") is gone"));
  CHECK(has(o1, "restart the job"));
  CHECK_FALSE(has(o1, "the job ended before this node was admitted"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a node's own folder keeps --keep-checkpoints after a transfer; stale transfer temporaries go") {
  // Node 1's folder holds steps 1..3, the host's 1..6: node 1 receives step 6 and must then
  // hold what rank 0's folder would after a save: the newest 2. A transfer killed mid-write
  // (its process gone) left a temporary of this host: removed at the start; the others stay.
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_prune");
  const std::string train = std::string(PHALANX_TRAIN) + data_args(d) + " --lr 0.1 --exact --micro-batch 16 --epochs 1";
  for (const char* ck : {"ck0", "ck1"})
    REQUIRE(trainer_test::run_command(train + " --checkpoint-every 1 --keep-checkpoints 100 --checkpoint-dir " + d +
                                          "/" + ck,
                                      d + "/pre.txt")
                .code == 0);
  const auto steps_in = [](const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  drop_late_steps(d);
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string tmp = d + "/ck1/checkpoint-0000000007.npz.tmp.recv-";
  const std::vector<std::string> kept = {tmp + "999999999-other-host",  // another host's: its writer may live
                                         tmp + std::to_string(::getpid()) + "-" + host,  // a live writer's
                                         d + "/ck1/notes.tmp"};
  for (const auto& f : kept) std::fclose(std::fopen(f.c_str(), "w"));
  const std::string stale = tmp + "999999999-" + host;  // no such process
  std::fclose(std::fopen(stale.c_str(), "w"));
  // A pid this host does not know, but the file is locked: a live writer in another pid
  // namespace (a container) or on another machine of this name, on a shared folder.
  const std::string held = tmp + "999999998-" + host;
  const int held_fd = ::open(held.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(held_fd >= 0);
  REQUIRE(::flock(held_fd, LOCK_EX | LOCK_NB) == 0);
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --backend gloo --rdzv-id J --rdzv-last-call 10 "
                          "--max-restarts 0 --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) + " " + train +
                          " --resume --keep-checkpoints 2 --checkpoint-dir " + d;
  const TwoNodes r = run_two_nodes(run, d);
  INFO(r.o0 << r.o1);
  CHECK(r.c0 == 0);
  CHECK(r.c1 == 0);
  CHECK(has(r.o1, "received the checkpoint of step 6"));
  const auto names = steps_in(d + "/ck1");
  std::vector<std::string> checkpoints;
  for (const auto& n : names)
    if (n.rfind("checkpoint-", 0) == 0 && n.size() == 25) checkpoints.push_back(n);
  CHECK(checkpoints == std::vector<std::string>{"checkpoint-0000000003.npz", "checkpoint-0000000006.npz"});
  CHECK_FALSE(std::filesystem::exists(stale));
  for (const auto& f : kept) CHECK(std::filesystem::exists(f));
  CHECK(std::filesystem::exists(held));
  ::close(held_fd);
  remove_case_dir(d);
}

TEST_CASE("elastic: a launcher waiting to be admitted that reads the job's clean end late exits 0") {
  // MAX 2 reached in round 0: the third launcher waits. It is stopped (a loaded machine)
  // while the job ends (for less than its keep-alive); the host must wait for it to read the
  // end before its store goes, else it finds the store gone and takes the clean end for the
  // host's death (exit 1).
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_lateend");
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --rdzv-id J --rdzv-last-call 1 "
                          "--rdzv-keep-alive 10 --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) + " /bin/sleep 2";
  Node n0 = start(run, d + "/n0.txt", "a"), n1, n2;
  Reaper reaper{{&n0, &n1, &n2}};
  REQUIRE(wait_for(n0.out, "forms its rounds", 20s));
  n1 = start(run, d + "/n1.txt", "b");
  REQUIRE(wait_for(n1.out, "round 0: node 1 of 2", 20s));
  n2 = start(run, d + "/n2.txt", "c");
  REQUIRE(wait_for(n2.out, "waiting for the next round", 20s));
  ::kill(n2.pid, SIGSTOP);
  CHECK(finish(n1, 30s) == 0);  // it read the end: the host may go any moment now
  std::this_thread::sleep_for(500ms);
  ::kill(n2.pid, SIGCONT);
  const int c2 = finish(n2, 20s), c0 = finish(n0, 20s);
  const std::string o2 = slurp(n2.out);
  INFO(o2);
  CHECK(c0 == 0);
  CHECK(c2 == 0);
  CHECK(has(o2, "the job ended before this node was admitted"));
  CHECK_FALSE(has(o2, "lost the job's store"));
  reaper.reap();
  remove_case_dir(d);
}

TEST_CASE("elastic: a transfer never prunes a folder that holds another run's checkpoints") {
  // Node 1's folder holds another run's steps 1..3 (another --lr: they do not load here).
  // It receives the job's step 6 and resumes from it; the other run's files are not this
  // job's to prune (--keep-checkpoints 2 would have removed steps 1 and 2).
  const std::string d = trainer_test::case_study_dir("phalanx_elastic_foreign");
  const std::string train = std::string(PHALANX_TRAIN) + data_args(d) + " --exact --micro-batch 16 --epochs 1";
  REQUIRE(trainer_test::run_command(train + " --lr 0.1 --checkpoint-every 1 --keep-checkpoints 100 --checkpoint-dir " +
                                        d + "/ck0",
                                    d + "/pre.txt")
              .code == 0);
  REQUIRE(trainer_test::run_command(train + " --lr 0.05 --checkpoint-every 1 --keep-checkpoints 100 --checkpoint-dir " +
                                        d + "/ck1",
                                    d + "/pre.txt")
              .code == 0);
  drop_late_steps(d);
  const std::string run = std::string(PHALANX_RUN) + " --nnodes 1:2 --backend gloo --rdzv-id J --rdzv-last-call 10 "
                          "--max-restarts 0 --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) + " " + train +
                          " --lr 0.1 --resume --keep-checkpoints 2 --checkpoint-dir " + d;
  const TwoNodes r = run_two_nodes(run, d);
  INFO(r.o0 << r.o1);
  CHECK(r.c0 == 0);
  CHECK(r.c1 == 0);
  REQUIRE(has(r.o1, "received the checkpoint of step 6"));
  for (int s : {1, 2, 3, 6}) {
    char b[64];
    std::snprintf(b, sizeof b, "/ck1/checkpoint-%010d.npz", s);
    CHECK_MESSAGE(std::filesystem::exists(d + b), b);
  }
  remove_case_dir(d);
}
