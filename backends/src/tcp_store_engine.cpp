#include "tcp_store_engine.hpp"

#include <algorithm>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "phalanx/backends/comm_error.hpp"
#include "tcp_store_protocol.hpp"

namespace phalanx::tcpstore {

namespace {
constexpr std::size_t kShrinkAbove = 1u << 20;  // give back input buffers larger than this

/// What one queued reply costs beyond its own bytes (charged as their capacity) and its
/// queue entry (sizeof(Chunk)): the allocator's header and rounding, and a share of the
/// queue's blocks. A pipelining client's small replies are mostly this, so it is counted.
constexpr std::size_t kReplyOverhead = 64;

/// After freeing this much at once, ask the allocator to return free memory to the system:
/// without it, glibc keeps a dropped connection's buffers (and its many small replies) as
/// free heap, and the hosting process stays at its peak.
constexpr std::size_t kTrimAbove = 4u << 20;

void give_back_memory(std::size_t freed) {
#if defined(__GLIBC__)
  if (freed >= kTrimAbove) ::malloc_trim(0);
#else
  (void)freed;
#endif
}

/// A key as shown in a message: at most 100 characters.
std::string shown(const std::string& key) {
  return key.size() <= 100 ? key : key.substr(0, 100) + "...";
}
}  // namespace

Engine::Engine(std::string token, const TcpStoreLimits& limits) : token_(std::move(token)), limits_(limits) {
  limits_.max_frame = std::min<std::size_t>(limits_.max_frame, kMaxFrame);  // what clients accept
  limits_.max_frame_before_hello = std::min(limits_.max_frame_before_hello, limits_.max_frame);
}

Engine::Id Engine::open() {
  const Id id = next_id_++;
  conns_.emplace(id, Conn{});
  return id;
}

Engine::Conn* Engine::find(Id id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}

const Engine::Conn* Engine::find(Id id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}

void Engine::close(Id id) {
  Conn* c = find(id);
  if (!c) return;
  buffered_ -= c->in.size() + c->out_owned;
  const std::size_t freed = c->in.capacity() + c->out_cost;
  if (c->parked) {
    auto it = waiters_.find(c->parked_on);
    if (it != waiters_.end()) {
      auto& ids = it->second;
      ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
      if (ids.empty()) waiters_.erase(it);
    }
  }
  conns_.erase(id);
  give_back_memory(freed);
}

void Engine::drop(Conn& c, std::string reason, bool keep_output) {
  if (c.closing) return;
  c.closing = true;
  c.reason = std::move(reason);
  if (!keep_output) {
    const std::size_t freed = c.out_cost;
    buffered_ -= c.out_owned;
    c.out.clear();
    c.out.shrink_to_fit();
    c.out_off = c.out_bytes = c.out_cost = c.out_owned = 0;
    give_back_memory(freed);
  }
}

std::size_t Engine::input_cap(const Conn& c) const {
  return 4 + (c.hello ? limits_.max_frame : limits_.max_frame_before_hello);
}

std::size_t Engine::room(Id id) const {
  const Conn* c = find(id);
  if (!c || c->closing || paused(*c)) return 0;
  const std::size_t cap = input_cap(*c);
  return c->in.size() < cap ? cap - c->in.size() : 0;
}

void Engine::feed(Id id, const std::uint8_t* data, std::size_t n) {
  Conn* c = find(id);
  if (!c || c->closing || n == 0) return;
  if (n > room(id)) {  // the server reads at most room(); more is a bug in the caller
    drop(*c, "more input than the connection's buffer allows", false);
    return;
  }
  if (c->in.empty()) {
    const std::size_t used = consume(id, *c, data, n);  // complete frames, without a copy
    if (!c->closing) stash(*c, data + used, n - used);
  } else {
    if (!stash(*c, data, n)) return;
    take(id, *c);
  }
  resume_woken();
}

void Engine::resume_woken() {
  // Parked requests this input answered: handle what their connections sent meanwhile.
  for (std::size_t i = 0; i < woken_.size(); ++i) {
    Conn* w = find(woken_[i]);
    if (w && !w->closing && !w->parked && !w->in.empty()) take(woken_[i], *w);
  }
  woken_.clear();
}

bool Engine::stash(Conn& c, const std::uint8_t* p, std::size_t n) {
  if (n == 0) return true;
  if (buffered_ + n > limits_.max_buffered_total) {
    drop(c, detail::concat("the store's buffers are full (", buffered_, " bytes over all connections, limit ",
                           limits_.max_buffered_total, "); this connection asked for ", n, " more"),
         false);
    return false;
  }
  c.in.insert(c.in.end(), p, p + n);
  buffered_ += n;
  fit_buffer(c);
  return true;
}

void Engine::fit_buffer(Conn& c) {
  // Room for the whole frame at once, so that a large value is not copied while it grows;
  // a buffer that held a large frame is given back once that frame is handled.
  std::size_t need = c.in.size();
  if (need >= 4) {
    std::uint32_t len;
    std::memcpy(&len, c.in.data(), 4);
    if (len > 0 && len <= input_cap(c) - 4) need = std::max(need, 4 + static_cast<std::size_t>(len));
  }
  if (c.in.capacity() < need) {
    c.in.reserve(need);
  } else if (c.in.capacity() > std::max(need, kShrinkAbove)) {
    const std::size_t freed = c.in.capacity() - need;
    Bytes fitted;
    fitted.reserve(need);
    fitted.assign(c.in.begin(), c.in.end());
    c.in.swap(fitted);
    fitted = Bytes();
    give_back_memory(freed);
  }
}

void Engine::take(Id id, Conn& c) {
  const std::size_t used = consume(id, c, c.in.data(), c.in.size());
  if (c.closing) {
    buffered_ -= c.in.size();
    c.in = Bytes();
    return;
  }
  if (used == 0) return;
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(used));
  buffered_ -= used;
  fit_buffer(c);
}

