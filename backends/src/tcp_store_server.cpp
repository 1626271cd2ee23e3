// The TCP store server: one thread doing non-blocking I/O with poll() around the socket-free
// Engine (tcp_store_engine.hpp), which handles the requests and decides who is dropped.
// Replies are queued per connection and written when the socket takes them (POLLOUT), so
// a client that stops reading holds up nobody; parked GET/WAIT cost no thread.
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <vector>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/tcp_store.hpp"
#include "socket_util.hpp"
#include "tcp_store_engine.hpp"
#include "tcp_store_protocol.hpp"

namespace phalanx {

using namespace tcpstore;
using Clock = std::chrono::steady_clock;

namespace {
constexpr std::size_t kReadChunk = 64u << 10;
constexpr int kReadsPerTurn = 16;  // at most 1 MiB read per connection per turn: fairness
// Replies go out gathered, up to kPieces per sendmsg (a pipelining client's replies are a
// few bytes each), and at most kWritesPerTurn sendmsg per connection per turn: a client's
// socket buffers can take ~1M small replies, which must not keep the others waiting.
constexpr std::size_t kPieces = 64;
constexpr int kWritesPerTurn = 16;

/// The connection cap, kept below this process's open-file limit minus `reserved` (for
/// everything else the process opens), so accept() never fails for want of descriptors.
int connection_cap(int wanted, int reserved) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return wanted;
  const long usable = static_cast<long>(rl.rlim_cur) - std::max(0, reserved);
  return static_cast<int>(std::max(1L, std::min(static_cast<long>(wanted), usable)));
}
}  // namespace

struct TcpStoreServer::Conn {
  int fd = -1;
  Engine::Id id = 0;
  Clock::time_point hello_deadline;
  bool gone = false;        // to be closed (peer left or dropped)
  std::string drop_reason;  // non-empty: log it
};

struct TcpStoreServer::State {
  State(const std::string& token, const TcpStoreLimits& limits) : engine(token, limits) {}
  Engine engine;
  std::vector<Conn> conns;
  int max_connections = 0;
  Clock::time_point accept_paused_until{};
  // Log lines about dropped connections without a handshake: a burst of 20, then one a
  // second (those of the job's own clients are always written).
  double log_tokens = 20;
  Clock::time_point log_refill = Clock::now();
  int log_suppressed = 0;
};

TcpStoreServer::TcpStoreServer(const TcpStoreOptions& o)
    : host_(o.host), token_(token_or_env(o.token)), limits_(o.limits),
      state_(std::make_unique<State>(token_, o.limits)) {
  state_->max_connections = connection_cap(o.limits.max_connections, o.limits.reserved_fds);
  listen_fd_ = net::listen_on(o.host, o.port, &port_);
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
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

void TcpStoreServer::log_drop(int fd, const std::string& reason, bool rate_limited) {
  State& st = *state_;
  const auto now = Clock::now();
  st.log_tokens = std::min(20.0, st.log_tokens + std::chrono::duration<double>(now - st.log_refill).count());
  st.log_refill = now;
  if (rate_limited) {  // anyone can open connections: their lines must not flood the log
    if (st.log_tokens < 1) {
      ++st.log_suppressed;
      return;
    }
    st.log_tokens -= 1;
  }
  std::string more;
  if (st.log_suppressed > 0) more = detail::concat(" (", st.log_suppressed, " more dropped connections not logged)");
  st.log_suppressed = 0;
  std::fprintf(stderr, "[phalanx] TCP store %s:%d: dropped the connection from %s: %s%s\n", host_.c_str(), port_,
               net::peer_name(fd).c_str(), reason.c_str(), more.c_str());
}

void TcpStoreServer::accept_all() {
  State& st = *state_;
  for (int i = 0; i < 64; ++i) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        st.accept_paused_until = Clock::now() + std::chrono::milliseconds(100);  // do not spin
      return;
    }
    if (static_cast<int>(st.conns.size()) >= st.max_connections) {
      // Full: make room by dropping the oldest connection still without a handshake;
      // when every connection has completed one, refuse the newcomer.
      auto victim = std::find_if(st.conns.begin(), st.conns.end(), [&](const Conn& c) {
        return !c.gone && !st.engine.authenticated(c.id);
      });
      const std::string why = detail::concat("the store has reached its connection limit (", st.max_connections, ")");
      if (victim == st.conns.end()) {
        ++dropped_;
        log_drop(fd, why, true);
        ::close(fd);
        continue;
      }
      victim->gone = true;
      victim->drop_reason = why + " and this connection had not completed the token handshake";
      sweep();
    }
    net::set_nodelay(fd);
    Conn c;
    c.fd = fd;
    c.id = st.engine.open();
    c.hello_deadline = Clock::now() + limits_.hello_timeout;
    st.conns.push_back(c);
  }
}

