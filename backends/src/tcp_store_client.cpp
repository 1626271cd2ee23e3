#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/tcp_store.hpp"
#include "socket_util.hpp"
#include "tcp_store_protocol.hpp"

namespace phalanx {

using namespace tcpstore;
using Clock = std::chrono::steady_clock;

namespace {
/// Connects (retrying with backoff until the deadline) and performs the handshake.
int connect_and_hello(const std::string& host, int port, const std::string& token,
                      std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error = "no attempt";
  for (;;) {
    const int fd = net::connect_once(host, port);
    if (fd >= 0) {
      const Bytes hello = Writer(kHello).str(token).finish();
      std::uint32_t len = 0;
      std::uint8_t status = 255;
      if (net::send_all(fd, hello.data(), hello.size()) &&
          net::recv_all(fd, &len, 4, deadline) == 1 && len == 1 &&
          net::recv_all(fd, &status, 1, deadline) == 1) {
        if (status == kOk) return fd;
        ::close(fd);
        if (status == kBadToken)
          throw ConfigError(detail::concat(
              "the rendezvous store at ", host, ":", port,
              " refused this worker's job token (PHALANX_RDZV_TOKEN): the store belongs to another "
              "job, or the launcher's token was not passed to this worker"));
      } else {
        ::close(fd);
      }
      last_error = "the server closed the connection during the handshake";
    } else {
      last_error = std::strerror(errno);
    }
    if (Clock::now() + backoff >= deadline)
      throw TimeoutError(detail::concat("cannot reach the rendezvous store at ", host, ":", port,
                                        " within ", timeout.count() / 1000.0, " s (", last_error,
                                        "); is rank 0 (or the launcher) running, and are MASTER_ADDR "
                                        "and MASTER_PORT the same on every worker?"));
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}
}  // namespace

TcpStore::TcpStore(const TcpStoreOptions& o)
    : host_(o.host), port_(o.port), token_(token_or_env(o.token)),
      endpoint_(o.host + ":" + std::to_string(o.port)) {
  timeout_ = o.timeout;
  idle_.push_back(connect_and_hello(host_, port_, token_, o.timeout));
}

TcpStore::~TcpStore() {
  for (int fd : idle_) ::close(fd);
}

Bytes TcpStore::request(const Bytes& frame, std::chrono::milliseconds timeout, const std::string& what) {
  if (frame.size() - 4 > kMaxFrame)  // the server would drop the connection
    throw ValueError(detail::concat("TCP store ", endpoint_, ": ", what, " needs a frame of ", frame.size() - 4,
                                    " bytes, over the store's limit of ", kMaxFrame,
                                    " (64 MiB); exchange large data through a collective, not the store"));
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      fd = idle_.back();
      idle_.pop_back();
    }
  }
  // A new connection after the first: the server was up, so do not wait long for it.
  if (fd < 0) fd = connect_and_hello(host_, port_, token_, std::min(timeout_, std::chrono::milliseconds(5000)));
  const auto deadline = Clock::now() + timeout;
  if (!net::send_all(fd, frame.data(), frame.size())) {
    ::close(fd);
    throw CommError("TCP store " + endpoint_ + ": connection lost while sending " + what +
                    " (did the process hosting the store exit?)");
  }
  std::uint32_t len = 0;
  int rc = net::recv_all(fd, &len, 4, deadline);
  Bytes payload;
  if (rc == 1) {
    if (len == 0 || len > kMaxFrame) rc = 0;
    else {
      payload.resize(len);
      rc = net::recv_all(fd, payload.data(), len, deadline);
    }
  }
  if (rc != 1) {
    // The server may still answer later: this connection is out of step, so close it.
    ::close(fd);
    if (rc < 0) return {};  // timeout: the caller raises with the keys it waited for
    throw CommError("TCP store " + endpoint_ + ": connection lost while waiting for " + what +
                    " (did the process hosting the store exit?)");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(fd);
  }
  if (payload[0] == kError) {
    Reader r(payload.data() + 1, payload.size() - 1);
    throw ValueError(r.str());
  }
  return payload;
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  request(Writer(kSet).str(key).bytes(value).finish(), timeout_, "set '" + key + "'");
}

Bytes TcpStore::get(const std::string& key) {
  const Bytes p = request(Writer(kGet).str(key).finish(), timeout_, "get '" + key + "'");
  if (p.empty()) throw_store_timeout({key}, timeout_, "TCP store " + endpoint_);
  Reader r(p.data() + 1, p.size() - 1);
  return r.bytes();
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  const Bytes p = request(Writer(kAdd).str(key).i64(delta).finish(), timeout_, "add '" + key + "'");
  if (p.empty()) throw_store_timeout({key}, timeout_, "TCP store " + endpoint_);
  Reader r(p.data() + 1, p.size() - 1);
  return r.i64();
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const Bytes p = request(Writer(kCas).str(key).bytes(expected).bytes(desired).finish(), timeout_,
                          "compare_set '" + key + "'");
  if (p.empty()) throw_store_timeout({key}, timeout_, "TCP store " + endpoint_);
  Reader r(p.data() + 1, p.size() - 1);
  return r.bytes();
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Writer w(kWait);
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const Bytes p = request(w.finish(), timeout, "wait");
  if (!p.empty()) return;
  // Timed out: ask (on another connection) which keys are missing, for the message.
  std::vector<std::string> missing = keys;
  try {
    missing.clear();
    for (const auto& k : keys)
      if (!check({k})) missing.push_back(k);
  } catch (...) {
    missing = keys;
  }
  throw_store_timeout(missing, timeout, "TCP store " + endpoint_);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  Writer w(kCheck);
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const Bytes p = request(w.finish(), timeout_, "check");
  if (p.empty()) throw_store_timeout(keys, timeout_, "TCP store " + endpoint_);
  return p.size() > 1 && p[1] == 1;
}

bool TcpStore::delete_key(const std::string& key) {
  const Bytes p = request(Writer(kDelete).str(key).finish(), timeout_, "delete '" + key + "'");
  if (p.empty()) throw_store_timeout({key}, timeout_, "TCP store " + endpoint_);
  return p.size() > 1 && p[1] == 1;
}

std::int64_t TcpStore::num_keys() {
  const Bytes p = request(Writer(kNumKeys).finish(), timeout_, "num_keys");
  if (p.empty()) throw_store_timeout({}, timeout_, "TCP store " + endpoint_);
  Reader r(p.data() + 1, p.size() - 1);
  return r.i64();
}

}  // namespace phalanx
