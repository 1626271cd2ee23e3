#include "phalanx/backends/prefix_store.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx {

PrefixStore::PrefixStore(std::string prefix, StorePtr inner) : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  if (!inner_) throw ValueError("PrefixStore: inner store is null");
  timeout_ = inner_->timeout();
}

std::vector<std::string> PrefixStore::ks(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(k(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& v) { inner_->set(k(key), v); }
Bytes PrefixStore::get(const std::string& key) { return inner_->get(k(key)); }
std::int64_t PrefixStore::add(const std::string& key, std::int64_t d) { return inner_->add(k(key), d); }
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& e, const Bytes& d) {
  return inner_->compare_set(k(key), e, d);
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) { inner_->wait(ks(keys), t); }
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(ks(keys)); }
bool PrefixStore::delete_key(const std::string& key) { return inner_->delete_key(k(key)); }
std::int64_t PrefixStore::num_keys() { return inner_->num_keys(); }

}  // namespace phalanx
