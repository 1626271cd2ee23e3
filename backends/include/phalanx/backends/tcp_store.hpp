#pragma once
// The TCP rendezvous store. A TcpStoreServer runs in one process (rank 0's, or the
// launcher's) and serves any number of TcpStore clients.
//
// Wire protocol (docs/store_protocol.md): little-endian frames [u32 length][u8 command]
// [fields], strings as [u32 length][bytes]. The first frame of a connection is HELLO with
// the job token; a server with a token drops (and logs) a connection that presents
// another one. Malformed, oversized or truncated frames close that connection only; the
// server keeps serving the others. Before the handshake no frame may exceed a few KiB;
// buffers and connections are capped (TcpStoreLimits); replies are queued per connection
// and written without blocking, so a client that stops reading holds up nobody (its further
// requests wait until it reads).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phalanx/backends/default_timeout.hpp"
#include "phalanx/backends/store.hpp"

namespace phalanx {

/// The server's defences (docs/store_protocol.md). An offender is dropped and logged; the
/// other connections keep being served.
struct TcpStoreLimits {
  std::size_t max_frame_before_hello = 4096;   ///< largest frame accepted before HELLO succeeds
  std::size_t max_frame = 64u << 20;           ///< largest frame afterwards; at most 64 MiB (what clients accept)
  /// Replies queued for one connection that its client has not read yet; one reply of
  /// max_frame always fits, so only a client that stops reading exceeds it.
  std::size_t max_output_per_connection = (64u << 20) + (1u << 20);
  /// While this much of a connection's replies is queued (each charged its bytes plus its
  /// bookkeeping), the server handles and reads no more of its requests: a client that
  /// sends without reading is held back, not dropped (its own requests wait in the kernel).
  std::size_t pause_reading_above = 64u << 10;
  /// Bytes received but not yet handled, plus replies not yet sent (with their bookkeeping),
  /// over all connections (a reply's value shared with the store's data is counted per
  /// connection only).
  std::size_t max_buffered_total = std::size_t{512} << 20;
  int max_connections = 4096;  ///< also kept below this process's open-file limit minus reserved_fds
  /// Descriptors left below RLIMIT_NOFILE for everything else the hosting process opens
  /// (a launcher's pipes and log files, a worker's backend sockets).
  int reserved_fds = 256;
  /// A connection that has not completed HELLO by then is dropped.
  std::chrono::milliseconds hello_timeout{10000};
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;                 ///< server: 0 picks a free port (see TcpStoreServer::port())
  std::string token;            ///< job token ("" = none); defaults to PHALANX_RDZV_TOKEN
  std::chrono::milliseconds timeout{kDefaultTimeout};
  TcpStoreLimits limits;        ///< server only
};

class TcpStoreServer {
 public:
  /// Binds host:port (only that address) and starts serving on a background thread.
  /// Throws ConfigError when the port is in use or the address cannot be bound.
  explicit TcpStoreServer(const TcpStoreOptions& options);
  ~TcpStoreServer();
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  /// Connections refused for a wrong or missing token so far.
  int rejected_connections() const { return rejected_.load(); }
  /// Connections dropped by the server so far for breaking the protocol or a limit
  /// (wrong tokens included; peers that simply closed are not counted).
  int dropped_connections() const { return dropped_.load(); }

 private:
  struct State;
  struct Conn;
  void serve();
  void accept_all();
  void read_from(Conn& c);
  void write_to(Conn& c);
  void sweep();
  void log_drop(int fd, const std::string& reason, bool rate_limited);
  std::string host_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  std::string token_;
  std::atomic<int> rejected_{0};
  std::atomic<int> dropped_{0};
  TcpStoreLimits limits_;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  /// Connects to a server, retrying with backoff until the timeout (the server may start
  /// later). Throws TimeoutError naming host:port when it never answers, ConfigError when
  /// the server refuses the token.
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  using Store::set;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;

 private:
  Bytes request(const Bytes& frame, std::chrono::milliseconds timeout, const std::string& what);
  std::string host_;
  int port_;
  std::string token_;
  std::string endpoint_;
  // Idle connections. A request takes one (or opens one), so a thread blocked in wait()
  // or get() does not hold up another thread's requests.
  std::vector<int> idle_;
  std::mutex mu_;
};

}  // namespace phalanx