std::size_t Engine::consume(Id id, Conn& c, const std::uint8_t* p, std::size_t n) {
  std::size_t pos = 0;
  // Stops while the replies already queued are over the pause bound: the rest waits in the
  // connection's input (and in the kernel) until its client reads (wrote()).
  while (!c.closing && !c.parked && !paused(c) && n - pos >= 4) {
    std::uint32_t len;
    std::memcpy(&len, p + pos, 4);
    if (len == 0) {
      drop(c, "sent an empty frame", false);
      break;
    }
    const std::size_t limit = input_cap(c) - 4;
    if (len > limit) {
      drop(c, c.hello ? detail::concat("sent a frame of ", len, " bytes (limit ", limit, ")")
                      : detail::concat("announced a frame of ", len, " bytes before the token handshake (limit ",
                                       limit, ")"),
           false);
      break;
    }
    if (n - pos - 4 < len) break;  // truncated so far: wait for more
    handle(id, c, p + pos + 4, len);
    pos += 4 + static_cast<std::size_t>(len);
  }
  return pos;
}

const std::string* Engine::first_missing(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!data_.count(k)) return &k;
  return nullptr;
}

void Engine::reply(Conn& c, Bytes frame, Value value) {
  if (c.closing) return;
  if (value && value->empty()) value = nullptr;
  // Charged: the bytes it owns (their capacity) and its bookkeeping; a shared value counts
  // for this connection's queue, not for the total (the store holds it anyway).
  const std::size_t own = frame.capacity() + kReplyOverhead + sizeof(Chunk);
  const std::size_t vsize = value ? value->size() : 0, wire = frame.size() + vsize;
  if (c.out_cost + own + vsize > limits_.max_output_per_connection) {
    drop(c, detail::concat("does not read its replies (", c.out_cost + own + vsize,
                           " bytes would be queued, limit ", limits_.max_output_per_connection, ")"),
         false);
    return;
  }
  if (buffered_ + own > limits_.max_buffered_total) {
    drop(c, detail::concat("the store's buffers are full (", buffered_, " bytes over all connections, limit ",
                           limits_.max_buffered_total, ")"),
         false);
    return;
  }
  c.out.push_back(Chunk{std::move(frame), std::move(value)});
  c.out_bytes += wire;
  c.out_cost += own + vsize;
  c.out_owned += own;
  buffered_ += own;
}

