// Jobs that really span hosts. Two network namespaces joined by a veth pair are two hosts,
// each with its own address (10.231.N.1 and .2, only inside the namespaces); a phalanx-run
// in each (--nnodes 2, MASTER_ADDR = node 0's address, no PHALANX_HOSTNAME and no
// *_SOCKET_IFNAME): the conformance suite on 2 + 2 ranks, phalanx-train on 2 + 2 workers
// equal to one process, the interface overrides and the loopback error. The namespaces
// (names with this pid) are removed by a destructor, also when a check fails, and leftovers
// of a killed run are swept at the start. Without root or `ip` those cases say SKIPPED and
// why. The address rule itself (parallel/rendezvous/src/advertise_address.hpp) is tested without
// namespaces.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "../../parallel/rendezvous/src/advertise_address.hpp"
#include "launcher/node_rank.hpp"
#include "tools/trainer_harness.hpp"

using namespace phalanx;
using namespace std::chrono_literals;
using parallel::AdvertiseInputs;
using parallel::advertise_address;

namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) { return trainer_test::slurp(path); }

/// Sets (or, with nullptr, unsets) an environment variable for the scope.
struct ScopedEnv {
  std::string name;
  bool had = false;
  std::string old;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) had = true, old = o;
    if (v) ::setenv(n, v, 1);
    else ::unsetenv(n);
  }
  ~ScopedEnv() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

/// No address variable from the caller's environment leaks into a case.
struct CleanAddressEnv {
  ScopedEnv a{"PHALANX_HOSTNAME", nullptr}, b{"PHALANX_SOCKET_IFNAME", nullptr}, c{"GLOO_SOCKET_IFNAME", nullptr};
};

std::string error_of(const AdvertiseInputs& in) {
  try {
    const std::string a = advertise_address(in);
    return "no error (advertises " + a + ")";
  } catch (const ConfigError& e) {
    return e.what();
  }
}

/// Runs a shell command quietly; true when it exits 0. Its stderr goes to `err` when given.
bool sh(const std::string& cmd, std::string* err = nullptr) {
  const std::string errfile = "/tmp/phalanx_netns_err_" + std::to_string(::getpid());
  const int st = std::system((cmd + " >/dev/null 2>" + errfile).c_str());
  if (err) *err = slurp(errfile);
  std::remove(errfile.c_str());
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

/// Namespaces and veths of runs that were killed before their destructor ran (names carry
/// the pid of the test that made them; that process is gone).
void sweep_leftovers() {
  const std::string list = "/tmp/phalanx_netns_list_" + std::to_string(::getpid());
  std::system(("ip netns list > " + list + " 2>/dev/null").c_str());
  std::ifstream f(list);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("phxns", 0) != 0) continue;
    const std::string name = line.substr(0, line.find(' '));
    const pid_t pid = std::atoi(name.c_str() + 5);
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) sh("ip netns del " + name);
  }
  std::remove(list.c_str());
}

