#pragma once
// The address a rank advertises to its peers: the one its backend (Gloo) listens on and
// publishes through the rendezvous store. docs/launcher.md, "Jobs that span hosts".
#include <string>
#include <vector>

namespace phalanx::parallel {

/// True for "", "localhost", 127.x.y.z, ::1 and ::ffff:127.x.y.z (brackets allowed).
bool is_loopback_address(const std::string& host);

/// The names of this machine's network interfaces, in the kernel's order, each once.
std::vector<std::string> interface_names();

/// The numeric address of interface `name`: `prefer` when it is one of its addresses (the
/// source of the route to MASTER_ADDR, of an interface with several), else of the family
/// `ipv6` asks for when it has one, else of the other (a global IPv6 address before a
/// link-local one); "" when the interface does not exist or has no address.
std::string interface_address(const std::string& name, bool ipv6, const std::string& prefer = "");

/// Why interface `name` cannot carry traffic ("is down", "has no carrier"); "" when it is
/// up and running, or does not exist.
std::string interface_down(const std::string& name);

/// The local address the kernel would send from to reach host:port, as NCCL finds its
/// interface: connect() a UDP socket (no packet is sent), then getsockname(). "" when
/// host does not resolve or no route reaches it.
std::string route_source_address(const std::string& host, int port);

/// What the job tells advertise_address().
struct AdvertiseInputs {
  std::string master_addr;  ///< MASTER_ADDR (or tcp://HOST:port's HOST)
  int master_port = 0;
  int world_size = 1;
  int local_world_size = 1;  ///< ranks on this host; below world_size = the job spans hosts
};

/// The address this rank advertises:
///   1. 127.0.0.1 when MASTER_ADDR is, or resolves here to, a loopback address (the store
///      listens on loopback: every rank is on this host);
///   2. PHALANX_HOSTNAME when set;
///   3. the address of the interface PHALANX_SOCKET_IFNAME (else GLOO_SOCKET_IFNAME) names
///      (a comma-separated list: its first name): the one the route to MASTER_ADDR leaves
///      from when the interface has it, else one of MASTER_ADDR's family; an interface that
///      is down or has no carrier is an error;
///   4. the local address that routes to MASTER_ADDR (else this host's name).
/// Throws ConfigError (one line) when the interface does not exist or has no address, and
/// when a job that spans hosts would advertise a loopback address by rule 2, 3 or 4 (its
/// peers on other hosts could never connect): the message says which variable to set.
std::string advertise_address(const AdvertiseInputs& in);

}  // namespace phalanx::parallel
