#include "phalanx/parallel/join.hpp"

#include "phalanx/core/creation.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/error.hpp"

namespace phalanx::parallel {

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options), uncaught_at_start_(std::uncaught_exceptions()) {
  if (joinables_.empty()) throw ValueError("Join: the list of joinables is empty; pass the DDP model (and ZeRO optimizer)");
  for (Joinable* j : joinables_) {
    if (!j) throw ValueError("Join: a joinable is null");
    if (!pg_) {
      pg_ = &j->join_process_group();
      device_ = j->join_device();
    } else if (&j->join_process_group() != pg_) {
      throw ValueError("Join: the joinables use different process groups; one Join covers one group");
    }
  }
  for (std::size_t i = 0; i < joinables_.size(); ++i)
    joinables_[i]->join_config_ = JoinConfig{options_.enable, options_.throw_on_early_termination, i == 0};
  if (!options_.enable) done_ = true;
}

Join::~Join() noexcept(false) {
  if (!done_ && std::uncaught_exceptions() == uncaught_at_start_) {
    finish();
    return;
  }
  release_joinables();
}

void Join::release_joinables() {
  for (Joinable* j : joinables_) j->join_config_ = JoinConfig{};
}

void Join::finish() {
  if (done_) {
    release_joinables();
    return;
  }
  done_ = true;
  bool is_last_joiner = true;
  try {
    Tensor count = zeros({1}, DType::Float32, device_);
    for (;;) {
      count.zero_();
      pg_->allreduce(count, ReduceOp::Sum)->synchronize();  // read on the host
      if (count.item() == 0.f) break;  // nobody trains any more
      if (options_.throw_on_early_termination) {
        Tensor one = ones({1}, DType::Float32, device_);
        pg_->allreduce(one, ReduceOp::Sum)->wait();  // matches the trainers' check in notify
        throw CommError(detail::concat("Join: rank ", pg_->rank(),
                                       " exhausted all inputs (throw_on_early_termination)"));
      }
      for (Joinable* j : joinables_) j->join_main_hook();
      is_last_joiner = false;
      ++shadowed_;
    }
    for (Joinable* j : joinables_) j->join_post_hook(is_last_joiner);
  } catch (...) {
    release_joinables();
    throw;
  }
  release_joinables();
}

WorkPtr Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& c = joinable.join_config();
  if (!c.enable || !c.is_first_joinable) return nullptr;
  ProcessGroup& pg = joinable.join_process_group();
  WorkPtr work = pg.allreduce(ones({1}, DType::Float32, joinable.join_device()), ReduceOp::Sum);
  if (c.throw_on_early_termination) {
    Tensor flag = zeros({1}, DType::Float32, joinable.join_device());
    pg.allreduce(flag, ReduceOp::Sum)->synchronize();
    if (flag.item() != 0.f)
      throw CommError("Join: at least one rank exhausted its inputs (throw_on_early_termination): "
                      "every rank stops here");
  }
  return work;
}

int find_common_rank(ProcessGroup& pg, Device device, bool condition) {
  Tensor r = full({1}, condition ? pg.rank() : -1, DType::Float32, device);
  pg.allreduce(r, ReduceOp::Max)->synchronize();
  const int rank = static_cast<int>(r.item());
  if (rank < 0) throw ValueError("Join: no rank satisfies the condition for the authoritative rank");
  return rank;
}

}  // namespace phalanx::parallel
