#include "phalanx/parallel/internal/slurm_rendezvous.hpp"

#include <cctype>
#include <string>

#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/parallel/internal/rdzv_token.hpp"

namespace phalanx::parallel {

std::string first_slurm_host(const std::string& nodelist, const char* variable) {
  const auto bad = [&](const char* what) {
    return ConfigError(std::string(variable) + "='" + nodelist + "' is not a Slurm host list (" + what +
                       "); set MASTER_ADDR to the host of rank 0 instead");
  };
  std::string host;
  std::size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] == '[') {  // a range set: its first number, as written (zero padding kept)
      const std::size_t close = nodelist.find(']', i);
      if (close == std::string::npos) throw bad("a '[' without ']'");
      const std::size_t end = nodelist.find_first_of(",-]", i + 1);
      if (end == i + 1) throw bad("an empty range");
      for (std::size_t k = i + 1; k < end; ++k)
        if (nodelist[k] < '0' || nodelist[k] > '9') throw bad("a range that is not numbers");
      host.append(nodelist, i + 1, end - i - 1);
      i = close + 1;
    } else if (nodelist[i] == ']') {
      throw bad("a ']' without '['");
    } else {
      host.push_back(nodelist[i++]);
    }
  }
  if (host.empty()) throw bad("no host");
  return host;
}

int slurm_tasks_on_node(const std::string& spec, int node, const char* variable) {
  const auto bad = [&] {
    return ConfigError(std::string(variable) + "='" + spec + "' is not a Slurm tasks-per-node list (like 2(x3),1)");
  };
  int first = 0;  // the first node of the current group
  std::size_t i = 0;
  while (i < spec.size()) {
    std::size_t used = 0;
    int tasks = 0, repeat = 1;
    try {
      tasks = std::stoi(spec.substr(i), &used);
    } catch (const std::exception&) {
      throw bad();
    }
    if (tasks < 1 || used == 0 || !std::isdigit(static_cast<unsigned char>(spec[i]))) throw bad();
    i += used;
    if (spec.compare(i, 2, "(x") == 0) {
      std::size_t n = 0;
      try {
        repeat = std::stoi(spec.substr(i + 2), &n);
      } catch (const std::exception&) {
        throw bad();
      }
      if (repeat < 1 || spec.compare(i + 2 + n, 1, ")") != 0) throw bad();
      i += 2 + n + 1;
    }
    if (node < first + repeat) return tasks;
    first += repeat;
    if (i < spec.size() && spec[i++] != ',') throw bad();
  }
  throw ConfigError(detail::concat(variable, "='", spec, "' lists ", first, " nodes, but this is node ", node,
                                   " (SLURM_NODEID)"));
}

SlurmRendezvous slurm_rendezvous(int master_port) {
  SlurmRendezvous r;
  const char* list_var = nullptr;
  std::string list;
  for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (auto t = env::text(v); t && !t->empty()) {
      list_var = v;
      list = *t;
      break;
    }
  if (!list_var)
    throw ConfigError("srun started this worker (SLURM_PROCID is set) without MASTER_ADDR, and "
                      "SLURM_STEP_NODELIST is not set either: set MASTER_ADDR and MASTER_PORT, or "
                      "start the workers with phalanx-run");
  r.host = first_slurm_host(list, list_var);
  const std::int64_t job = env::integer("SLURM_JOB_ID", -1, 0, std::int64_t{1} << 40);
  if (job < 0)
    throw ConfigError("srun started this worker without MASTER_ADDR, and SLURM_JOB_ID is not set: set "
                      "MASTER_ADDR and MASTER_PORT, or start the workers with phalanx-run");
  const std::int64_t step = env::integer("SLURM_STEP_ID", 0, 0, std::int64_t{1} << 32);
  // Ports 15000-31999: below Linux's ephemeral range (32768-60999), so an outgoing
  // connection never holds the port; two steps of one job running at once get different ones.
  r.port = master_port > 0 ? master_port : static_cast<int>(15000 + (job * 16 + step) % 17000);
  r.token = env::text("PHALANX_RDZV_TOKEN").value_or("");
  if (r.token.empty())
    r.token = derive_rdzv_token("slurm:" + std::to_string(job) + "." + std::to_string(step),
                                env::text(kRdzvSecretEnv).value_or(""));
  return r;
}

bool slurm_connected_mpi() { return env::text("PMIX_RANK").has_value(); }

}  // namespace phalanx::parallel
