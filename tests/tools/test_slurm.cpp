// Under a real Slurm: tests/support/local_slurm.sh starts munged, slurmctld and slurmd in a
// temporary folder (its own key, slurm.conf, state, spool and free ports) and removes them
// at the end. Workers started by srun itself find each other from Slurm's variables alone
// (docs/slurm.md) and train as one process does at the same global batch; srun --mpi=pmix
// puts them on the MPI plugin; one phalanx-run per node under srun, and both sbatch
// examples, run; with two slurmd in network namespaces (root only), srun -N 2 spans them. Where Slurm cannot start the cases say "SKIPPED: slurm: <why>" (ctest
// reports the entry skipped). Also: the parsers of Slurm's host and task lists, without Slurm.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>
#include <phalanx/phalanx.hpp>

#include "phalanx/parallel/internal/slurm_rendezvous.hpp"
#include "tools/trainer_harness.hpp"

using namespace phalanx;
using trainer_test::run_command;

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

const std::string kScript = std::string(PHALANX_SOURCE_DIR) + "/tests/support/local_slurm.sh";
const std::string kData = std::string(" --train-x ") + PHALANX_EXAMPLE_DATA + "/seed_case_study.npz:x --train-y " +
                          PHALANX_EXAMPLE_DATA + "/seed_case_study.npz:y --global-batch 64 --epochs 3 --seed 5";

// A cluster for the whole run: started at first use, stopped at exit.
struct LocalSlurm {
  std::string dir, work;
  bool up = false;
  std::string why;
  explicit LocalSlurm(int nodes) {
    const std::string stem = "/tmp/phalanx_slurm" + std::to_string(nodes) + "_" + std::to_string(::getpid());
    dir = stem;
    work = stem + "_work";
    std::system(("rm -rf " + work + " && mkdir -p " + work).c_str());
    const auto r = run_command(kScript + " start " + dir + " " + std::to_string(free_port()) + " " +
                                   std::to_string(free_port()) + " " + std::to_string(nodes),
                               work + "/start.log");
    up = r.code == 0;
    why = r.out;
  }
  ~LocalSlurm() {
    if (up) std::system((kScript + " stop " + dir).c_str());
    std::system(("rm -rf " + work).c_str());
  }
  /// `command` with this cluster's slurm.conf.
  std::string with_conf(const std::string& command) const { return "SLURM_CONF=" + dir + "/slurm.conf " + command; }
};

LocalSlurm& cluster() {
  static LocalSlurm c(1);
  return c;
}

#define REQUIRE_CLUSTER(c)                                                                     \
  if (!(c).up) {                                                                               \
    MESSAGE(((c).why.find("SKIPPED") != std::string::npos ? (c).why : "SKIPPED: slurm: " + (c).why)); \
    return;                                                                                    \
  }
#define REQUIRE_SLURM() REQUIRE_CLUSTER(cluster())

nlohmann::json summary_of(const std::string& out) {
  const auto at = out.rfind("{\"backend\"");
  REQUIRE(at != std::string::npos);
  return nlohmann::json::parse(out.substr(at, out.find('\n', at) - at));
}

void check_same_weights(const std::string& a_path, const std::string& b_path, double tol) {
  CHECK(trainer_test::max_weight_diff(a_path, b_path) <= tol);
}

const std::string& one_process_weights() {
  static const std::string path = [] {
    const std::string p = cluster().work + "/one.npz";
    const auto r = run_command(std::string(PHALANX_TRAIN) + kData + " --save " + p, cluster().work + "/one.log");
    INFO(r.out);
    REQUIRE(r.code == 0);
    return p;
  }();
  return path;
}

}  // namespace

TEST_CASE("Slurm host lists: the first host, zero padding kept; malformed lists are one-line errors") {
  using parallel::first_slurm_host;
  CHECK(first_slurm_host("vm", "V") == "vm");
  CHECK(first_slurm_host("node[01-03,7],gpu5", "V") == "node01");
  CHECK(first_slurm_host("node[7,1-3]", "V") == "node7");
  CHECK(first_slurm_host("rack[2-3]-n[5,9]", "V") == "rack2-n5");
  CHECK(first_slurm_host("a.example.org,b", "V") == "a.example.org");
  CHECK_THROWS_WITH_AS(first_slurm_host("node[01-03", "SLURM_STEP_NODELIST"),
                       doctest::Contains("SLURM_STEP_NODELIST='node[01-03' is not a Slurm host list"), ConfigError);
  CHECK_THROWS_WITH_AS(first_slurm_host("node[a-b]", "V"), doctest::Contains("not numbers"), ConfigError);
  CHECK_THROWS_WITH_AS(first_slurm_host("", "V"), doctest::Contains("no host"), ConfigError);
  CHECK_THROWS_WITH_AS(first_slurm_host("n]", "V"), doctest::Contains("without '['"), ConfigError);
}

