#pragma once
// Rendezvous stores: a small key-value service ranks use to find each other. Separate
// from collectives. Keys are strings, values bytes. Blocking reads wait for the key up to
// the store's timeout, then throw TimeoutError naming the key(s).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phalanx/backends/default_timeout.hpp"

namespace phalanx {

using Bytes = std::vector<std::uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  /// Waits until `key` exists (up to timeout()), then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  /// Adds `delta` to the integer stored at `key` (0 if absent) and returns the result.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  /// Sets `key` to `desired` if its value is `expected` (an absent key matches an empty
  /// `expected`); returns the value after the call.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  /// Waits until every key exists; throws TimeoutError listing the missing ones.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  /// True when every key exists (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual bool delete_key(const std::string& key) = 0;
  virtual std::int64_t num_keys() = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // conveniences
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key) {
    const Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  std::chrono::milliseconds timeout_{kDefaultTimeout};
};

using StorePtr = std::shared_ptr<Store>;

/// Throws TimeoutError: "store: timed out after 5.0 s waiting for key(s) a, b".
[[noreturn]] void throw_store_timeout(const std::vector<std::string>& missing,
                                      std::chrono::milliseconds timeout, const std::string& where);
/// Integer values are stored as decimal text (as PyTorch does).
std::int64_t parse_store_int(const Bytes& b, const std::string& key);

}  // namespace phalanx