void Engine::pop_output(Conn& c) {
  const Chunk& f = c.out.front();
  const std::size_t own = f.own.capacity() + kReplyOverhead + sizeof(Chunk);
  c.out_cost -= own + (f.value ? f.value->size() : 0);
  c.out_owned -= own;
  buffered_ -= own;
  c.out.pop_front();
  c.out_off = 0;
}

void Engine::set_value(const std::string& key, Value v) {
  data_[key] = std::move(v);
  wake(key);
}

void Engine::wake(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  const std::vector<Id> ids = std::move(it->second);
  waiters_.erase(it);
  for (Id wid : ids) {
    Conn* w = find(wid);
    if (!w || !w->parked) continue;
    w->parked = false;
    answer_or_park(wid, *w, w->parked_cmd, std::move(w->parked_keys));
    if (!w->parked) woken_.push_back(wid);
  }
}

void Engine::answer_or_park(Id id, Conn& c, std::uint8_t cmd, std::vector<std::string> keys) {
  if (const std::string* missing = first_missing(keys)) {
    c.parked = true;
    c.parked_cmd = cmd;
    c.parked_on = *missing;
    c.parked_keys = std::move(keys);
    waiters_[c.parked_on].push_back(id);
    return;
  }
  if (cmd == kGet) {
    const Value& v = data_.at(keys[0]);
    reply(c, value_reply_header(v->size()), v);
  } else {
    reply(c, Writer(kOk).finish());
  }
}

void Engine::handle(Id id, Conn& c, const std::uint8_t* p, std::size_t n) {
  Reader r(p, n);
  const std::uint8_t cmd = r.u8();
  auto malformed = [&](const char* what) {
    drop(c, detail::concat("sent a malformed ", what, " request"), false);
  };
  if (!c.hello) {
    if (cmd != kHello) return drop(c, "sent a request before the token handshake (HELLO)", false);
    const std::string token = r.str();
    if (!r.ok() || !r.done()) return malformed("HELLO");
    if (!token_.empty() && token != token_) {
      ++rejected_;
      reply(c, Writer(kBadToken).finish());
      return drop(c, "wrong job token (PHALANX_RDZV_TOKEN)", true);
    }
    c.hello = true;
    return reply(c, Writer(kOk).finish());
  }
  switch (cmd) {
    case kSet: {
      std::string key = r.str();
      Bytes v = r.bytes();
      if (!r.ok() || !r.done()) return malformed("SET");
      set_value(key, std::make_shared<const Bytes>(std::move(v)));
      return reply(c, Writer(kOk).finish());
    }
    case kGet:
    case kWait: {
      std::vector<std::string> keys;
      if (cmd == kGet) {
        keys.push_back(r.str());
      } else {
        const std::uint32_t count = r.u32();
        if (r.ok() && count <= n / 4) {  // every key takes at least its 4-byte length
          keys.reserve(count);
          for (std::uint32_t i = 0; i < count && r.ok(); ++i) keys.push_back(r.str());
        } else {
          return malformed("WAIT");
        }
      }
      if (!r.ok() || !r.done()) return malformed(cmd == kGet ? "GET" : "WAIT");
      return answer_or_park(id, c, cmd, std::move(keys));
    }
    case kAdd: {
      std::string key = r.str();
      const std::int64_t delta = r.i64();
      if (!r.ok() || !r.done()) return malformed("ADD");
      std::int64_t v = delta;
      auto it = data_.find(key);
      if (it != data_.end()) {
        const Bytes& old = *it->second;
        if (old.size() > 24)
          return reply(c, Writer(kError)
                              .str(detail::concat("store: key '", shown(key), "' holds ", old.size(),
                                                  " bytes, not an integer"))
                              .finish());
        std::int64_t base = 0;
        try {
          base = parse_store_int(old, shown(key));
        } catch (const ValueError& e) {
          return reply(c, Writer(kError).str(e.what()).finish());
        }
        if (__builtin_add_overflow(base, delta, &v))
          return reply(c, Writer(kError)
                              .str(detail::concat("store: adding ", delta, " to key '", shown(key), "' (", base,
                                                  ") overflows a 64-bit integer"))
                              .finish());
      }
      const std::string s = std::to_string(v);
      set_value(key, std::make_shared<const Bytes>(s.begin(), s.end()));
      return reply(c, Writer(kOk).i64(v).finish());
    }
    case kCas: {
      std::string key = r.str();
      Bytes expected = r.bytes(), desired = r.bytes();
      if (!r.ok() || !r.done()) return malformed("COMPARE_SET");
      auto it = data_.find(key);
      if ((it == data_.end() && expected.empty()) || (it != data_.end() && *it->second == expected))
        set_value(key, std::make_shared<const Bytes>(std::move(desired)));
      auto now = data_.find(key);
      if (now == data_.end()) return reply(c, value_reply_header(0));
      return reply(c, value_reply_header(now->second->size()), now->second);
    }
    case kCheck: {
      const std::uint32_t count = r.u32();
      if (!r.ok() || count > n / 4) return malformed("CHECK");
      bool all = true;
      for (std::uint32_t i = 0; i < count && r.ok(); ++i) all = data_.count(r.str()) > 0 && all;
      if (!r.ok() || !r.done()) return malformed("CHECK");
      return reply(c, Writer(kOk).u8(all ? 1 : 0).finish());
    }
    case kDelete: {
      std::string key = r.str();
      if (!r.ok() || !r.done()) return malformed("DELETE");
      const bool erased = data_.erase(key) > 0;
      return reply(c, Writer(kOk).u8(erased ? 1 : 0).finish());
    }
    case kNumKeys:
      if (!r.done()) return malformed("NUM_KEYS");
      return reply(c, Writer(kOk).i64(static_cast<std::int64_t>(data_.size())).finish());
    default:
      return drop(c, detail::concat("sent an unknown command (", int(cmd), ")"), false);
  }
}

