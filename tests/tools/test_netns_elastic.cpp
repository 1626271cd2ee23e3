// An elastic job across three real hosts on one machine: three network namespaces on a
// bridge (in a fourth, the switch), a phalanx-run --nnodes 2:3 in each, each node with its
// own checkpoint folder. The third node's launcher is killed mid-job: the job goes on with
// two; started again with an empty folder, it rejoins and the job ends on three, its final
// --save byte-identical to one process's (exact mode). Root only, else SKIPPED with the
// reason; the namespaces carry this test's pid and are removed by a destructor.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/elastic_support.hpp"
#include "tools/trainer_harness.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using trainer_test::slurp;

namespace {

bool sh(const std::string& cmd, std::string* err = nullptr) {
  const std::string errfile = "/tmp/phalanx_netns_el_err_" + std::to_string(::getpid());
  const int st = std::system((cmd + " >/dev/null 2>" + errfile).c_str());
  if (err) *err = slurp(errfile);
  std::remove(errfile.c_str());
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/// Three hosts: namespaces phxns<tag>{0,1,2}, each with phalanx0 = 10.233.N.(i+1)/24 on a
/// veth whose other end is a port of a bridge in namespace phxns<tag>s.
class ThreeHosts {
 public:
  ThreeHosts() {
    const std::string tag = std::to_string(::getpid());
    sw_ = "phxns" + tag + "s";
    const std::string net = "10.233." + std::to_string(::getpid() % 200 + 1);
    for (int i = 0; i < 3; ++i) {
      ns_[i] = "phxns" + tag + std::to_string(i);
      addr_[i] = net + "." + std::to_string(i + 1);
    }
    if (::geteuid() != 0) {
      reason_ = "not root: making network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)";
      return;
    }
    if (!sh("command -v ip")) {
      reason_ = "no `ip` command (iproute2) on PATH";
      return;
    }
    std::vector<std::string> steps = {"ip netns add " + sw_, "ip -n " + sw_ + " link add phxbr type bridge",
                                      "ip -n " + sw_ + " link set phxbr up"};
    for (int i = 0; i < 3; ++i) {
      const std::string h = "veh" + tag + std::to_string(i), s = "ves" + tag + std::to_string(i);
      for (const std::string& step :
           {"ip netns add " + ns_[i], "ip link add " + h + " type veth peer name " + s,
            "ip link set " + h + " netns " + ns_[i], "ip link set " + s + " netns " + sw_,
            "ip -n " + ns_[i] + " link set " + h + " name phxnet0", "ip -n " + sw_ + " link set " + s + " master phxbr",
            "ip -n " + sw_ + " link set " + s + " up", "ip -n " + ns_[i] + " addr add " + addr_[i] + "/24 dev phxnet0",
            "ip -n " + ns_[i] + " link set phxnet0 up", "ip -n " + ns_[i] + " link set lo up"})
        steps.push_back(step);
    }
    for (const auto& s : steps) {
      std::string err;
      if (!sh(s, &err)) {
        reason_ = "cannot make network namespaces here (`" + s + "`: " + err.substr(0, err.find('\n')) + ")";
        return;
      }
    }
    const auto deadline = Clock::now() + 10s;  // the links come up asynchronously
    while (!carrier() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
    if (!carrier()) reason_ = "the veths to the bridge have no carrier";
  }
  ~ThreeHosts() {
    for (const auto& n : ns_) sh("ip netns del " + n);
    sh("ip netns del " + sw_);
  }
  ThreeHosts(const ThreeHosts&) = delete;
  ThreeHosts& operator=(const ThreeHosts&) = delete;
  bool ok() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }
  const std::string& ns(int i) const { return ns_[i]; }
  const std::string& addr(int i) const { return addr_[i]; }

 private:
  bool carrier() const {
    for (const auto& n : ns_)
      if (!sh("ip -n " + n + " -o link show phxnet0 | grep -q LOWER_UP")) return false;
    return true;
  }
  std::string ns_[3], sw_, addr_[3], reason_;
};

using elastic_test::finish;
using elastic_test::has;
using elastic_test::has_checkpoint;
using elastic_test::Launcher;
using elastic_test::Reaper;
using elastic_test::wait_for;

/// phalanx-run `args` in namespace `ns` (exec'd: pid is the launcher's), output in `out`.
Launcher start_in(const std::string& ns, const std::string& args, const std::string& out) {
  Launcher l;
  l.out = out;
  const std::string cmd = "exec ip netns exec " + ns +
                          " env -u PHALANX_HOSTNAME -u PHALANX_SOCKET_IFNAME -u GLOO_SOCKET_IFNAME -u PHALANX_RDZV_SECRET"
                          " PHALANX_RDZV_TOKEN=netns-elastic-" + std::to_string(::getpid()) + " PHALANX_TIMEOUT=30 " +
                          PHALANX_RUN + " " + args + " > " + out + " 2>&1";
  l.pid = ::fork();
  if (l.pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return l;
}

}  // namespace

TEST_CASE("three hosts, --nnodes 2:3, a folder each: the third dies, the job goes on; it rejoins, exact bytes") {
  ThreeHosts h;
  if (!h.ok()) {
    MESSAGE("SKIPPED: three network namespaces: " << h.reason());
    return;
  }
  const std::string d = trainer_test::case_study_dir("phalanx_netns_elastic");
  // 6 micro-batches a step: 3 and 2 workers both divide it.
  const std::string train = std::string(PHALANX_TRAIN) + " --train-x " + d + "/x.npy --train-y " + d + "/y.npy --init " +
                            d + "/init.npz --global-batch 96 --lr 0.1 --momentum 0.9 --epochs 200 --shuffle --seed 5 "
                            "--drop-last --exact --micro-batch 16";
  const auto one = trainer_test::run_command(train + " --save " + d + "/one.npz", d + "/one.txt");
  REQUIRE(one.code == 0);
  const std::string args = "--nnodes 2:3 --nproc-per-node 1 --rdzv-endpoint " + h.addr(0) +
                           ":29500 --rdzv-last-call 10 --max-restarts 1 " + train +
                           " --checkpoint-every 10 --resume --save " + d + "/el.npz --checkpoint-dir " + d + "/ck";
  Launcher l[3], again;
  Reaper reaper{{&l[0], &l[1], &l[2], &again}};
  l[0] = start_in(h.ns(0), args + "0", d + "/n0.txt");
  REQUIRE(wait_for(d + "/n0.txt", "forms its rounds", 20s));
  for (int i = 1; i < 3; ++i) l[i] = start_in(h.ns(i), args + std::to_string(i), d + "/n" + std::to_string(i) + ".txt");
  REQUIRE(wait_for(d + "/n0.txt", "round 0: node 0 of 3 (world size 3)", 30s));
  const auto until = Clock::now() + 30s;
  while (!has_checkpoint(d + "/ck0") && Clock::now() < until) std::this_thread::sleep_for(5ms);
  REQUIRE(has_checkpoint(d + "/ck0"));
  // The third node: whichever launcher got node rank 2 (arrival order).
  const int third = has(slurp(d + "/n1.txt"), "node 2 of 3") ? 1 : 2;
  const std::size_t mark = slurp(d + "/n0.txt").size();
  ::kill(l[third].pid, SIGKILL);
  const auto killed = Clock::now();
  finish(l[third], 10s);
  REQUIRE(wait_for(d + "/n0.txt", "resumed at step", 20s, mark));
  const double death_to_step = std::chrono::duration<double>(Clock::now() - killed).count();
  MESSAGE("three hosts: from the third node's death to the survivors' next step: " << death_to_step << " s");
  CHECK(death_to_step <= 5.0);
  CHECK(has(slurp(d + "/n0.txt"), "round 1: node 0 of 2 (world size 2)"));
  std::filesystem::remove_all(d + "/ck" + std::to_string(third));  // it comes back with an empty folder
  again = start_in(h.ns(third), args + std::to_string(third), d + "/again.txt");
  int codes[3] = {0, 0, 0};
  codes[0] = finish(l[0], 90s);
  codes[3 - third] = finish(l[3 - third], 30s);
  codes[third] = finish(again, 30s);
  const std::string o0 = slurp(d + "/n0.txt"), oa = slurp(d + "/again.txt");
  INFO("node 0:\n" << o0 << "\nthe third node again:\n" << oa);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  CHECK(codes[2] == 0);
  CHECK(has(o0, "round 2: node 0 of 3 (world size 3)"));
  CHECK(has(o0, "\"world_size\":3"));  // the last round ran on three nodes
  CHECK(has(oa, "received the checkpoint of step"));
  CHECK(slurp(d + "/el.npz") == slurp(d + "/one.npz"));
  std::filesystem::remove_all(d);
}
