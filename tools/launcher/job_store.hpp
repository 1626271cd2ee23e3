#pragma once
// The job's rendezvous store as one launcher holds it. The launcher of node 0 hosts it for
// the whole job (restarts included: each attempt uses its own key prefix), bound to the
// master address only; without --node-rank, node 0 is the launcher that can bind the
// endpoint on its machine and the others take their node rank from the store. Every
// launcher keeps a client of it (failure records, stop records) and, with several nodes,
// agrees with the others on each round through it (job_rounds.hpp).
#include <memory>

#include <phalanx/backends/tcp_store.hpp>

#include "job_rounds.hpp"
#include "launch_options.hpp"

namespace phalanx::launcher {

class RefusalWatch;

struct JobStore {
  JobStore();
  JobStore(JobStore&&) noexcept;
  ~JobStore();

  /// Members in the order they are set up (and torn down in reverse).
  std::unique_ptr<TcpStoreServer> server;  ///< set on the launcher that hosts the store
  std::unique_ptr<RefusalWatch> refusals;  ///< node 0 of several: says once that it refused a token
  int port = 0;                            ///< the store's port (the bound one, for --master-port 0)
  bool hosting = false;
  /// This launcher's client; null on a single node whose store could not be reached (blame
  /// by what the launcher sees alone).
  std::shared_ptr<Store> store;
  std::unique_ptr<JobRounds> rounds;  ///< several nodes only
};

/// Hosts or joins the job's store, assigns o.node_rank when the store gives it out, and with
/// several nodes starts the rounds. Throws LaunchError (launch_error.hpp) when it cannot.
JobStore open_job_store(LaunchOptions& o);

}  // namespace phalanx::launcher