Engine::Piece Engine::output(Id id) const {
  Piece p{nullptr, 0};
  return output(id, &p, 1) == 1 ? p : Piece{nullptr, 0};
}

std::size_t Engine::output(Id id, Piece* pieces, std::size_t max) const {
  const Conn* c = find(id);
  if (!c) return 0;
  std::size_t k = 0, off = c->out_off;  // bytes of the front chunk already sent
  for (auto it = c->out.begin(); it != c->out.end() && k < max; ++it, off = 0) {
    const Bytes& own = it->own;
    if (off < own.size()) {
      pieces[k++] = {own.data() + off, own.size() - off};
      off = own.size();
    }
    if (k < max && it->value && off - own.size() < it->value->size())
      pieces[k++] = {it->value->data() + (off - own.size()), it->value->size() - (off - own.size())};
  }
  return k;
}

void Engine::wrote(Id id, std::size_t n) {
  Conn* c = find(id);
  if (!c || n == 0) return;
  while (n > 0 && !c->out.empty()) {
    const Chunk& f = c->out.front();
    const std::size_t seg = f.own.size() + (f.value ? f.value->size() : 0);
    const std::size_t k = std::min(n, seg - c->out_off);
    c->out_off += k;
    c->out_bytes -= k;
    n -= k;
    if (c->out_off < seg) break;
    pop_output(*c);
  }
  // The queue is small again: handle the requests that waited behind it.
  if (!c->closing && !c->parked && !c->in.empty() && !paused(*c)) {
    take(id, *c);
    resume_woken();
  }
}

std::size_t Engine::queued(Id id) const {
  const Conn* c = find(id);
  return c ? c->out_bytes : 0;
}

bool Engine::closing(Id id) const {
  const Conn* c = find(id);
  return !c || c->closing;
}

const std::string& Engine::reason(Id id) const {
  static const std::string none;
  const Conn* c = find(id);
  return c ? c->reason : none;
}

bool Engine::authenticated(Id id) const {
  const Conn* c = find(id);
  return c && c->hello;
}

}  // namespace phalanx::tcpstore
