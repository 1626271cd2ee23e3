#include "phalanx/parallel/init.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <atomic>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/file_store.hpp"
#include "phalanx/backends/memory_store.hpp"
#include "phalanx/backends/plugin_registry.hpp"
#include "phalanx/backends/prefix_store.hpp"
#include "phalanx/backends/tcp_store.hpp"
#include "phalanx/backends/world_of_one.hpp"
#include "phalanx/core/env.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/timeline.hpp"
#include "phalanx/core/world.hpp"
#include "phalanx/parallel/launch_env.hpp"
#include "advertise_address.hpp"
#include "desync_check.hpp"
#include "host_topology.hpp"
#include "phalanx/parallel/internal/slurm_rendezvous.hpp"
#include "failure_aware_store.hpp"
#include "failure_watcher.hpp"

namespace phalanx::parallel {

namespace {

struct State {
  std::mutex mu;
  ProcessGroupPtr group;
  std::unique_ptr<TcpStoreServer> server;  // when this rank hosts the store
  StorePtr store;
  std::unique_ptr<FailureWatcher> watcher;  // aborts the group when another rank fails
  Device device;            // decided by init (valid when has_device)
  bool has_device = false;
};
State& state() {
  // Never destroyed: a process that exits without destroy_process_group() drops its
  // connections when the kernel closes them at exit, not while static destructors are
  // still running, so peers (and the launcher) see the process's exit, not a half-dead
  // process whose sockets closed first.
  static State* s = new State;
  return *s;
}

/// How long the store-hosting rank keeps the store up after it finished cleanly, for peers
/// still in a collective to read its finished record (they usually need milliseconds).
constexpr std::chrono::milliseconds kFinishLinger{1500};

/// A clean end of the default group (s.mu held): posts this rank's finished record before
/// the group's connections close, so a peer still in a collective gets a PeerFinishedError
/// (uneven inputs) rather than a lost connection. Nothing after a failure or an abort, nor
/// while an operation of the group is still running or queued (an exit(0) from a signal
/// handler or another thread in the middle of a step is no clean end: peers read it as the
/// death it is). Returns whether it posted.
bool post_finished(State& s) {
  auto ctx = failure_context();
  if (!ctx || !s.group || s.group->size() <= 1 || s.group->is_aborted() || ctx->posted) return false;
  if (s.group->operation_in_flight()) return false;
  ctx->post_finished(s.group->sequence_number());
  return true;
}

/// exit(status) with the default group alive (a main that returns without
/// destroy_process_group()): status 0 is a clean end like destroy_process_group(); any
/// other status, a signal or an uncaught exception (std::terminate, no exit handlers) is
/// left to look like the death it is.
/// The process that created the default group: a child it forked (a helper that calls
/// exit(0)) inherits the handler and the group's memory, but is not this rank.
std::atomic<pid_t> g_group_pid{0};

void finish_at_exit(int status, void*) {
  if (status != 0 || ::getpid() != g_group_pid.load()) return;
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu, std::try_to_lock);
  // An operation still running (exit(0) from a signal handler or another thread): neither
  // post nor touch the group, which that operation still uses; it closes with the process.
  if (!lock.owns_lock() || !post_finished(s)) return;
  s.watcher.reset();
  // Closing the group now (when no operation is running) tells shm peers at once and lets
  // the store host linger below; one still running stays, and closes with the process.
  // MPI and NCCL are left to their own exit paths (MPI's on_exit handler finalizes).
  auto ctx = failure_context();
  const std::string name = s.group->backend_name();
  if (name != "mpi" && name != "nccl" && s.group.use_count() == 1 &&
      s.group->stop_threads(std::chrono::milliseconds(200)))
    s.group.reset();
  if (!s.group && ctx) ctx->linger_for_finish(kFinishLinger);
}

void install_exit_hook() {
#if defined(__GLIBC__)
  // on_exit, not atexit: the handler needs the exit status. Installed after the first group
  // exists, so it runs before the static destructors of the plugin that group loaded.
  g_group_pid = ::getpid();
  static std::atomic<bool> installed{false};
  if (!installed.exchange(true)) ::on_exit(&finish_at_exit, nullptr);
#endif
}

std::string env_or(const char* name, const std::string& fallback) {
  return env::text(name).value_or(fallback);
}

nlohmann::json read_config(const InitOptions& o) {
  const std::string path = !o.config_file.empty() ? o.config_file : env_or("PHALANX_CONFIG", "");
  if (path.empty()) return nlohmann::json::object();
  std::ifstream f(path);
  if (!f) throw ConfigError("config file " + path + " cannot be opened (PHALANX_CONFIG)");
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    if (!j.is_object()) throw ConfigError("config file " + path + ": expected a JSON object");
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("config file " + path + " is not valid JSON: " + e.what());
  }
}

