#pragma once
// The TCP rendezvous store. A TcpStoreServer runs in one process (rank 0's, or the
// launcher's) and serves any number of TcpStore clients.
//
// Wire protocol (docs/store_protocol.md): little-endian frames [u32 length][u8 command]
// [fields], strings as [u32 length][bytes]. The first frame of a connection is HELLO with
// the job token; a server with a token drops (and logs) a connection that presents
// another one. Malformed, oversized or truncated frames close that connection only; the
// server keeps serving the others.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phalanx/backends/default_timeout.hpp"
#include "phalanx/backends/store.hpp"

namespace phalanx {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;                 ///< server: 0 picks a free port (see TcpStoreServer::port())
  std::string token;            ///< job token ("" = none); defaults to PHALANX_RDZV_TOKEN
  std::chrono::milliseconds timeout{kDefaultTimeout};
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

 private:
  struct State;
  void serve();
  std::string host_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  std::string token_;
  std::atomic<int> rejected_{0};
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
