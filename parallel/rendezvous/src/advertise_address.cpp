#include "advertise_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"

namespace phalanx::parallel {

namespace {

/// The variable's text, "" when unset.
std::string get(const char* name) { return env::text(name).value_or(""); }

std::string strip_brackets(const std::string& h) {
  return h.size() >= 2 && h.front() == '[' && h.back() == ']' ? h.substr(1, h.size() - 2) : h;
}

/// The numeric form of a socket address ("" when it cannot be printed).
std::string numeric(const sockaddr* sa, socklen_t len) {
  char buf[NI_MAXHOST] = {0};
  if (::getnameinfo(sa, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return buf;
}

bool is_loopback_sockaddr(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

/// True when `host` is a name that resolves to a loopback address here (its first result).
bool resolves_to_loopback(const std::string& host) {
  if (is_loopback_address(host)) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(strip_brackets(host).c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  const bool lo = is_loopback_sockaddr(res->ai_addr);
  ::freeaddrinfo(res);
  return lo;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

std::string this_hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

bool is_loopback_address(const std::string& host_in) {
  const std::string host = strip_brackets(host_in);
  if (host.empty() || host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") return true;
  in6_addr a6{};
  if (::inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_addr = a6;
    return is_loopback_sockaddr(reinterpret_cast<const sockaddr*>(&sa));
  }
  return false;
}

std::vector<std::string> interface_names() {
  std::vector<std::string> names;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return names;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_name && std::find(names.begin(), names.end(), i->ifa_name) == names.end())
      names.emplace_back(i->ifa_name);
  ::freeifaddrs(list);
  return names;
}

std::string interface_address(const std::string& name, bool ipv6, const std::string& prefer) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  // Ranked: `prefer` when the interface has it; then the asked family; within IPv6 a global
  // address before a link-local one.
  std::string best;
  int best_rank = 99;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_name || name != i->ifa_name || !i->ifa_addr) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    const bool link_local =
        fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    const std::string a =
        numeric(i->ifa_addr, fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (a.empty()) continue;
    const int rank = !prefer.empty() && a == prefer ? -1 : ((fam == AF_INET6) == ipv6 ? 0 : 2) + (link_local ? 1 : 0);
    if (rank >= best_rank) continue;
    best = a;
    best_rank = rank;
  }
  ::freeifaddrs(list);
  return best;
}

std::string interface_down(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string why;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_name || name != i->ifa_name) continue;
    if (!(i->ifa_flags & IFF_UP))
      why = "is down (ip link set " + name + " up)";
    else if (!(i->ifa_flags & IFF_RUNNING) && !(i->ifa_flags & IFF_LOOPBACK))
      why = "is up but has no carrier (its link is down: cable, switch port or veth peer)";
    break;
  }
  ::freeifaddrs(list);
  return why;
}

std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port > 0 ? port : 9);
  if (::getaddrinfo(strip_brackets(host).c_str(), service.c_str(), &hints, &res) != 0) return "";
  std::string out;
  for (addrinfo* a = res; a && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
      out = numeric(reinterpret_cast<const sockaddr*>(&local), len);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

std::string advertise_address(const AdvertiseInputs& in) {
  const std::string& master = in.master_addr;
  // 1. MASTER_ADDR is (or resolves here to) a loopback address: the store listens on
  //    loopback, so every rank that reached it is on this host.
  if (resolves_to_loopback(master)) return "127.0.0.1";
  const bool spans_hosts = in.local_world_size < in.world_size;
  const std::string job = detail::concat("this job spans hosts (WORLD_SIZE ", in.world_size, ", LOCAL_WORLD_SIZE ",
                                         in.local_world_size, ", MASTER_ADDR ", master, ")");
  // 2. Given by hand.
  if (const std::string h = get("PHALANX_HOSTNAME"); !h.empty()) {
    if (spans_hosts && resolves_to_loopback(h)) {
      const std::string routed = route_source_address(master, in.master_port);
      throw ConfigError(detail::concat(
          "PHALANX_HOSTNAME=", h, " is a loopback address here, but ", job,
          ": the other hosts could not reach this rank; set PHALANX_HOSTNAME to this host's network address",
          routed.empty() || is_loopback_address(routed) ? std::string() : " (the one that routes to MASTER_ADDR is " + routed + ")",
          ", or unset it"));
    }
    return h;
  }
  // 3. An interface named by hand.
  const char* var = !get("PHALANX_SOCKET_IFNAME").empty() ? "PHALANX_SOCKET_IFNAME" : "GLOO_SOCKET_IFNAME";
  if (const std::string ifname = get(var); !ifname.empty()) {
    std::string name = ifname;
    name = name.substr(0, name.find(','));
    in6_addr a6{};
    // Of several addresses on the interface, the one the route to MASTER_ADDR leaves from.
    const std::string addr = interface_address(name, ::inet_pton(AF_INET6, strip_brackets(master).c_str(), &a6) == 1,
                                               route_source_address(master, in.master_port));
    const std::vector<std::string> names = interface_names();
    if (const std::string down = interface_down(name); !down.empty())
      throw ConfigError(detail::concat(var, "=", ifname, ": interface '", name, "' ", down,
                                       "; the other hosts could not reach this rank through it; bring it up, or set ",
                                       var, " to the interface they reach (this host has: ", join(names), ")"));
    if (addr.empty()) {
      const bool exists = std::find(names.begin(), names.end(), name) != names.end();
      throw ConfigError(detail::concat(var, "=", ifname, ": ",
                                       exists ? "interface '" + name + "' has no IPv4 or IPv6 address"
                                              : "this host has no network interface '" + name + "'",
                                       " (its interfaces: ", join(names), "); set ", var,
                                       " to the one the other hosts reach"));
    }
    if (spans_hosts && is_loopback_address(addr))
      throw ConfigError(detail::concat(var, "=", ifname, " gives the loopback address ", addr, ", but ", job,
                                       ": the other hosts could not reach this rank; set ", var,
                                       " to the interface they reach (this host has: ", join(names), ")"));
    return addr;
  }
  // 4. The interface that routes to MASTER_ADDR, as NCCL picks its own.
  std::string addr = route_source_address(master, in.master_port);
  const bool routed = !addr.empty();
  if (!routed) addr = this_hostname();
  if (spans_hosts && resolves_to_loopback(addr))
    throw ConfigError(detail::concat(
        job, ", but this rank would advertise the loopback address ", addr,
        routed ? " (MASTER_ADDR is reached from this host through loopback)"
               : " (no route to MASTER_ADDR; this host's name resolves to loopback)",
        ", which the other hosts cannot reach: set PHALANX_SOCKET_IFNAME to the interface they reach (this host has: ",
        join(interface_names()), "), or PHALANX_HOSTNAME to this host's address"));
  return addr;
}

}  // namespace phalanx::parallel
