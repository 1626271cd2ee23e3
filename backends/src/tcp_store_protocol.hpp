#pragma once
// Frames of the TCP store protocol (docs/store_protocol.md).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "phalanx/backends/store.hpp"
#include "phalanx/core/env.hpp"

namespace phalanx::tcpstore {

enum Cmd : std::uint8_t { kHello = 1, kSet, kGet, kAdd, kCas, kWait, kCheck, kDelete, kNumKeys };
enum Status : std::uint8_t { kOk = 0, kBadToken = 1, kError = 2 };
constexpr std::uint32_t kMaxFrame = 64u << 20;  // larger frames are refused

/// The job token when the options name none: PHALANX_RDZV_TOKEN, or "" (no token).
inline std::string token_or_env(const std::string& token) {
  if (!token.empty()) return token;
  return env::text("PHALANX_RDZV_TOKEN").value_or("");
}

/// Builds a frame: [u32 length][payload].
class Writer {
 public:
  explicit Writer(std::uint8_t first) { buf_.resize(4); buf_.push_back(first); }
  Writer& u8(std::uint8_t v) { buf_.push_back(v); return *this; }
  Writer& u32(std::uint32_t v) { return raw(&v, 4); }
  Writer& i64(std::int64_t v) { return raw(&v, 8); }
  Writer& str(const std::string& s) { u32(static_cast<std::uint32_t>(s.size())); return raw(s.data(), s.size()); }
  Writer& bytes(const Bytes& b) { u32(static_cast<std::uint32_t>(b.size())); return raw(b.data(), b.size()); }
  Bytes finish() {
    const auto n = static_cast<std::uint32_t>(buf_.size() - 4);
    std::memcpy(buf_.data(), &n, 4);
    return std::move(buf_);
  }

 private:
  Writer& raw(const void* p, std::size_t n) {
    const auto* c = static_cast<const std::uint8_t*>(p);
    buf_.insert(buf_.end(), c, c + n);
    return *this;
  }
  Bytes buf_;
};

/// The header of a reply carrying a value: [u32 length][u8 kOk][u32 value size]; the
/// value's bytes follow (sent from the stored value itself, without a copy).
inline Bytes value_reply_header(std::size_t value_size) {
  Bytes h(9);
  const auto len = static_cast<std::uint32_t>(5 + value_size);
  const auto vs = static_cast<std::uint32_t>(value_size);
  std::memcpy(h.data(), &len, 4);
  h[4] = kOk;
  std::memcpy(h.data() + 5, &vs, 4);
  return h;
}

/// Reads fields from a payload; every read checks bounds (ok() turns false on overrun).
class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == n_; }
  std::uint8_t u8() { std::uint8_t v = 0; raw(&v, 1); return v; }
  std::uint32_t u32() { std::uint32_t v = 0; raw(&v, 4); return v; }
  std::int64_t i64() { std::int64_t v = 0; raw(&v, 8); return v; }
  std::string str() {
    const std::uint32_t n = u32();
    if (!ok_ || n > n_ - pos_) { ok_ = false; return {}; }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }
  Bytes bytes() {
    const std::uint32_t n = u32();
    if (!ok_ || n > n_ - pos_) { ok_ = false; return {}; }
    Bytes b(p_ + pos_, p_ + pos_ + n);
    pos_ += n;
    return b;
  }

 private:
  void raw(void* out, std::size_t n) {
    if (!ok_ || n > n_ - pos_) { ok_ = false; return; }
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
  }
  const std::uint8_t* p_;
  std::size_t n_, pos_ = 0;
  bool ok_ = true;
};

}  // namespace phalanx::tcpstore
