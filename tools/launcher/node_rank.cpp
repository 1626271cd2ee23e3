#include "node_rank.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace phalanx::launcher {

EndpointBind probe_endpoint(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return EndpointBind::kNotLocal;
  bool in_use = false;
  int other = 0;
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;  // as the store binds: a port in TIME_WAIT is free
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    ::close(fd);
    if (rc == 0) {
      ::freeaddrinfo(res);
      return EndpointBind::kFree;
    }
    if (err == EADDRINUSE) in_use = true;
    else if (err != EADDRNOTAVAIL && err != EAFNOSUPPORT) other = err;
  }
  ::freeaddrinfo(res);
  if (in_use) return EndpointBind::kInUse;
  if (other == 0) return EndpointBind::kNotLocal;
  error = "cannot host the job's store on " + host + ":" + std::to_string(port) + ": " + std::strerror(other) +
          (other == EACCES ? " (ports below 1024 need privileges: choose another port)" : "");
  return EndpointBind::kError;
}

std::string loopback_endpoint_note(const std::string& host) {
  in6_addr literal{};
  if (host == "localhost" || ::inet_pton(AF_INET, host.c_str(), &literal) == 1 ||
      ::inet_pton(AF_INET6, host.c_str(), &literal) == 1)
    return "";  // an address (or localhost) is meant as written
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return "";
  std::string first;
  bool all_loopback = true;
  for (addrinfo* a = res; a && all_loopback; a = a->ai_next) {
    char text[NI_MAXHOST] = {0};
    ::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
    if (first.empty()) first = text;
    if (a->ai_family == AF_INET)
      all_loopback = (ntohl(reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else
      all_loopback = a->ai_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
  }
  ::freeaddrinfo(res);
  if (!all_loopback) return "";
  return "note: the master address " + host + " resolves to the loopback address " + first +
         " on this machine, so the job's store listens on loopback only and launchers on other hosts cannot reach it: "
         "give node 0's network address (--master-addr or --rdzv-endpoint) unless every node runs on this machine";
}

int claim_node_rank(Store& store, int nnodes) {
  // Node 0 is the host and never counts: the first other launcher gets 1.
  const std::int64_t n = store.add(kNodeRankCounter, 1);
  return n >= 1 && n < nnodes ? static_cast<int>(n) : -1;
}

}  // namespace phalanx::launcher
