#pragma once
// The TCP store's request handling without sockets: the server feeds it the bytes each
// connection received and writes out the replies it queues. It owns the data, every
// connection's protocol state (handshake, a parked GET/WAIT, partial frames, queued
// replies) and the limits of TcpStoreLimits; it decides when a connection must go.
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "phalanx/backends/tcp_store.hpp"

namespace phalanx::tcpstore {

class Engine {
 public:
  using Id = std::uint64_t;
  using Value = std::shared_ptr<const Bytes>;
  using Piece = std::pair<const std::uint8_t*, std::size_t>;

  Engine(std::string token, const TcpStoreLimits& limits);

  /// A new connection (ids are never reused).
  Id open();
  /// Forgets a connection: the peer left, or the server acted on closing().
  void close(Id id);

  /// How many bytes the server may read for this connection now; 0 = do not read (it is
  /// closing, its input is full while a GET/WAIT is parked, or its queued replies are over
  /// limits().pause_reading_above: its requests are handled again as wrote() drains them).
  std::size_t room(Id id) const;
  /// Bytes received (at most room()); complete frames are handled at once.
  void feed(Id id, const std::uint8_t* data, std::size_t n);

  /// The next queued reply bytes (size 0 when none); wrote() drops what was sent, and once
  /// the queue is small again handles the requests that waited behind it (which may queue
  /// replies on this and other connections).
  Piece output(Id id) const;
  /// Up to `max` pieces of the queued reply bytes, in order (for one gathering write);
  /// returns how many it filled. wrote() takes any count of bytes up to their sum.
  std::size_t output(Id id, Piece* pieces, std::size_t max) const;
  void wrote(Id id, std::size_t n);
  std::size_t queued(Id id) const;  ///< reply bytes not yet sent

  /// The connection must be closed (after flushing what output() still holds). reason()
  /// is a one-line explanation for the log; empty when nothing needs logging.
  bool closing(Id id) const;
  const std::string& reason(Id id) const;
  bool authenticated(Id id) const;

  std::size_t connections() const { return conns_.size(); }
  std::size_t buffered_total() const { return buffered_; }
  int rejected_tokens() const { return rejected_; }
  std::size_t keys() const { return data_.size(); }
  const TcpStoreLimits& limits() const { return limits_; }

 private:
  struct Chunk {
    Bytes own;    // header bytes (and small replies)
    Value value;  // a stored value sent without copying (may be null)
  };
  struct Conn {
    Bytes in;                   // received bytes not yet handled
    std::deque<Chunk> out;      // queued replies; out_off bytes of the front chunk are sent
    std::size_t out_off = 0;
    std::size_t out_bytes = 0;  // reply bytes not yet sent (shared values included)
    std::size_t out_cost = 0;   // memory the queued chunks hold: owned + their shared values
    std::size_t out_owned = 0;  // memory owned by the queue (counted in buffered_)
    bool hello = false;
    bool closing = false;
    std::string reason;
    bool parked = false;        // a GET/WAIT waits for parked_keys
    std::uint8_t parked_cmd = 0;
    std::vector<std::string> parked_keys;
    std::string parked_on;      // the missing key it is registered under in waiters_
  };

  Conn* find(Id id);
  const Conn* find(Id id) const;
  void drop(Conn& c, std::string reason, bool keep_output);
  bool paused(const Conn& c) const { return c.out_cost > limits_.pause_reading_above; }
  void pop_output(Conn& c);
  void resume_woken();
  std::size_t input_cap(const Conn& c) const;
  bool stash(Conn& c, const std::uint8_t* p, std::size_t n);
  void take(Id id, Conn& c);
  void fit_buffer(Conn& c);
  std::size_t consume(Id id, Conn& c, const std::uint8_t* p, std::size_t n);
  void handle(Id id, Conn& c, const std::uint8_t* p, std::size_t n);
  void answer_or_park(Id id, Conn& c, std::uint8_t cmd, std::vector<std::string> keys);
  const std::string* first_missing(const std::vector<std::string>& keys) const;
  void reply(Conn& c, Bytes frame, Value value = nullptr);
  void set_value(const std::string& key, Value v);
  void wake(const std::string& key);

  std::string token_;
  TcpStoreLimits limits_;
  std::map<std::string, Value> data_;
  std::unordered_map<Id, Conn> conns_;
  std::unordered_map<std::string, std::vector<Id>> waiters_;  // key -> parked connections
  std::vector<Id> woken_;  // connections unparked by the current request, resumed after it
  Id next_id_ = 1;
  std::size_t buffered_ = 0;
  int rejected_ = 0;
};

}  // namespace phalanx::tcpstore
