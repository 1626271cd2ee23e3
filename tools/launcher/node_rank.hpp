#pragma once
// A multi-node job started without --node-rank (like torchrun's c10d rendezvous): the
// launcher that can bind --rdzv-endpoint on its own machine hosts the job's store and is
// node 0; every other launcher connects to it and takes node ranks 1, 2, ... in arrival
// order from a counter in that store (key phalanx/launch/next_node). A launcher arriving
// when all of them are taken is one too many and is refused.
#include <string>

#include <phalanx/backends/store.hpp>

namespace phalanx::launcher {

enum class EndpointBind {
  kFree,      ///< one of this machine's addresses, and the port is free: host the store
  kInUse,     ///< this machine's address, but the port is taken (another launcher hosts)
  kNotLocal,  ///< not an address of this machine (or not resolvable here): connect to it
  kError,     ///< this machine's address, but it cannot be bound for another reason
};

/// Tries to bind HOST:PORT (every address HOST resolves to) and lets go of it at once.
/// `error` is set (one line) for kError.
EndpointBind probe_endpoint(const std::string& host, int port, std::string& error);

/// For the launcher that hosts a multi-node job's store: a one-line note (without the
/// "phalanx-run: " prefix) when HOST is a name, not an address or "localhost", that resolves
/// on this machine to loopback addresses only (a hostname mapped to 127.0.1.1 in /etc/hosts,
/// as in many containers): the store then listens on loopback, which launchers on other
/// hosts cannot reach. "" otherwise.
std::string loopback_endpoint_note(const std::string& host);

/// The counter node ranks are taken from.
constexpr const char* kNodeRankCounter = "phalanx/launch/next_node";

/// For a launcher that does not host the store: its node rank, in [1, nnodes) in arrival
/// order; -1 when all nnodes ranks are taken. Throws what the store throws.
int claim_node_rank(Store& store, int nnodes);

}  // namespace phalanx::launcher