/// Two hosts: network namespaces <tag>a and <tag>b joined by a veth pair whose ends are
/// both called phxnet0 inside them, with 10.231.N.1/24 and 10.231.N.2/24; loopback up.
class TwoHosts {
 public:
  TwoHosts() {
    static int count = 0;
    const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(count++);
    ns_[0] = "phxns" + tag + "a";
    ns_[1] = "phxns" + tag + "b";
    veth_[0] = "vp" + tag + "a";  // at most 15 characters
    veth_[1] = "vp" + tag + "b";
    const std::string net = "10.231." + std::to_string(::getpid() % 200 + 1);
    addr_[0] = net + ".1";
    addr_[1] = net + ".2";
    const std::string net6 = "fd00:231:" + std::to_string(::getpid() % 200 + 1);
    addr6_[0] = net6 + "::1";
    addr6_[1] = net6 + "::2";
    if (::geteuid() != 0) {
      reason_ = "not root: making network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)";
      return;
    }
    if (!sh("command -v ip")) {
      reason_ = "no `ip` command (iproute2) on PATH";
      return;
    }
    sweep_leftovers();
    const std::vector<std::string> steps = {
        "ip netns add " + ns_[0],
        "ip netns add " + ns_[1],
        "ip link add " + veth_[0] + " type veth peer name " + veth_[1],
        "ip link set " + veth_[0] + " netns " + ns_[0],
        "ip link set " + veth_[1] + " netns " + ns_[1],
        "ip -n " + ns_[0] + " link set " + veth_[0] + " name phxnet0",
        "ip -n " + ns_[1] + " link set " + veth_[1] + " name phxnet0",
        "ip -n " + ns_[0] + " addr add " + addr_[0] + "/24 dev phxnet0",
        "ip -n " + ns_[1] + " addr add " + addr_[1] + "/24 dev phxnet0",
        "ip -n " + ns_[0] + " link set phxnet0 up",
        "ip -n " + ns_[1] + " link set phxnet0 up",
        "ip -n " + ns_[0] + " link set lo up",
        "ip -n " + ns_[1] + " link set lo up",
    };
    for (const auto& s : steps) {
      std::string err;
      if (!sh(s, &err)) {
        reason_ = "cannot make network namespaces here (`" + s + "`: " + first_line(err) + ")";
        return;
      }
    }
    // IPv6 too where the kernel has it (nodad: usable at once, not "tentative").
    std::string err6;
    for (int i = 0; i < 2 && reason6_.empty(); ++i)
      if (!sh("ip -n " + ns_[i] + " addr add " + addr6_[i] + "/64 dev phxnet0 nodad", &err6))
        reason6_ = "no IPv6 in the namespaces (" + first_line(err6) + ")";
    // The veth comes up asynchronously: wait until node 1 reaches node 0's address.
    const auto deadline = Clock::now() + 5s;
    while (!reachable() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
    if (!reachable()) reason_ = "the veth pair between the namespaces does not carry traffic";
  }
  ~TwoHosts() {
    sh("ip netns del " + ns_[0]);
    sh("ip netns del " + ns_[1]);
    sh("ip link del " + veth_[0]);  // only when making the namespaces stopped half way
    sh("rm -rf /etc/netns/" + ns_[0] + " /etc/netns/" + ns_[1]);
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  bool ok() const { return reason_.empty(); }
  /// Host i's /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts over it).
  void set_hosts_file(int i, const std::string& text) const {
    sh("mkdir -p /etc/netns/" + ns_[i]);
    std::ofstream("/etc/netns/" + ns_[i] + "/hosts") << text;
  }
  const std::string& reason() const { return reason_; }
  const std::string& ns(int i) const { return ns_[i]; }
  const std::string& addr(int i) const { return addr_[i]; }
  const std::string& addr6(int i) const { return addr6_[i]; }
  const std::string& reason6() const { return reason6_; }

 private:
  /// Both ends of the veth have carrier (it comes up asynchronously).
  bool reachable() const {
    return sh("ip -n " + ns_[0] + " -o link show phxnet0 | grep -q LOWER_UP") &&
           sh("ip -n " + ns_[1] + " -o link show phxnet0 | grep -q LOWER_UP");
  }

  std::string ns_[2], veth_[2], addr_[2], addr6_[2], reason_, reason6_;
};

struct Launcher {
  pid_t pid = 0;
  std::string out;
};

/// phalanx-run `args` in namespace `ns`, its output in `out`: the job token set, no address
/// variable unless `extra_env` (VAR=value ...) names one.
Launcher start_in(const std::string& ns, const std::string& args, const std::string& out,
                  const std::string& extra_env = "") {
  Launcher l;
  l.out = out;
  const std::string cmd = "exec ip netns exec " + ns +
                          " env -u PHALANX_HOSTNAME -u PHALANX_SOCKET_IFNAME -u GLOO_SOCKET_IFNAME -u PHALANX_RDZV_SECRET"
                          " PHALANX_RDZV_TOKEN=netns-test-" +
                          std::to_string(::getpid()) + " PHALANX_TIMEOUT=30 " + extra_env + " " + PHALANX_RUN + " " +
                          args + " > " + out + " 2>&1";
  l.pid = ::fork();
  if (l.pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return l;
}

/// The launcher's exit code; -1 when it ran past the timeout (then it is killed, and its
/// workers die with it: PR_SET_PDEATHSIG).
int finish(const Launcher& l, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(l.pid, &status, WNOHANG) == l.pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (Clock::now() > deadline) {
      ::kill(l.pid, SIGKILL);
      ::waitpid(l.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
}

struct Job {
  int code[2] = {0, 0};
  std::string out[2];
  std::string both() const { return "node 0:\n" + out[0] + "node 1:\n" + out[1]; }
};

/// One job on both hosts: `nproc` workers each, MASTER_ADDR = node 0's address, node ranks
/// assigned by the store (node 0 is the launcher whose host has the address).
Job run_job(const TwoHosts& h, int nproc, const std::string& program, const std::string& extra_env0 = "",
            const std::string& extra_env1 = "", std::chrono::seconds timeout = 40s, bool ipv6 = false) {
  static int count = 0;
  const std::string stem = "/tmp/phalanx_netns_" + std::to_string(::getpid()) + "_" + std::to_string(count++);
  const std::string args = "--nnodes 2 --nproc-per-node " + std::to_string(nproc) + " --master-addr " + (ipv6 ? h.addr6(0) : h.addr(0)) +
                           " --master-port 29500 " + program;
  const Launcher l0 = start_in(h.ns(0), args, stem + "_node0.out", extra_env0);
  const Launcher l1 = start_in(h.ns(1), args, stem + "_node1.out", extra_env1);
  Job j;
  j.code[0] = finish(l0, timeout);
  j.code[1] = finish(l1, timeout);
  for (int i = 0; i < 2; ++i) {
    j.out[i] = slurp(i == 0 ? l0.out : l1.out);
    std::remove((i == 0 ? l0.out : l1.out).c_str());
  }
  return j;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

#define SKIP_WITHOUT_NAMESPACES(h)                             \
  if (!(h).ok()) {                                             \
    MESSAGE("SKIPPED: two network namespaces: " << (h).reason()); \
    return;                                                    \
  }

}  // namespace

// ---- the address rule, without namespaces ----

TEST_CASE("the address rule: loopback MASTER_ADDR, PHALANX_HOSTNAME, the interface overrides, their order") {
  CleanAddressEnv clean;
  const AdvertiseInputs local{"127.0.0.1", 29500, 4, 2};
  CHECK(advertise_address(local) == "127.0.0.1");
  CHECK(advertise_address({"localhost", 29500, 4, 2}) == "127.0.0.1");
  {
    // Everything on one host: loopback wins over every variable (nothing else could join).
    ScopedEnv h("PHALANX_HOSTNAME", "hostA"), i("PHALANX_SOCKET_IFNAME", "no-such-if");
    CHECK(advertise_address(local) == "127.0.0.1");
  }
  // A MASTER_ADDR that is not loopback (TEST-NET-2: never a real host; no packet is sent).
  const AdvertiseInputs remote{"198.51.100.7", 29500, 4, 2};
  {
    ScopedEnv h("PHALANX_HOSTNAME", "10.0.0.9"), i("PHALANX_SOCKET_IFNAME", "lo");
    CHECK(advertise_address(remote) == "10.0.0.9");  // PHALANX_HOSTNAME wins
  }
  {
    // The interface override; on one host (WORLD_SIZE = LOCAL_WORLD_SIZE) lo is fine.
    ScopedEnv i("PHALANX_SOCKET_IFNAME", "lo");
    CHECK(advertise_address({"198.51.100.7", 29500, 2, 2}) == "127.0.0.1");
    CHECK(advertise_address({"2001:db8::7", 29500, 2, 2}) == (parallel::interface_address("lo", true) == "::1" ? "::1" : "127.0.0.1"));
  }
  {
    ScopedEnv g("GLOO_SOCKET_IFNAME", "lo,eth-unused");  // PyTorch's list: its first name
    CHECK(advertise_address({"198.51.100.7", 29500, 2, 2}) == "127.0.0.1");
  }
  {
    ScopedEnv p("PHALANX_SOCKET_IFNAME", "lo"), g("GLOO_SOCKET_IFNAME", "no-such-if");
    CHECK(advertise_address({"198.51.100.7", 29500, 2, 2}) == "127.0.0.1");  // PHALANX_ before GLOO_
  }
}

TEST_CASE("the interface of the route to MASTER_ADDR, IPv4 and IPv6 (UDP connect + getsockname)") {
  CHECK(parallel::route_source_address("127.0.0.1", 29500) == "127.0.0.1");
  CHECK(parallel::route_source_address("no-such-host.invalid", 29500).empty());
  CHECK(parallel::interface_address("lo", false) == "127.0.0.1");
  CHECK(parallel::interface_address("no-such-if", false).empty());
  const auto names = parallel::interface_names();
  CHECK(std::find(names.begin(), names.end(), "lo") != names.end());
  if (parallel::interface_address("lo", true) == "::1") CHECK(parallel::route_source_address("::1", 29500) == "::1");
  // Every non-loopback address of this host routes to itself, and is what a job whose
  // MASTER_ADDR it is advertises (when this host has one).
  for (const auto& n : names) {
    for (bool v6 : {false, true}) {
      const std::string a = parallel::interface_address(n, v6);
      if (a.empty() || parallel::is_loopback_address(a) || a.find('%') != std::string::npos) continue;
      CAPTURE(n);
      CAPTURE(a);
      CHECK(parallel::route_source_address(a, 29500) == a);
      CleanAddressEnv clean;
      CHECK(advertise_address({a, 29500, 4, 2}) == a);
    }
  }
  CHECK(parallel::is_loopback_address("[::1]"));
  CHECK(parallel::is_loopback_address("::ffff:127.0.0.1"));
  CHECK(parallel::is_loopback_address("127.0.1.1"));
  CHECK_FALSE(parallel::is_loopback_address("10.0.0.1"));
  CHECK_FALSE(parallel::is_loopback_address("::2"));
}

TEST_CASE("errors: a missing interface names the ones that exist; loopback on a job that spans hosts says what to set") {
  CleanAddressEnv clean;
  const AdvertiseInputs remote{"198.51.100.7", 29500, 4, 2};
  {
    ScopedEnv i("PHALANX_SOCKET_IFNAME", "nosuch0");
    const std::string e = error_of(remote);
    CHECK(has(e, "PHALANX_SOCKET_IFNAME=nosuch0: this host has no network interface 'nosuch0' (its interfaces: lo"));
    CHECK(has(e, "set PHALANX_SOCKET_IFNAME to the one the other hosts reach"));
    CHECK(e.find('\n') == std::string::npos);
  }
  {
    ScopedEnv g("GLOO_SOCKET_IFNAME", "nosuch0");
    CHECK(has(error_of(remote), "GLOO_SOCKET_IFNAME=nosuch0: this host has no network interface 'nosuch0'"));
  }
  for (const char* var : {"PHALANX_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    ScopedEnv i(var, "lo");
    const std::string e = error_of(remote);
    CAPTURE(e);
    CHECK(has(e, std::string(var) + "=lo gives the loopback address 127.0.0.1, but this job spans hosts (WORLD_SIZE 4, "
                                     "LOCAL_WORLD_SIZE 2, MASTER_ADDR 198.51.100.7)"));
    CHECK(has(e, std::string("set ") + var + " to the interface they reach"));
    CHECK(e.find('\n') == std::string::npos);
  }
  {
    ScopedEnv h("PHALANX_HOSTNAME", "127.0.0.1");
    const std::string e = error_of(remote);
    CHECK(has(e, "PHALANX_HOSTNAME=127.0.0.1 is a loopback address here, but this job spans hosts (WORLD_SIZE 4, "
                 "LOCAL_WORLD_SIZE 2, MASTER_ADDR 198.51.100.7): the other hosts could not reach this rank; set "
                 "PHALANX_HOSTNAME to this host's network address"));
    CHECK(e.find('\n') == std::string::npos);
    CHECK(advertise_address({"198.51.100.7", 29500, 2, 2}) == "127.0.0.1");  // one host: as given
  }
  // No route to MASTER_ADDR: the host's name, and when that is loopback on a job that spans
  // hosts, the error names both variables.
  addrinfo* res = nullptr;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  bool name_is_loopback = false;
  if (::getaddrinfo(host, nullptr, nullptr, &res) == 0 && res) {
    sockaddr_in* in4 = reinterpret_cast<sockaddr_in*>(res->ai_addr);
    name_is_loopback = res->ai_family == AF_INET && (ntohl(in4->sin_addr.s_addr) >> 24) == 127;
    ::freeaddrinfo(res);
  }
  const AdvertiseInputs unroutable{"no-such-host.invalid", 29500, 4, 2};
  if (name_is_loopback) {
    const std::string e = error_of(unroutable);
    CHECK(has(e, "this job spans hosts (WORLD_SIZE 4, LOCAL_WORLD_SIZE 2, MASTER_ADDR no-such-host.invalid), but this "
                 "rank would advertise the loopback address " +
                     std::string(host)));
    CHECK(has(e, "set PHALANX_SOCKET_IFNAME to the interface they reach"));
    CHECK(has(e, "or PHALANX_HOSTNAME to this host's address"));
    CHECK(advertise_address({"no-such-host.invalid", 29500, 2, 2}) == host);  // one host: no error
  } else {
    CHECK(advertise_address(unroutable) == host);
  }
}

TEST_CASE("phalanx-run's note: a master address that is a name resolving to loopback here") {
  CHECK(launcher::loopback_endpoint_note("127.0.0.1").empty());  // addresses are meant as written
  CHECK(launcher::loopback_endpoint_note("127.0.1.1").empty());
  CHECK(launcher::loopback_endpoint_note("::1").empty());
  CHECK(launcher::loopback_endpoint_note("localhost").empty());
  CHECK(launcher::loopback_endpoint_note("no-such-host.invalid").empty());
  CHECK(launcher::loopback_endpoint_note("10.0.0.1").empty());
}

// ---- two hosts ----

TEST_CASE("two hosts, no address variable: every rank advertises its host's address; the conformance suite passes on 2 + 2 (auto: hierarchical; gloo)") {
  TwoHosts h;
  SKIP_WITHOUT_NAMESPACES(h);
  const auto t0 = Clock::now();
  const Job j = run_job(h, 2, NETNS_WORKER);
  INFO(j.both());
  CHECK(j.code[0] == 0);
  CHECK(j.code[1] == 0);
  CHECK(has(j.out[0], "node 0 of 2 (hosts the job's store on " + h.addr(0) + ":29500)"));
  CHECK(has(j.out[1], "node 1 of 2"));
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const int node = r / 2;
    CHECK(has(j.out[node], "[" + std::to_string(r) + "] rank " + std::to_string(r) + " of 4 advertises " + h.addr(node)));
    CHECK(has(j.out[node], "[" + std::to_string(r) + "] rank " + std::to_string(r) + " conformance ok"));
  }
  // auto: two hosts make the hierarchical group (within each host, then between the hosts' leaders).
  CHECK(has(j.out[1], "[2] rank 2 conformance ok on hierarchical"));
  // The flat Gloo mesh across the hosts.
  const Job g = run_job(h, 2, NETNS_WORKER, "PHALANX_BACKEND=gloo", "PHALANX_BACKEND=gloo");
  INFO(g.both());
  CHECK(g.code[0] == 0);
  CHECK(g.code[1] == 0);
  for (int r = 0; r < 4; ++r)
    CHECK(has(g.out[r / 2], "[" + std::to_string(r) + "] rank " + std::to_string(r) + " conformance ok on gloo"));
  MESSAGE("conformance on two hosts (2 + 2 ranks), auto and gloo: "
          << std::chrono::duration<double>(Clock::now() - t0).count() << " s");
}

TEST_CASE("two hosts over IPv6: MASTER_ADDR = node 0's IPv6 address, every rank advertises its host's IPv6 address") {
  TwoHosts h;
  SKIP_WITHOUT_NAMESPACES(h);
  if (!h.reason6().empty()) {
    MESSAGE("SKIPPED: " << h.reason6());
    return;
  }
  const Job j = run_job(h, 1, std::string(NETNS_WORKER) + " quick", "", "", 40s, true);
  INFO(j.both());
  CHECK(j.code[0] == 0);
  CHECK(j.code[1] == 0);
  CHECK(has(j.out[0], "[0] rank 0 of 2 advertises " + h.addr6(0)));
  CHECK(has(j.out[1], "[1] rank 1 of 2 advertises " + h.addr6(1)));
  CHECK(has(j.out[1], "[1] rank 1 allreduce ok"));
  // The interface override takes MASTER_ADDR's family, the global address before the link-local one.
  const Job k = run_job(h, 1, std::string(NETNS_WORKER) + " quick", "PHALANX_SOCKET_IFNAME=phxnet0",
                        "GLOO_SOCKET_IFNAME=phxnet0", 40s, true);
  INFO(k.both());
  CHECK(k.code[0] == 0);
  CHECK(k.code[1] == 0);
  CHECK(has(k.out[0], "[0] rank 0 of 2 advertises " + h.addr6(0)));
  CHECK(has(k.out[1], "[1] rank 1 of 2 advertises " + h.addr6(1)));
}

TEST_CASE("two hosts: GLOO_SOCKET_IFNAME / PHALANX_SOCKET_IFNAME pick the interface; lo fails at once saying what to set") {
  TwoHosts h;
  SKIP_WITHOUT_NAMESPACES(h);
  const std::string quick = std::string(NETNS_WORKER) + " quick";
  Job j = run_job(h, 1, quick, "GLOO_SOCKET_IFNAME=phxnet0", "PHALANX_SOCKET_IFNAME=phxnet0");
  INFO(j.both());
  CHECK(j.code[0] == 0);
  CHECK(j.code[1] == 0);
  CHECK(has(j.out[0], "[0] rank 0 of 2 advertises " + h.addr(0)));
  CHECK(has(j.out[1], "[1] rank 1 of 2 advertises " + h.addr(1)));
  CHECK(has(j.out[1], "[1] rank 1 allreduce ok"));
  // PHALANX_HOSTNAME wins over an interface override.
  j = run_job(h, 1, quick, "PHALANX_HOSTNAME=" + h.addr(0) + " PHALANX_SOCKET_IFNAME=lo",
              "PHALANX_HOSTNAME=" + h.addr(1) + " PHALANX_SOCKET_IFNAME=lo");
  INFO(j.both());
  CHECK(j.code[0] == 0);
  CHECK(j.code[1] == 0);
  CHECK(has(j.out[1], "[1] rank 1 allreduce ok"));
  // lo on a job that spans hosts: one line at rendezvous, every node ends, no timeout.
  const auto t0 = Clock::now();
  j = run_job(h, 1, quick, "", "PHALANX_SOCKET_IFNAME=lo");
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(j.both());
  CHECK(j.code[0] != 0);
  CHECK(j.code[1] != 0);
  CHECK(has(j.out[1], "PHALANX_SOCKET_IFNAME=lo gives the loopback address 127.0.0.1, but this job spans hosts "
                      "(WORLD_SIZE 2, LOCAL_WORLD_SIZE 1, MASTER_ADDR " +
                          h.addr(0) + "): the other hosts could not reach this rank; set PHALANX_SOCKET_IFNAME to the "
                                      "interface they reach (this host has: lo, phxnet0)"));
  CHECK(took < 20);  // PHALANX_TIMEOUT is 30 s: the job did not wait for it
  // PHALANX_HOSTNAME set to loopback by hand: the same, naming the address to give instead.
  j = run_job(h, 1, quick, "", "PHALANX_HOSTNAME=127.0.0.1");
  INFO(j.both());
  CHECK(j.code[1] != 0);
  CHECK(has(j.out[1], "PHALANX_HOSTNAME=127.0.0.1 is a loopback address here, but this job spans hosts (WORLD_SIZE 2, "
                      "LOCAL_WORLD_SIZE 1, MASTER_ADDR " +
                          h.addr(0) + "): the other hosts could not reach this rank; set PHALANX_HOSTNAME to this "
                                      "host's network address (the one that routes to MASTER_ADDR is " +
                          h.addr(1) + "), or unset it"));
  // An interface this host does not have.
  j = run_job(h, 1, quick, "GLOO_SOCKET_IFNAME=eth7", "");
  INFO(j.both());
  CHECK(j.code[0] != 0);
  CHECK(has(j.out[0], "GLOO_SOCKET_IFNAME=eth7: this host has no network interface 'eth7' (its interfaces: lo, phxnet0)"));
}

/// What advertise_address() gives (or its error) inside network namespace `ns`, with
/// PHALANX_SOCKET_IFNAME=`ifname`: a forked child enters the namespace (setns).
std::string advertised_in(const std::string& ns, const std::string& ifname, const AdvertiseInputs& in) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    const int nsfd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || ::setns(nsfd, CLONE_NEWNET) != 0) {
      out = "cannot enter " + ns;
    } else {
      ::setenv("PHALANX_SOCKET_IFNAME", ifname.c_str(), 1);
      ::unsetenv("PHALANX_HOSTNAME");
      out = error_of(in);
    }
    const ssize_t n = ::write(fds[1], out.data(), out.size());
    ::_exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

TEST_CASE("an interface override: of its several addresses the one routing to MASTER_ADDR; down or no carrier is an error") {
  TwoHosts h;
  SKIP_WITHOUT_NAMESPACES(h);
  // A second subnet on node 0's interface: MASTER_ADDR there must get node 0's address there
  // (the first address would be the wrong subnet), MASTER_ADDR in the first one the first.
  const std::string net2 = "10.232." + std::to_string(::getpid() % 200 + 1);
  REQUIRE(sh("ip -n " + h.ns(0) + " addr add " + net2 + ".1/24 dev phxnet0"));
  CHECK(advertised_in(h.ns(0), "phxnet0", {net2 + ".2", 29500, 4, 2}) == "no error (advertises " + net2 + ".1)");
  CHECK(advertised_in(h.ns(0), "phxnet0", {h.addr(1), 29500, 4, 2}) == "no error (advertises " + h.addr(0) + ")");
  // The far end of the veth down: no carrier here.
  REQUIRE(sh("ip -n " + h.ns(1) + " link set phxnet0 down"));
  std::string e = advertised_in(h.ns(0), "phxnet0", {h.addr(1), 29500, 4, 2});
  CHECK(has(e, "PHALANX_SOCKET_IFNAME=phxnet0: interface 'phxnet0' is up but has no carrier"));
  CHECK(has(e, "set PHALANX_SOCKET_IFNAME to the interface they reach (this host has: lo, phxnet0)"));
  // Down here (its addresses stay listed by getifaddrs).
  REQUIRE(sh("ip -n " + h.ns(0) + " link set phxnet0 down"));
  e = advertised_in(h.ns(0), "phxnet0", {h.addr(1), 29500, 4, 2});
  CHECK(has(e, "PHALANX_SOCKET_IFNAME=phxnet0: interface 'phxnet0' is down (ip link set phxnet0 up)"));
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("two hosts: node 0's hostname maps to 127.0.1.1 in its /etc/hosts (as in many containers): its launcher says so") {
  TwoHosts h;
  SKIP_WITHOUT_NAMESPACES(h);
  h.set_hosts_file(0, "127.0.0.1 localhost\n127.0.1.1 phxnode0\n");
  h.set_hosts_file(1, "127.0.0.1 localhost\n" + h.addr(0) + " phxnode0\n");
  const std::string out0 = "/tmp/phalanx_netns_note0_" + std::to_string(::getpid());
  const std::string out1 = "/tmp/phalanx_netns_note1_" + std::to_string(::getpid());
  const std::string args = "--nnodes 2 --nproc-per-node 1 --master-addr phxnode0 --master-port 29500 --rdzv-timeout 2 "
                           "--timeout 3 " + std::string(NETNS_WORKER) + " quick";
  const Launcher l0 = start_in(h.ns(0), args, out0), l1 = start_in(h.ns(1), args, out1);
  const int code1 = finish(l1, 20s);  // node 0's store is on loopback: node 1 never reaches it
  ::kill(l0.pid, SIGTERM);
  finish(l0, 20s);
  const std::string o0 = slurp(out0), o1 = slurp(out1);
  std::remove(out0.c_str());
  std::remove(out1.c_str());
  INFO("node 0:\n" << o0 << "node 1:\n" << o1);
  CHECK(has(o0, "phalanx-run: note: the master address phxnode0 resolves to the loopback address 127.0.1.1 on this "
                "machine, so the job's store listens on loopback only and launchers on other hosts cannot reach it: "
                "give node 0's network address (--master-addr or --rdzv-endpoint) unless every node runs on this machine"));
  CHECK(code1 != 0);
  CHECK_FALSE(has(o1, "note: the master address"));  // node 1 resolves it to node 0's address
}

TEST_CASE("two hosts: phalanx-train on 2 + 2 workers, no address variable, equals one process") {
  TwoHosts h;
  SKIP_WITHOUT_NAMESPACES(h);
  const std::string d = trainer_test::case_study_dir("phalanx_netns");
  const std::string data = " --train-x " + d + "/x.npy --train-y " + d + "/y.npy --init " + d +
                           "/init.npz --global-batch 64 --lr 0.1 --momentum 0.9 --epochs 2 --shuffle --seed 5";
  const auto one_process = [&](const std::string& args, const std::string& save) {
    const trainer_test::Result r = trainer_test::run_command(std::string(PHALANX_TRAIN) + args + " --save " + save,
                                                             d + "/one.txt");
    INFO(r.out);
    REQUIRE(r.code == 0);
  };
  // Exact mode: the same bytes on any number of workers.
  const std::string exact = data + " --exact --micro-batch 16";
  one_process(exact, d + "/exact1.npz");
  Job j = run_job(h, 2, std::string(PHALANX_TRAIN) + exact + " --save " + d + "/exact4.npz");
  INFO(j.both());
  REQUIRE(j.code[0] == 0);
  REQUIRE(j.code[1] == 0);
  CHECK(has(j.out[0], "\"world_size\":4"));
  CHECK(has(j.out[0], "4 worker(s) on hierarchical"));  // auto on two hosts
  CHECK(slurp(d + "/exact4.npz") == slurp(d + "/exact1.npz"));
  // The same on the flat Gloo mesh across the hosts.
  j = run_job(h, 2, std::string(PHALANX_TRAIN) + exact + " --save " + d + "/exact4g.npz", "PHALANX_BACKEND=gloo",
              "PHALANX_BACKEND=gloo");
  INFO(j.both());
  REQUIRE(j.code[0] == 0);
  REQUIRE(j.code[1] == 0);
  CHECK(has(j.out[0], "4 worker(s) on gloo"));
  CHECK(slurp(d + "/exact4g.npz") == slurp(d + "/exact1.npz"));
  // Normal DDP: equal up to the order of the float sums.
  one_process(data, d + "/normal1.npz");
  j = run_job(h, 2, std::string(PHALANX_TRAIN) + data + " --save " + d + "/normal4.npz");
  INFO(j.both());
  REQUIRE(j.code[0] == 0);
  REQUIRE(j.code[1] == 0);
  CHECK(trainer_test::max_weight_diff(d + "/normal1.npz", d + "/normal4.npz") < 1e-4);
  std::system(("rm -rf " + d).c_str());
}

TEST_CASE("two pods as a PyTorchJob runs them: one command, MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK or PET_*") {
  TwoHosts h;
  SKIP_WITHOUT_NAMESPACES(h);
  const std::string d = trainer_test::case_study_dir("phalanx_pods");
  const std::string train = std::string(PHALANX_TRAIN) + " --train-x " + d + "/x.npy --train-y " + d +
                            "/y.npy --init " + d + "/init.npz --global-batch 64 --lr 0.1 --epochs 2 --exact --micro-batch 16";
  const trainer_test::Result one = trainer_test::run_command(train + " --save " + d + "/one.npz", d + "/one.txt");
  INFO(one.out);
  REQUIRE(one.code == 0);
  // Each pod sees only the operator's variables (and the job token): the same command line.
  const auto run_pods = [&](const std::string& args, auto env_of, const std::string& save) {
    Launcher l[2];
    for (int i = 0; i < 2; ++i)
      l[i] = start_in(h.ns(i), args + " " + train + " --save " + save, d + "/pod" + std::to_string(i) + ".out",
                      env_of(i));
    Job j;
    for (int i = 0; i < 2; ++i) {
      j.code[i] = finish(l[i], 40s);
      j.out[i] = slurp(l[i].out);
    }
    return j;
  };
  Job j = run_pods("--nproc-per-node 2", [&](int i) {
    return "MASTER_ADDR=" + h.addr(0) + " MASTER_PORT=29501 WORLD_SIZE=2 RANK=" + std::to_string(i);
  }, d + "/pods.npz");
  INFO(j.both());
  REQUIRE(j.code[0] == 0);
  REQUIRE(j.code[1] == 0);
  CHECK(has(j.out[1], "node 1 of 2 from RANK and WORLD_SIZE (a PyTorchJob pod)"));
  CHECK(has(j.out[0], "\"world_size\":4"));
  CHECK(slurp(d + "/pods.npz") == slurp(d + "/one.npz"));  // exact mode: the same bytes
  // torchrun's own environment forms, as the training operator sets them for torchrun.
  j = run_pods("", [&](int i) {
    return "PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=" + std::to_string(i) + " PET_MASTER_ADDR=" + h.addr(0) +
           " PET_MASTER_PORT=29502";
  }, d + "/pet.npz");
  INFO(j.both());
  REQUIRE(j.code[0] == 0);
  REQUIRE(j.code[1] == 0);
  CHECK(has(j.out[0], "\"world_size\":4"));
  CHECK(slurp(d + "/pet.npz") == slurp(d + "/one.npz"));
  std::system(("rm -rf " + d).c_str());
}
