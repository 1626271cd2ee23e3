// The TCP store server: one thread, poll() over every connection. Blocking requests (GET,
// WAIT) are parked until their keys exist, so they cost no thread.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/tcp_store.hpp"
#include "socket_util.hpp"
#include "tcp_store_protocol.hpp"

namespace phalanx {

using namespace tcpstore;

struct TcpStoreServer::State {
  struct Conn {
    int fd = -1;
    Bytes in;
    bool hello = false;
    // a parked GET / WAIT
    bool parked = false;
    std::uint8_t parked_cmd = 0;
    std::vector<std::string> parked_keys;
  };
  std::map<std::string, Bytes> data;
  std::vector<Conn> conns;
};

TcpStoreServer::TcpStoreServer(const TcpStoreOptions& o)
    : host_(o.host), token_(token_or_env(o.token)), state_(std::make_unique<State>()) {
  listen_fd_ = net::listen_on(o.host, o.port, &port_);
  if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    throw CommError("TCP store server: cannot create its wake-up pipe");
  }
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char x = 1;
  if (::write(wake_fd_[1], &x, 1) < 0) {
  }
  if (thread_.joinable()) thread_.join();
  for (auto& c : state_->conns) ::close(c.fd);
  ::close(listen_fd_);
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
}

void TcpStoreServer::serve() {
  State& st = *state_;
  auto reply = [](State::Conn& c, Bytes frame) { return net::send_all(c.fd, frame.data(), frame.size()); };
  auto has_all = [&](const std::vector<std::string>& keys) {
    for (const auto& k : keys)
      if (!st.data.count(k)) return false;
    return true;
  };
  // Answers parked requests whose keys now exist; false when a connection died.
  auto wake_parked = [&] {
    for (auto& c : st.conns) {
      if (!c.parked || !has_all(c.parked_keys)) continue;
      c.parked = false;
      Writer w(kOk);
      if (c.parked_cmd == kGet) w.bytes(st.data[c.parked_keys[0]]);
      if (!reply(c, w.finish())) c.in.clear(), c.hello = false, c.parked_keys.clear(), c.fd = -c.fd - 1;
    }
  };

  // Handles one complete payload; returns false to drop the connection.
  auto handle = [&](State::Conn& c, const std::uint8_t* p, std::size_t n, bool& changed) -> bool {
    Reader r(p, n);
    const std::uint8_t cmd = r.u8();
    if (!c.hello) {
      if (cmd != kHello) return false;  // garbage or a client that skipped the handshake
      const std::string token = r.str();
      if (!r.ok() || !r.done()) return false;
      if (!token_.empty() && token != token_) {
        ++rejected_;
        std::fprintf(stderr, "[phalanx] TCP store %s:%d: refused a connection from %s: wrong job token\n",
                     host_.c_str(), port_, net::peer_name(c.fd).c_str());
        reply(c, Writer(kBadToken).finish());
        return false;
      }
      c.hello = true;
      return reply(c, Writer(kOk).finish());
    }
    switch (cmd) {
      case kSet: {
        std::string key = r.str();
        Bytes v = r.bytes();
        if (!r.ok() || !r.done()) return false;
        st.data[key] = std::move(v);
        changed = true;
        return reply(c, Writer(kOk).finish());
      }
      case kGet:
      case kWait: {
        std::vector<std::string> keys;
        if (cmd == kGet) {
          keys.push_back(r.str());
        } else {
          const std::uint32_t count = r.u32();
          if (!r.ok() || count > n) return false;
          for (std::uint32_t i = 0; i < count && r.ok(); ++i) keys.push_back(r.str());
        }
        if (!r.ok() || !r.done()) return false;
        if (has_all(keys)) {
          Writer w(kOk);
          if (cmd == kGet) w.bytes(st.data[keys[0]]);
          return reply(c, w.finish());
        }
        c.parked = true;
        c.parked_cmd = cmd;
        c.parked_keys = std::move(keys);
        return true;
      }
      case kAdd: {
        std::string key = r.str();
        const std::int64_t delta = r.i64();
        if (!r.ok() || !r.done()) return false;
        std::int64_t v = delta;
        auto it = st.data.find(key);
        if (it != st.data.end()) {
          try {
            v += parse_store_int(it->second, key);
          } catch (const std::exception& e) {
            return reply(c, Writer(kError).str(e.what()).finish());
          }
        }
        const std::string s = std::to_string(v);
        st.data[key] = Bytes(s.begin(), s.end());
        changed = true;
        return reply(c, Writer(kOk).i64(v).finish());
      }
      case kCas: {
        std::string key = r.str();
        Bytes expected = r.bytes(), desired = r.bytes();
        if (!r.ok() || !r.done()) return false;
        auto it = st.data.find(key);
        if ((it == st.data.end() && expected.empty()) || (it != st.data.end() && it->second == expected)) {
          st.data[key] = desired;
          changed = true;
        }
        auto now = st.data.find(key);
        return reply(c, Writer(kOk).bytes(now == st.data.end() ? Bytes{} : now->second).finish());
      }
      case kCheck: {
        const std::uint32_t count = r.u32();
        if (!r.ok() || count > n) return false;
        std::vector<std::string> keys;
        for (std::uint32_t i = 0; i < count && r.ok(); ++i) keys.push_back(r.str());
        if (!r.ok() || !r.done()) return false;
        return reply(c, Writer(kOk).u8(has_all(keys) ? 1 : 0).finish());
      }
      case kDelete: {
        std::string key = r.str();
        if (!r.ok() || !r.done()) return false;
        const bool erased = st.data.erase(key) > 0;
        return reply(c, Writer(kOk).u8(erased ? 1 : 0).finish());
      }
      case kNumKeys:
        if (!r.done()) return false;
        return reply(c, Writer(kOk).i64(static_cast<std::int64_t>(st.data.size())).finish());
      default:
        return false;  // unknown command: drop this connection, keep serving the others
    }
  };

  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    pfds.push_back({wake_fd_[0], POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    for (auto& c : st.conns) pfds.push_back({c.fd, POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (pfds[0].revents) return;  // shutting down
    if (pfds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        net::set_nodelay(fd);
        State::Conn conn;
        conn.fd = fd;
        st.conns.push_back(std::move(conn));
      }
    }
    bool changed = false;
    const std::size_t nconn = pfds.size() - 2;
    for (std::size_t i = 0; i < nconn; ++i) {
      if (!pfds[i + 2].revents) continue;
      State::Conn& c = st.conns[i];
      std::uint8_t buf[65536];
      const ssize_t got = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      bool keep = got > 0;
      if (keep) c.in.insert(c.in.end(), buf, buf + got);
      // Process every complete frame in the buffer.
      while (keep && c.in.size() >= 4 && !c.parked) {
        std::uint32_t len;
        std::memcpy(&len, c.in.data(), 4);
        if (len == 0 || len > kMaxFrame) {
          keep = false;
          break;
        }
        if (c.in.size() < 4 + static_cast<std::size_t>(len)) break;  // truncated so far: wait
        keep = handle(c, c.in.data() + 4, len, changed);
        c.in.erase(c.in.begin(), c.in.begin() + 4 + len);
      }
      if (!keep) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    if (changed) wake_parked();
    // Drop closed connections (and those a failed reply marked negative).
    std::vector<State::Conn> alive;
    for (auto& c : st.conns) {
      if (c.fd >= 0) alive.push_back(std::move(c));
      else if (c.fd < -1) ::close(-c.fd - 1);
    }
    st.conns = std::move(alive);
  }
}

}  // namespace phalanx