TEST_CASE("Slurm task lists: the tasks on each node") {
  using parallel::slurm_tasks_on_node;
  CHECK(slurm_tasks_on_node("2", 0, "V") == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 0, "V") == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 2, "V") == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 3, "V") == 1);
  CHECK(slurm_tasks_on_node("4,3,2", 1, "V") == 3);
  CHECK_THROWS_WITH_AS(slurm_tasks_on_node("2(x3),1", 4, "SLURM_STEP_TASKS_PER_NODE"),
                       doctest::Contains("lists 4 nodes, but this is node 4"), ConfigError);
  CHECK_THROWS_WITH_AS(slurm_tasks_on_node("2(x3", 0, "V"), doctest::Contains("not a Slurm tasks-per-node list"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(slurm_tasks_on_node("x", 0, "V"), doctest::Contains("not a Slurm tasks-per-node list"),
                       ConfigError);
}

TEST_CASE("srun -n 2 phalanx-train: the store from Slurm's variables, shm, equal to one process") {
  REQUIRE_SLURM();
  const std::string w = cluster().work + "/srun.npz";
  const auto r = run_command(cluster().with_conf("srun --kill-on-bad-exit=1 -n 2 ") + std::string(PHALANX_TRAIN) + kData + " --save " + w,
                             cluster().work + "/srun.log");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto s = summary_of(r.out);
  CHECK(s["world_size"] == 2);
  CHECK(s["backend"] == "shm");
  CHECK(r.out.find("phalanx: srun started 2 tasks: the store on ") != std::string::npos);  // what and why
  CHECK(r.out.find("backend shm (auto: srun without --mpi=pmix, so not mpi)") != std::string::npos);
  check_same_weights(one_process_weights(), w, 1e-6);
}

TEST_CASE("srun --mpi=pmix -n 2 phalanx-train runs on the MPI plugin, equal to one process") {
  REQUIRE_SLURM();
  if (!backend_available("mpi")) {
    MESSAGE("not run: the MPI plugin is not built here");
    return;
  }
  const auto list = run_command(cluster().with_conf("srun --mpi=list"), cluster().work + "/mpilist.log");
  if (list.out.find("pmix") == std::string::npos) {
    MESSAGE("not run: this Slurm has no PMIx plugin (srun --mpi=list: " << list.out << ")");
    return;
  }
  const std::string w = cluster().work + "/pmix.npz";
  const auto r = run_command(cluster().with_conf("srun --kill-on-bad-exit=1 --mpi=pmix -n 2 ") + std::string(PHALANX_TRAIN) + kData + " --save " + w,
                             cluster().work + "/pmix.log");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(summary_of(r.out)["backend"] == "mpi");
  CHECK(r.out.find("backend mpi (auto: srun connected the tasks to MPI)") != std::string::npos);
  check_same_weights(one_process_weights(), w, 1e-6);
}

TEST_CASE("the sbatch examples run: srun's own workers, and one phalanx-run per node") {
  REQUIRE_SLURM();
  const std::string env = "PHALANX_ROOT=" + std::string(PHALANX_SOURCE_DIR) + " PHALANX_BIN=" +
                          std::string(PHALANX_TRAIN).substr(0, std::string(PHALANX_TRAIN).rfind('/'));
  for (const std::string script : {"train_srun.sbatch", "train_launcher.sbatch"}) {
    CAPTURE(script);
    const std::string out = cluster().work + "/" + script + ".out";
    const auto r = run_command(cluster().with_conf(env) + " sbatch --wait --output=" + out + " " + PHALANX_SOURCE_DIR +
                                   "/examples/slurm/" + script,
                               cluster().work + "/" + script + ".log");
    const std::string job_out = trainer_test::slurp(out);
    INFO(r.out);
    INFO(job_out);
    REQUIRE(r.code == 0);
    CHECK(summary_of(job_out)["world_size"] == 2);
  }
}

TEST_CASE("two Slurm nodes (network namespaces n1, n2): srun -N 2 -n 4 equals one process; the launcher sbatch spans them") {
  static LocalSlurm two(2);
  REQUIRE_CLUSTER(two);
  const std::string exact = kData + " --exact --micro-batch 16";
  const std::string one = two.work + "/one_exact.npz", four = two.work + "/four_exact.npz";
  const auto r1 = run_command(std::string(PHALANX_TRAIN) + exact + " --save " + one, two.work + "/one.log");
  INFO(r1.out);
  REQUIRE(r1.code == 0);
  const auto r = run_command(two.with_conf("srun --kill-on-bad-exit=1 -N 2 -n 4 ") + std::string(PHALANX_TRAIN) + exact +
                                 " --save " + four,
                             two.work + "/four.log");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto s = summary_of(r.out);
  CHECK(s["world_size"] == 4);
  CHECK(s["backend"] == "hierarchical:shm+gloo");  // two hosts: shm within each, gloo between
  CHECK(trainer_test::slurp(four) == trainer_test::slurp(one));
  // One phalanx-run per node: the launchers meet on n1 and start 2 workers each.
  const std::string out = two.work + "/launcher.out";
  const auto b = run_command(two.with_conf("PHALANX_ROOT=" + std::string(PHALANX_SOURCE_DIR) + " PHALANX_BIN=" +
                                           std::string(PHALANX_TRAIN).substr(0, std::string(PHALANX_TRAIN).rfind('/'))) +
                                 " sbatch --wait --nodes=2 --output=" + out + " " + PHALANX_SOURCE_DIR +
                                 "/examples/slurm/train_launcher.sbatch",
                             two.work + "/launcher.log");
  const std::string job_out = trainer_test::slurp(out);
  INFO(b.out);
  INFO(job_out);
  REQUIRE(b.code == 0);
  CHECK(summary_of(job_out)["world_size"] == 4);
}
