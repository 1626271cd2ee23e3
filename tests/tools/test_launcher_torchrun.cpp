// phalanx-run spoken as torchrun: --standalone, --rdzv_endpoint/--rdzv_id/--rdzv_backend,
// --nnodes N:N, the underscore spellings; node ranks assigned by the job's store when
// --node_rank is not given (and a launcher too many refused); the job token derived from
// --rdzv-id (SHA-256 and HMAC-SHA256 against their published test vectors); what is
// refused, and how.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "launcher/launch_options.hpp"
#include "launcher/node_rank.hpp"
#include "phalanx/parallel/internal/rdzv_token.hpp"
#include "tools/launcher_harness.hpp"

using namespace launcher_harness;
using namespace phalanx::launcher;
using namespace phalanx::parallel;

namespace {

int free_port() {
  phalanx::TcpStoreServer probe(phalanx::TcpStoreOptions{});
  return probe.port();
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("SHA-256 and HMAC-SHA256 match FIPS 180-4 and RFC 4231") {
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");  // 56 bytes: two padding blocks
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // RFC 4231 test cases 1, 2 and 6 (a key longer than the block is hashed first).
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("the token from --rdzv-id: the same id and secret give the same token, any difference another") {
  const std::string t = derive_rdzv_token("J", "");
  CHECK(t.size() == 64);
  CHECK(t == derive_rdzv_token("J", ""));
  CHECK(t == to_hex(hmac_sha256("", "phalanx-rdzv-v1:J")));  // as documented in docs/launcher.md
  CHECK(t != derive_rdzv_token("J2", ""));
  CHECK(t != derive_rdzv_token("J", "secret"));
  CHECK(derive_rdzv_token("J", "secret") != derive_rdzv_token("J", "secreT"));
  CHECK(derive_rdzv_token("J", "secret") == derive_rdzv_token("J", "secret"));
}

TEST_CASE("--rdzv-endpoint HOST[:PORT]: torchrun's default port, IPv6 in brackets, bad input refused") {
  std::string host, error;
  int port = 0;
  CHECK(parse_endpoint("10.0.0.1:29500", host, port, error));
  CHECK(host == "10.0.0.1");
  CHECK(port == 29500);
  CHECK(parse_endpoint("node0.cluster", host, port, error));
  CHECK(host == "node0.cluster");
  CHECK(port == 29400);
  CHECK(parse_endpoint("[::1]:1234", host, port, error));
  CHECK(host == "::1");
  CHECK(port == 1234);
  CHECK(parse_endpoint("[fe80::1]", host, port, error));
  CHECK(host == "fe80::1");
  CHECK(port == 29400);
  CHECK(parse_endpoint("host:0", host, port, error));  // a free port: one node only (parse_options)
  CHECK(port == 0);
  for (const char* bad : {"", ":29400", "host:", "host:-1", "host:65536", "host:12ab", "::1", "[::1", "[::1]x", "[::1]:"}) {
    INFO(bad);
    error.clear();
    CHECK_FALSE(parse_endpoint(bad, host, port, error));
    CHECK(contains(error, "--rdzv-endpoint"));
  }
}

TEST_CASE("without --node-rank: who hosts (the endpoint bound here), and node ranks in arrival order") {
  const int port = free_port();
  std::string error;
  CHECK(probe_endpoint("127.0.0.1", port, error) == EndpointBind::kFree);
  {
    phalanx::TcpStoreOptions so;
    so.port = port;
    phalanx::TcpStoreServer holder(so);  // another launcher hosts already
    CHECK(probe_endpoint("127.0.0.1", port, error) == EndpointBind::kInUse);
  }
  CHECK(probe_endpoint("127.0.0.1", port, error) == EndpointBind::kFree);  // the probe let go of it
  // 192.0.2.1 (TEST-NET-1) is no address of this machine: connect to it, do not host.
  CHECK(probe_endpoint("192.0.2.1", port, error) == EndpointBind::kNotLocal);

  phalanx::MemoryStore store;
  CHECK(claim_node_rank(store, 3) == 1);
  CHECK(claim_node_rank(store, 3) == 2);
  CHECK(claim_node_rank(store, 3) == -1);  // node 0 (the host) and two others: full
  CHECK(claim_node_rank(store, 3) == -1);
}

TEST_CASE("phalanx-run --standalone --nproc_per_node=2 runs a job with a fresh token") {
  const std::string dir = make_dir();
  // A token in the environment is not used: --standalone makes a fresh one (32 hex digits).
  Launch l = start({"--standalone", "--nproc_per_node=2", "--max_restarts=0", kWorker, "env", dir}, dir,
                   {{"PHALANX_RDZV_TOKEN", "stale"}});
  CHECK(finish(l) == 0);
  INFO(slurp(l.out));
  for (int r = 0; r < 2; ++r) {
    auto e = read_env(dir + "/env_" + std::to_string(r));
    CHECK(e["RANK"] == std::to_string(r));
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["TOKEN_LEN"] == "32");
  }
}

TEST_CASE("two launchers with torchrun's spellings: --nnodes=2 --node_rank --rdzv_id --rdzv_endpoint") {
  const int port = free_port();
  const std::string dir = make_dir(), out1 = make_dir();
  auto args = [&](int node) {
    return std::vector<std::string>{"--nnodes=" + std::string(node == 0 ? "2" : "2:2"),  // N:N is N
                                    "--nproc_per_node=2",
                                    "--node_rank=" + std::to_string(node),
                                    "--rdzv_id=J",
                                    "--rdzv_backend=c10d",
                                    "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                    kWorker,
                                    "env",
                                    dir};
  };
  const std::vector<std::pair<std::string, std::string>> env = {{"PHALANX_RDZV_SECRET", "s3cret"}};
  Launch n1 = start(args(1), out1, env);  // node 1 may start first
  Launch n0 = start(args(0), dir, env);
  CHECK(finish(n0) == 0);
  CHECK(finish(n1) == 0);
  const std::string both = slurp(n0.out) + slurp(n1.out);
  INFO(both);
  for (int r = 0; r < 4; ++r) {
    auto e = read_env(dir + "/env_" + std::to_string(r));
    CHECK(e["RANK"] == std::to_string(r));
    CHECK(e["WORLD_SIZE"] == "4");
    CHECK(e["MASTER_PORT"] == std::to_string(port));
    CHECK(e["TOKEN_LEN"] == "64");
  }
  CHECK_FALSE(contains(slurp(n0.out), "PHALANX_RDZV_SECRET is not set"));  // a secret was given
}

TEST_CASE("two launchers with different --rdzv_id refuse each other, each saying so") {
  const int port = free_port();
  const std::string d0 = make_dir(), d1 = make_dir();
  auto args = [&](int node, const std::string& id) {
    return std::vector<std::string>{"--nnodes=2", "--node_rank=" + std::to_string(node), "--rdzv_id=" + id,
                                    "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--timeout=3",
                                    "--rdzv_timeout=2", kWorker, "env", d0};
  };
  Launch n0 = start(args(0, "J"), d0);
  Launch n1 = start(args(1, "J2"), d1);
  CHECK(finish(n1, 30s) == 2);
  CHECK(finish(n0, 60s) != 0);  // its job never forms: its worker times out, node 1 never appears
  const std::string o0 = slurp(n0.out), o1 = slurp(n1.out);
  const std::string both = o0 + o1;
  INFO(both);
  CHECK(contains(o1, "belongs to another job"));
  CHECK(contains(o1, "--rdzv-id (this node's: 'J2')"));
  CHECK(contains(o0, "refused a launcher or worker with another job token"));
  CHECK(contains(o0, "different --rdzv-id (this node's: 'J')"));
  CHECK(contains(o0, "PHALANX_RDZV_SECRET is not set"));  // the id alone is not a secret, and it says so
  CHECK(worker_pids(d0, 2).size() == 1);                   // node 1 started no worker
}

TEST_CASE("torchrun options phalanx-run cannot honour are refused before anything starts") {
  const std::string dir = make_dir();
  const std::string ep = "--rdzv_endpoint=127.0.0.1:" + std::to_string(free_port());
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--rdzv_backend=etcd"}, "--rdzv-backend 'etcd' is not supported"},
      {{"--nnodes=1:4", "--node_rank=1", "--rdzv_id=J", ep}, "is elastic: node ranks change"},
      {{"--nnodes=4:1"}, "MIN:MAX with 1 <= MIN <= MAX"},
      {{"--standalone", "--nnodes=2"}, "drop --nnodes 2"},
      {{"--standalone", ep}, "drop --rdzv-endpoint"},
      {{"--standalone", "--rdzv_id=J"}, "drop --rdzv-id"},
      {{"--nproc_per_node=gpu"}, "does not count devices"},
      {{"--rdzv_id=J", "--rdzv-token=t"}, "either --rdzv-id"},
      {{ep, "--master_port=1234"}, "either --rdzv-endpoint"},
      {{"--nnodes=2", "--rdzv_id=J", "--rdzv_endpoint=127.0.0.1:0"}, "port 0 (a free port) works for a single node only"},
      {{"--nnodes=2", "--rdzv_id=J", "--master_port=0"}, "--master-port is required"},
      {{"--nnodes=2", "--node_rank=1", ep}, "pass --rdzv-id JOB"},
      {{"--tee=3"}, "--tee is not supported"},
      {{"-m", "mod"}, "python3 -m MODULE"},
      {{"--rdzv_id=" + std::string(1025, 'j')}, "--rdzv-id must be 1 to 1024 characters"},
      {{"--rdzv_id=a\tb"}, "must not contain control characters"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> a = c.args;
    a.insert(a.end(), {kWorker, "env", dir});
    const std::string d = make_dir();
    INFO(c.says);
    Launch l = start(a, d);
    CHECK(finish(l, 20s) == 2);
    CHECK(contains(slurp(l.out), c.says));
  }
  CHECK(worker_pids(dir, 1).empty());
  // Accepted as torchrun users type them: cpu/auto workers, --no_python, --rdzv_backend=static.
  Launch ok = start({"--nproc_per_node=cpu", "--no_python", "--rdzv_backend=static", "/bin/true"}, dir);
  CHECK(finish(ok) == 0);
}

TEST_CASE("a single node: --rdzv_id without a secret gets a random token, HOST:0 a free port") {
  const std::string d0 = make_dir(), d1 = make_dir();
  // Without PHALANX_RDZV_SECRET the id is guessable: a fresh random token (32 hex digits).
  Launch l = start({"--rdzv_id=J", "--rdzv_endpoint=127.0.0.1:0", "--nproc_per_node=2", kWorker, "env", d0}, d0,
                   {{"PHALANX_RDZV_TOKEN", "stale"}});
  CHECK(finish(l) == 0);
  INFO(slurp(l.out));
  for (int r = 0; r < 2; ++r) {
    auto e = read_env(d0 + "/env_" + std::to_string(r));
    CHECK(e["TOKEN_LEN"] == "32");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(std::atoi(e["MASTER_PORT"].c_str()) > 0);
  }
  // With a secret the token is the derived one (64 hex digits), as on several nodes.
  Launch s = start({"--rdzv_id=J", "--rdzv_endpoint=127.0.0.1:0", kWorker, "env", d1}, d1,
                   {{"PHALANX_RDZV_SECRET", "s3cret"}});
  CHECK(finish(s) == 0);
  CHECK(read_env(d1 + "/env_0")["TOKEN_LEN"] == "64");
}

TEST_CASE("the bar's spelling: --nnodes=2 --rdzv_id=J --rdzv_endpoint=HOST:PORT, no --node_rank, two launchers") {
  const int port = free_port();
  const std::string dir = make_dir(), outa = make_dir(), outb = make_dir();
  const std::vector<std::string> args = {"--nnodes=2", "--nproc_per_node=2", "--rdzv_id=J",
                                         "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), kWorker, "env", dir};
  const std::vector<std::pair<std::string, std::string>> env = {{"PHALANX_RDZV_SECRET", "s3cret"}};
  // Started together: whichever binds the port first hosts the store and is node 0.
  Launch a = start(args, outa, env);
  Launch b = start(args, outb, env);
  CHECK(finish(a) == 0);
  CHECK(finish(b) == 0);
  const std::string oa = slurp(a.out), ob = slurp(b.out);
  INFO(oa);
  INFO(ob);
  const bool a_hosts = contains(oa, "node 0 of 2 (hosts the job's store on 127.0.0.1:" + std::to_string(port));
  const std::string& host = a_hosts ? oa : ob;
  const std::string& other = a_hosts ? ob : oa;
  CHECK(contains(host, "node 0 of 2 (hosts"));
  CHECK(contains(other, "node 1 of 2 (node rank assigned by the job's store"));
  // Ranks 0 and 1 ran under the host's launcher, 2 and 3 under the other's.
  CHECK(contains(host, "[0] rank 0 done"));
  CHECK(contains(host, "[1] rank 1 done"));
  CHECK(contains(other, "[2] rank 2 done"));
  CHECK(contains(other, "[3] rank 3 done"));
  for (int r = 0; r < 4; ++r) {
    auto e = read_env(dir + "/env_" + std::to_string(r));
    CHECK(e["RANK"] == std::to_string(r));
    CHECK(e["LOCAL_RANK"] == std::to_string(r % 2));
    CHECK(e["WORLD_SIZE"] == "4");
    CHECK(e["MASTER_PORT"] == std::to_string(port));
    CHECK(e["TOKEN_LEN"] == "64");
  }
}

TEST_CASE("without --node_rank, a launcher arriving when every node rank is taken is refused; the job goes on") {
  const int port = free_port();
  const std::string dir = make_dir(), outa = make_dir(), outb = make_dir(), outc = make_dir();
  const std::vector<std::string> args = {"--nnodes=2", "--rdzv_id=J",
                                         "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--grace-period=1",
                                         kWorker, "sleep", dir};
  const std::vector<std::pair<std::string, std::string>> env = {{"PHALANX_RDZV_SECRET", "s3cret"}};
  Launch a = start(args, outa, env);
  Launch b = start(args, outb, env);
  // Both nodes have their rank once both workers run.
  const auto deadline = Clock::now() + 30s;
  while (worker_pids(dir, 2).size() < 2 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  const std::vector<pid_t> workers = worker_pids(dir, 2);
  REQUIRE(workers.size() == 2);
  Launch c = start(args, outc, env);
  CHECK(finish(c, 30s) == 2);
  const std::string oc = slurp(c.out);
  INFO(oc);
  CHECK(contains(oc, "already has its 2 nodes (node ranks 0 to 1 are taken): this launcher is one too many"));
  CHECK_FALSE(contains(oc, "[0]"));  // it started no worker
  CHECK(::kill(workers[0], 0) == 0);  // and the job's workers still run
  CHECK(::kill(workers[1], 0) == 0);
  ::kill(a.pid, SIGTERM);
  ::kill(b.pid, SIGTERM);
  CHECK(finish(a) != -1);
  CHECK(finish(b) != -1);
  CHECK(all_gone(workers));
}

TEST_CASE("a PyTorchJob pod's variables: taken when no torchrun option is given, refused when they do not parse") {
  const std::string dir = make_dir();
  const int port = free_port();
  // One pod of one: WORLD_SIZE=1, RANK=0, node 0's store at MASTER_ADDR:MASTER_PORT.
  Launch l = start({"--nproc_per_node=2", kWorker, "env", dir}, dir,
                   {{"WORLD_SIZE", "1"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", std::to_string(port)}, {"PHALANX_RDZV_TOKEN", "pod-token"}});
  CHECK(finish(l) == 0);
  const std::string out = slurp(l.out);
  INFO(out);
  CHECK(out.find("node 0 of 1 from RANK and WORLD_SIZE (a PyTorchJob pod), node 0's store at 127.0.0.1:" +
                 std::to_string(port)) != std::string::npos);
  for (int r = 0; r < 2; ++r) {
    auto e = read_env(dir + "/env_" + std::to_string(r));
    CHECK(e["RANK"] == std::to_string(r));  // the workers' own, not the pod's
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["MASTER_PORT"] == std::to_string(port));
  }
  // An option (or its PET_ form) wins: the pod's variables are not read, so not refused either.
  Launch given = start({"--nnodes=1", "--nproc_per_node=1", kWorker, "env", dir}, dir,
                       {{"WORLD_SIZE", "x"}, {"RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
  CHECK(finish(given) == 0);
  Launch bad = start({"--nproc_per_node=1", kWorker, "env", dir}, dir,
                     {{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
  CHECK(finish(bad) == 2);
  CHECK(slurp(bad.out).find("RANK='2' is not an integer in [0, 1]") != std::string::npos);
}

TEST_CASE("a PyTorchJob pod's RANK is its node rank, not an arrival order") {
  // Kubernetes restarts a failed pod with the same RANK: that launcher must come back as the
  // same node, which arrival order (every rank taken by then) would refuse.
  const std::vector<std::pair<const char*, const char*>> pod = {
      {"WORLD_SIZE", "3"}, {"RANK", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29400"},
      {"PHALANX_RDZV_TOKEN", "pod-token"}};
  for (const auto& [k, v] : pod) ::setenv(k, v, 1);
  ::unsetenv("PHALANX_STORE_HOSTED");
  std::vector<std::string> args = {"phalanx-run", "--nproc-per-node", "1", "true"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  LaunchOptions o;
  int code = -1;
  const bool ok = parse_options(static_cast<int>(argv.size()), argv.data(), o, code);
  for (const auto& kv : pod) ::unsetenv(kv.first);
  REQUIRE(ok);
  CHECK(o.nnodes == 3);
  CHECK(o.node_rank == 2);
  CHECK_FALSE(o.assign_node_rank);
  CHECK(o.master_addr == "127.0.0.1");
  CHECK(o.master_port == 29400);
}

TEST_CASE("a node whose --rdzv-endpoint host does not resolve says so, not 'another job'") {
  // A Kubernetes pod can start before the DNS record of node 0's service exists.
  const std::string dir = make_dir();
  Launch l = start({"--nnodes=2", "--node_rank=1", "--rdzv_id=J", "--rdzv_endpoint=no-such-host.invalid:29400",
                    "--rdzv_timeout=2", kWorker, "env", dir},
                   dir);
  CHECK(finish(l, 30s) == 2);
  const std::string out = slurp(l.out);
  INFO(out);
  CHECK(contains(out, "cannot resolve 'no-such-host.invalid'"));
  CHECK_FALSE(contains(out, "belongs to another job"));
}