void TcpStoreServer::read_from(Conn& c) {
  Engine& e = state_->engine;
  std::uint8_t buf[kReadChunk];
  for (int i = 0; i < kReadsPerTurn; ++i) {
    const std::size_t room = std::min(e.room(c.id), sizeof buf);
    if (room == 0) return;
    const ssize_t got = ::recv(c.fd, buf, room, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got <= 0) {  // closed by the peer, or reset
      c.gone = true;
      return;
    }
    e.feed(c.id, buf, static_cast<std::size_t>(got));
    rejected_.store(e.rejected_tokens());  // before the refusal is sent
    if (static_cast<std::size_t>(got) < room) return;
  }
}

void TcpStoreServer::write_to(Conn& c) {
  Engine& e = state_->engine;
  Engine::Piece pieces[kPieces];
  iovec iov[kPieces];
  for (int turn = 0; turn < kWritesPerTurn; ++turn) {
    const std::size_t n = e.output(c.id, pieces, kPieces);
    if (n == 0) return;
    for (std::size_t i = 0; i < n; ++i)
      iov[i] = {const_cast<std::uint8_t*>(pieces[i].first), pieces[i].second};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t w = ::sendmsg(c.fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // POLLOUT tells when to go on
    if (w <= 0) {
      c.gone = true;
      return;
    }
    e.wrote(c.id, static_cast<std::size_t>(w));
  }
}

void TcpStoreServer::sweep() {
  State& st = *state_;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < st.conns.size(); ++i) {
    Conn& c = st.conns[i];
    if (!c.gone && st.engine.closing(c.id)) {
      write_to(c);  // a last reply (a refused token) goes out when the socket takes it now
      c.gone = true;
      c.drop_reason = st.engine.reason(c.id);
    }
    if (c.gone) {
      if (!c.drop_reason.empty()) {
        ++dropped_;
        log_drop(c.fd, c.drop_reason, !st.engine.authenticated(c.id));
      }
      ::close(c.fd);
      st.engine.close(c.id);
      continue;
    }
    if (keep != i) st.conns[keep] = std::move(c);
    ++keep;
  }
  st.conns.resize(keep);
}

void TcpStoreServer::serve() {
  State& st = *state_;
  Engine& e = st.engine;
  std::vector<pollfd> pfds;
  for (;;) {
    const auto now = Clock::now();
    // Handshake deadlines.
    Clock::time_point next_deadline = Clock::time_point::max();
    bool expired = false;
    for (auto& c : st.conns) {
      if (e.authenticated(c.id)) continue;
      if (now >= c.hello_deadline) {
        c.gone = true;
        c.drop_reason = detail::concat("did not complete the token handshake within ",
                                       limits_.hello_timeout.count() / 1000.0, " s");
        expired = true;
      } else {
        next_deadline = std::min(next_deadline, c.hello_deadline);
      }
    }
    if (expired) sweep();
    const bool accepting = now >= st.accept_paused_until;
    if (!accepting) next_deadline = std::min(next_deadline, st.accept_paused_until);
    int timeout_ms = -1;
    if (next_deadline != Clock::time_point::max())
      timeout_ms = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - now).count() + 1);

    pfds.clear();
    pfds.push_back({wake_fd_[0], POLLIN, 0});
    pfds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (auto& c : st.conns) {
      short events = 0;
      if (e.room(c.id) > 0) events |= POLLIN;
      if (e.queued(c.id) > 0) events |= POLLOUT;
      pfds.push_back({c.fd, events, 0});
    }
    if (::poll(pfds.data(), pfds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (pfds[0].revents) {  // shutting down
      if (st.log_suppressed > 0)
        std::fprintf(stderr, "[phalanx] TCP store %s:%d: %d more dropped connections were not logged\n",
                     host_.c_str(), port_, st.log_suppressed);
      return;
    }
    const std::size_t nconn = pfds.size() - 2;
    for (std::size_t i = 0; i < nconn; ++i) {
      const short rev = pfds[i + 2].revents;
      if (!rev) continue;
      Conn& c = st.conns[i];
      if (rev & POLLOUT) write_to(c);
      if (rev & POLLIN) read_from(c);
      else if (rev & (POLLHUP | POLLERR | POLLNVAL)) c.gone = true;
    }
    // Input may have produced replies on any connection (a SET wakes parked GETs): send them.
    for (auto& c : st.conns)
      if (!c.gone && e.queued(c.id) > 0) write_to(c);
    sweep();
    if (pfds[1].revents & POLLIN) accept_all();
  }
}

}  // namespace phalanx
