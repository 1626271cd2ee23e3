#pragma once
// Small POSIX socket helpers shared by the TCP store's server and client.
#include <chrono>
#include <cstdint>
#include <string>

namespace phalanx::net {

/// Sends all bytes; false when the peer is gone.
bool send_all(int fd, const void* data, std::size_t n);
/// Receives exactly n bytes before `deadline`; returns 1 ok, 0 closed/error, -1 timeout.
int recv_all(int fd, void* data, std::size_t n, std::chrono::steady_clock::time_point deadline);
/// Connects to host:port once; returns the fd or -1 (errno set).
int connect_once(const std::string& host, int port);
/// Binds and listens on host:port (port 0 = any free one); throws ConfigError on failure.
int listen_on(const std::string& host, int port, int* bound_port);
void set_nodelay(int fd);
/// "host:port" of the remote end of fd.
std::string peer_name(int fd);

}  // namespace phalanx::net
