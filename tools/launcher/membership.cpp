#include "membership.hpp"

#include <sstream>
#include <stdexcept>

namespace phalanx::launcher {

using Clock = std::chrono::steady_clock;

std::string elastic_key(const std::string& what) { return "phalanx/elastic/" + what; }
std::string elastic_round_key(int k, const std::string& what) {
  return "phalanx/elastic/r" + std::to_string(k) + "/" + what;
}

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

std::vector<int> split_ids(const std::string& text) {
  std::vector<int> ids;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ','))
    if (!part.empty()) ids.push_back(std::stoi(part));
  return ids;
}

namespace {
std::string alive_key(int id) { return elastic_key("alive/" + std::to_string(id)); }
std::string text_of(const Bytes& b) { return std::string(b.begin(), b.end()); }
}  // namespace

Membership::Membership(std::shared_ptr<Store> store, bool host, std::chrono::milliseconds tick,
                       std::chrono::milliseconds keep_alive, int max_nodes)
    : store_(std::move(store)), host_(host), tick_(tick), keep_alive_(keep_alive), max_nodes_(max_nodes) {
  id_ = host_ ? 0 : static_cast<int>(store_->add(elastic_key("next_id"), 1));
  store_->add(alive_key(id_), 1);
  loop_.start([this](std::unique_lock<std::mutex>& lock) { return this->tick(lock); });
}

Membership::~Membership() { loop_.stop(); }

void Membership::wake(const std::string& why) {  // mu_ held
  if (woken_) return;
  woken_ = true;
  why_ = why;
  wake_.notify();
}

void Membership::begin(int k, const std::vector<int>& members) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_.drain();
  woken_ = false;
  why_.clear();
  round_ = k;
  members_ = members;
  watching_ = true;
  if (!lost_.empty()) wake(lost_);
}

void Membership::end_watch() {
  std::lock_guard<std::mutex> lock(mu_);
  watching_ = false;
}

std::string Membership::why() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_;
}

bool Membership::store_lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !lost_.empty();
}

bool Membership::closed_for_membership(int k) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = membership_close_.find(k);
  return it != membership_close_.end() && it->second;
}

void Membership::close(int k, const std::string& what) {
  if (store_lost()) return;
  try {
    store_->compare_set(elastic_round_key(k, "closed"), {}, Bytes(what.begin(), what.end()));
  } catch (const std::exception&) {  // the store is gone: the others find out on their own
  }
}

bool Membership::alive(int id) const {
  if (id == id_) return true;
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = seen_.find(id);
  return it != seen_.end() && it->second.value > 0 && Clock::now() - it->second.at < keep_alive_;
}

std::vector<int> Membership::waiting(const std::vector<int>& members) const {
  std::vector<int> ids;
  std::vector<int> known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, s] : seen_) known.push_back(id);
  }
  for (int id : known) {
    bool member = false;
    for (int m : members) member = member || m == id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int f : forgotten_) member = member || f == id;
    }
    // A launcher that said it leaves (a signal while it waited) is on its way out.
    if (!member && alive(id) && !store_->check({elastic_key("left/" + std::to_string(id))})) ids.push_back(id);
  }
  return ids;
}

void Membership::forget(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  forgotten_.push_back(id);
}

void Membership::watch_liveness() {
  const auto n = store_->add(elastic_key("next_id"), 0);
  std::vector<std::pair<int, std::int64_t>> values;
  for (int id = 1; id <= n; ++id) values.emplace_back(id, store_->add(alive_key(id), 0));
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, v] : values) {
    auto& s = seen_[id];
    if (v != s.value) s = {v, now};
  }
}

bool Membership::tick(std::unique_lock<std::mutex>& lock) {
  {
    const int k = round_;
    const bool check_closed = watching_ && !woken_ && k >= 0;
    const std::vector<int> members = members_;
    lock.unlock();
    std::string closer, lost, membership_why;
    try {
      store_->add(alive_key(id_), 1);
      if (host_) {
        watch_liveness();
        if (check_closed) {
          for (int m : members)
            if (!alive(m)) {
              membership_why = "the launcher of a node (id " + std::to_string(m) + ") is gone: no keep-alive for " +
                               std::to_string(keep_alive_.count()) + " ms";
              break;
            }
          if (membership_why.empty() && static_cast<int>(members.size()) < max_nodes_ && !waiting(members).empty())
            membership_why = "a node waits to join: the job re-forms with it";
          if (!membership_why.empty()) {
            const Bytes got = store_->compare_set(elastic_round_key(k, "closed"), {},
                                                  Bytes(membership_why.begin(), membership_why.end()));
            if (text_of(got) == membership_why) {
              lock.lock();
              membership_close_[k] = true;
              lock.unlock();
            }
          }
        }
      }
      if (check_closed && store_->check({elastic_round_key(k, "closed")}))
        closer = text_of(store_->get(elastic_round_key(k, "closed")));
    } catch (const std::exception& e) {
      lost = std::string("lost the job's store (is the launcher that hosts it gone?): ") + e.what();
    }
    lock.lock();
    if (!lost.empty()) {
      lost_ = lost;
      wake(lost);
      return false;
    }
    if (!closer.empty() && k == round_ && watching_) wake(closer);
  }
  return true;
}

}  // namespace phalanx::launcher