std::string config_string(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return "";
  if (!j[key].is_string()) throw ConfigError(std::string("config key '") + key + "' must be a string");
  return j[key].get<std::string>();
}

/// Every rank checks in once: a duplicate rank or a disagreement on the world is an error
/// on every rank, not a hang.
void check_in(Store& prefixed, int rank, int world, const std::string& backend,
              std::chrono::milliseconds timeout) {
  char hostname[256] = {0};
  ::gethostname(hostname, sizeof hostname - 1);
  const std::string mine = detail::concat(world, "|", backend, "|pid ", ::getpid(), " on ", hostname);
  const Bytes mine_b(mine.begin(), mine.end());
  const Bytes got = prefixed.compare_set("rank/" + std::to_string(rank), {}, mine_b);
  if (got != mine_b) {
    const std::string theirs(got.begin(), got.end());
    const auto who = [](const std::string& v) { return v.substr(v.find("pid")); };
    throw ConfigError(detail::concat("rank ", rank, " is taken twice: this worker (", who(mine), ") and another (",
                                     who(theirs), ") were both given RANK=", rank,
                                     "; every worker needs its own rank"));
  }
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("rank/" + std::to_string(r));
  try {
    prefixed.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < world; ++r)
      if (!prefixed.check({"rank/" + std::to_string(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw TimeoutError(detail::concat("rendezvous timed out after ", timeout.count() / 1000.0, " s on rank ", rank,
                                      ": rank(s) ", missing, " of ", world,
                                      " never joined (did they start? do they use the same MASTER_ADDR, "
                                      "MASTER_PORT and WORLD_SIZE?)"));
  }
  for (int r = 0; r < world; ++r) {
    const std::string theirs = prefixed.get_string("rank/" + std::to_string(r));
    const auto bar1 = theirs.find('|'), bar2 = theirs.find('|', bar1 + 1);
    const std::string their_world = theirs.substr(0, bar1);
    const std::string their_backend = theirs.substr(bar1 + 1, bar2 - bar1 - 1);
    if (their_world != std::to_string(world) || their_backend != backend)
      throw ConfigError(detail::concat("rank ", r, " was started with world size ", their_world, " and backend '",
                                       their_backend, "', but rank ", rank, " with world size ", world,
                                       " and backend '", backend, "'; every worker needs the same WORLD_SIZE and backend"));
  }

}

}  // namespace

Device resolve_device(const InitOptions& o) {
  const LaunchEnv env = read_launch_env();
  if (!o.device.empty()) return resolve_device(o.device, env, "the device option");
  if (const std::string d = env_or("PHALANX_DEVICE", ""); !d.empty()) return resolve_device(d, env, "PHALANX_DEVICE");
  if (const std::string d = config_string(read_config(o), "device"); !d.empty())
    return resolve_device(d, env, "'device' in the config file");
  return Device::cpu();
}

Device local_device() {
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.has_device) return s.device;
  }
  return resolve_device(InitOptions{});
}

/// The backend named by the options, PHALANX_BACKEND or the config file ("" = auto).
static std::string named_backend(const InitOptions& o) {
  std::string b = o.backend;
  if (b.empty()) b = env_or("PHALANX_BACKEND", "");
  if (b.empty()) b = config_string(read_config(o), "backend");
  return b == "auto" ? "" : b;
}

std::string resolve_backend(const InitOptions& o, int world_size) {
  if (std::string b = named_backend(o); !b.empty()) return b;
  if (world_size == 1) return "single";
  if (resolve_device(o).type == DeviceType::CUDA && backend_available("nccl")) return "nccl";
  const LaunchEnv env = read_launch_env();
  // Under srun, MPI only when srun connected the tasks to it (--mpi=pmix); plain srun
  // tasks meet through a TCP store on the step's first node (slurm_rendezvous.hpp).
  const bool mpi_launch = env.source == "openmpi" || env.source == "pmi" ||
                          (env.source == "slurm" && slurm_connected_mpi());
  if (mpi_launch && backend_available("mpi")) return "mpi";
  return "auto";  // decided by the hosts, once init knows them
}

ProcessGroupPtr init_process_group(const InitOptions& o) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.group)
    throw ConfigError("init_process_group: the default process group is already initialised "
                      "(call destroy_process_group() first)");
  const LaunchEnv env = read_launch_env();
  const int world = o.world_size > 0 ? o.world_size : env.world_size;
  const int rank = o.rank >= 0 ? o.rank : env.rank;
  if (rank >= world)
    throw ConfigError(detail::concat("init_process_group: rank ", rank, " is not below the world size ", world));
  if (o.timeout.count() < 0 || o.timeout.count() > static_cast<std::int64_t>(kMaxTimeoutSeconds * 1000))
    throw ConfigError(detail::concat("init_process_group: timeout ", o.timeout.count(), " ms is outside [",
                                     kMinTimeoutSeconds * 1000, " ms, ", kMaxTimeoutSeconds, " s]; 0 takes PHALANX_TIMEOUT or 300 s"));
  const auto timeout = o.timeout.count() > 0 ? o.timeout : default_timeout();
  // The device, decided once; its plugin loads (or says why it cannot) before any rendezvous.
  const Device device = resolve_device(o);
  if (!device.is_cpu()) kernels_for(device);
  const std::string backend = resolve_backend(o, world);
  // "auto" becomes shm / gloo / hierarchical once the hosts are known (host_topology.hpp)
  const bool by_hosts = backend == "hierarchical" || backend == "auto";
  const bool debug_detail = debug_detail_enabled();

  if (backend == "single") {
    if (world != 1)
      throw ConfigError(detail::concat("backend 'single' is a world of one, but WORLD_SIZE is ", world));
    s.group = make_world_of_one(timeout);
    s.device = device;
    s.has_device = true;
    set_default_world({0, 1, true});
    return s.group;
  }

  // A failed init leaves nothing behind (no store server, no failure context).
  struct Undo {
    State& s;
    bool armed = true;
    ~Undo() {
      if (!armed) return;
      s.watcher.reset();
      set_failure_context(nullptr);
      s.server.reset();
    }
  } undo{s};
  // The rendezvous store.
  StorePtr store;
  TcpStoreOptions record_opts;  // port > 0 when the store is a TCP store
  std::string host = "127.0.0.1";
  AdvertiseInputs advertise;  // a TCP store: the address this rank advertises is chosen by advertise_address()
  std::string srun_note;      // workers started by srun: where their store is and why
  const std::string method = o.init_method.empty() ? "env://" : o.init_method;
  // Backend mpi under mpirun/srun without MASTER_ADDR: MPI_Init is the rendezvous (docs/mpi.md),
  // so a local store and no check-in; the plugin checks MPI's world against this one.
  const bool mpi_rendezvous = backend == "mpi" && world > 1 && method == "env://" && env.master_addr.empty();
  if (method.rfind("file://", 0) == 0) {
    store = std::make_shared<FileStore>(method.substr(7), timeout);
  } else if ((world == 1 || mpi_rendezvous) && method == "env://" && env.master_addr.empty()) {
    store = std::make_shared<MemoryStore>(timeout);
  } else {
    std::string addr = env.master_addr;
    int port = env.master_port;
    if (method.rfind("tcp://", 0) == 0) {
      const std::string hp = method.substr(6);
      const auto colon = hp.rfind(':');
      if (colon == std::string::npos) throw ConfigError("init_method '" + method + "': expected tcp://host:port");
      addr = hp.substr(0, colon);
      port = std::atoi(hp.substr(colon + 1).c_str());
    } else if (method != "env://") {
      throw ConfigError("init_method '" + method + "' is not env://, file:///path or tcp://host:port");
    }
    std::string token;  // "" = PHALANX_RDZV_TOKEN's, if any
    if (addr.empty() && method == "env://" && env.source == "slurm") {
      const SlurmRendezvous slurm = slurm_rendezvous(port);
      addr = slurm.host;
      port = slurm.port;
      token = slurm.token;
      srun_note = detail::concat("the store on ", addr, ":", port, " (the step's first node", env.master_port > 0 ? ", MASTER_PORT" : "",
                                 ")");
      // Rank 0 hosts that store, so it must run on that node; srun's block and cyclic
      // distributions put it there, an arbitrary one (a hostfile) or -m plane may not.
      if (rank == 0)
        if (const auto node = env::text("SLURMD_NODENAME"); node && !node->empty() && *node != addr)
          throw ConfigError(detail::concat(
              "rank 0 runs on node ", *node, ", not on the step's first node ", addr,
              " where every task looks for the store (srun --distribution=arbitrary or a hostfile?): "
              "set MASTER_ADDR to rank 0's host (and MASTER_PORT), or let srun place task 0 on the first node"));
    }
    if (addr.empty())
      throw ConfigError(detail::concat("MASTER_ADDR is not set: with a world of ", world,
                                       " every worker needs the address of the rendezvous host; set "
                                       "MASTER_ADDR and MASTER_PORT, or start the job with phalanx-run"));
    if (port <= 0)
      throw ConfigError("MASTER_PORT is not set: set it (the same on every worker), or start the job "
                        "with phalanx-run, which picks a free one");
    TcpStoreOptions so;
    so.host = addr;
    so.port = port;
    so.token = token;
    so.timeout = timeout;
    if (rank == 0 && !env.store_hosted) s.server = std::make_unique<TcpStoreServer>(so);
    store = std::make_shared<TcpStore>(so);
    record_opts = so;
    advertise = AdvertiseInputs{addr, port, world, env.local_world_size};
  }
  // From here the store is reachable: a failure on this rank is posted there, so the other
  // ranks fail at once (docs/errors.md), and theirs reach this rank's waits.
  auto ctx = std::make_shared<FailureContext>();
  ctx->root = store;
  ctx->rank = rank;
  ctx->restart = env.restart_count;
  ctx->world = world;
  ctx->hosts_store = s.server != nullptr;
  if (record_opts.port > 0) {
    // The records get a client of their own with a short budget: a store whose host is
    // gone must cost the failure hook and the watcher a fraction of a second.
    record_opts.timeout = FailureContext::kRecordTimeout;
    try {
      ctx->root = std::make_shared<TcpStore>(record_opts);
    } catch (const std::exception&) {
      // keep the main client
    }
  }
  set_failure_context(ctx);
  auto prefixed = std::make_shared<FailureAwareStore>(
      std::make_shared<PrefixStore>("phalanx/r" + std::to_string(env.restart_count) + "/default", store), ctx);
  try {
    if (!mpi_rendezvous) check_in(*prefixed, rank, world, backend, timeout);
    BackendConfig cfg;
    cfg.rank = rank;
    cfg.size = world;
    cfg.store = prefixed;
    cfg.timeout = timeout;
    cfg.hostname = advertise.master_addr.empty() ? host : advertise_address(advertise);
    cfg.local_rank = env.local_rank;
    cfg.local_world_size = env.local_world_size;
    cfg.device = device;
    // Every rank's host and machine (one store round): auto's choice, and how many ranks
    // share this machine's cores whichever launcher started them (waits spin only if they fit).
    std::optional<HostTopology> topology;
    if (!mpi_rendezvous && (world > 1 || by_hosts)) {
      topology = exchange_hosts(*prefixed, rank, world, timeout);
      cfg.ranks_on_machine = topology->ranks_on_machine(rank);
    }
    ProcessGroupPtr group = by_hosts ? create_for_hosts(backend == "hierarchical", cfg, *topology, o.plugin_path)
                                     : create_process_group(backend, cfg, o.plugin_path);
    group->set_failure_hook(make_failure_hook(ctx));
    if (debug_detail && !mpi_rendezvous) group->set_collective_check(make_desync_check(prefixed, rank, world));
    s.watcher = std::make_unique<FailureWatcher>(ctx, group);
    s.group = group;
    // Started by srun itself: say what was chosen and why, once (docs/slurm.md).
    if (env.source == "slurm" && rank == 0 && (!srun_note.empty() || mpi_rendezvous))
      std::fprintf(stderr, "phalanx: srun started %d tasks: %s; backend %s%s\n", world,
                   mpi_rendezvous ? "MPI_Init is the rendezvous (srun --mpi=pmix)" : srun_note.c_str(),
                   group->backend_name().c_str(),
                   named_backend(o).empty() ? mpi_rendezvous ? " (auto: srun connected the tasks to MPI)"
                                                             : " (auto: srun without --mpi=pmix, so not mpi)"
                                            : " (named)");
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    ctx->post(detail::message_of(error), is_secondary_failure(error) || ctx->peer_failed.load(), failure_kind(error));
    ctx->linger_for_readers(std::chrono::milliseconds(1500));
    throw;
  }
  s.store = store;
  s.device = device;
  s.has_device = true;
  set_default_world({rank, world, true});
  undo.armed = false;
  install_exit_hook();
  return s.group;
}

void destroy_process_group() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.watcher.reset();  // first: it must not abort a group that is going away
  const auto ctx = failure_context();
  // Destroyed while an exception is being handled (catch (...) { destroy_process_group(); }):
  // this rank is leaving because something failed, not because its data ran out. Abort the
  // group so shared-memory peers read a failure, and post no finished record (Gloo peers then
  // see a lost connection, as for a crash). report_failure(message) before this says why.
  if (std::current_exception() && s.group && s.group->size() > 1)
    s.group->abort(std::make_exception_ptr(CommError("the process group was destroyed while an error was handled")));
  const bool finished = post_finished(s);  // before the connections close
  s.group.reset();
  if (finished) ctx->linger_for_finish(kFinishLinger);
  set_failure_context(nullptr);
  s.store.reset();
  s.server.reset();
  s.has_device = false;
  timeline::finish();  // this rank's part of PHALANX_TIMELINE (docs/timeline.md), while the world is known
  set_default_world({0, 1});
}

bool is_initialized() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.group != nullptr;
}

ProcessGroupPtr default_process_group() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.group) s.group = make_world_of_one(default_timeout());
  return s.group;
}

}  // namespace phalanx::parallel
