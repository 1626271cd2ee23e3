#include "hierarchical_process_group.hpp"

#include <algorithm>
#include <map>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/plugin_registry.hpp"
#include "phalanx/backends/prefix_store.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx {

namespace {

constexpr int kResultTag = 0x4869;  // reduce: the root's leader hands the result to the root

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

HierarchicalBackend::HierarchicalBackend(const BackendConfig& config, const HierarchyOptions& o)
    : Backend(config.rank, config.size, config.timeout) {
  const int world = config.size;
  if (static_cast<int>(o.host_of_rank.size()) != world)
    throw ConfigError(detail::concat("hierarchical group: ", o.host_of_rank.size(),
                                     " host identities for a world of ", world, "; give one per rank"));
  std::map<std::string, int> host_number;
  std::vector<int> count;
  host_index_.resize(world);
  local_index_.resize(world);
  for (int r = 0; r < world; ++r) {
    auto [it, fresh] = host_number.emplace(o.host_of_rank[r], static_cast<int>(leader_.size()));
    if (fresh) {
      leader_.push_back(r);
      count.push_back(0);
    }
    host_index_[r] = it->second;
    local_index_[r] = count[it->second]++;
  }
  hosts_ = static_cast<int>(leader_.size());
  max_local_ = *std::max_element(count.begin(), count.end());
  const int h = host_index_[config.rank];
  for (int r = 0; r < world; ++r)
    if (host_index_[r] == h) host_ranks_.push_back(r);
  name_ = "hierarchical:" + o.intra_backend + "+" + o.inter_backend;

  // Created in the same order on every rank: all ranks, then each host, then the leaders.
  BackendConfig c = config;
  c.store = std::make_shared<PrefixStore>("hier/all", config.store);
  direct_ = create_process_group(o.inter_backend, c, o.plugin_path);
  if (host_ranks_.size() > 1) {
    c = config;
    c.rank = local_index_[config.rank];
    c.size = static_cast<int>(host_ranks_.size());
    c.local_rank = c.rank;
    c.local_world_size = c.size;
    c.store = std::make_shared<PrefixStore>("hier/host" + std::to_string(h), config.store);
    intra_ = create_process_group(o.intra_backend, c, o.plugin_path);
  }
  if (hosts_ > 1 && is_leader()) {
    c = config;
    c.rank = h;
    c.size = hosts_;
    c.local_rank = 0;
    c.local_world_size = 1;
    c.store = std::make_shared<PrefixStore>("hier/leaders", config.store);
    inter_ = create_process_group(o.inter_backend, c, o.plugin_path);
  }
}

void HierarchicalBackend::on_abort() noexcept {
  try {
    const auto error = std::make_exception_ptr(CommError("the hierarchical group was aborted"));
    for (const auto& g : {intra_, inter_, direct_})
      if (g) g->abort(error);
  } catch (...) {
  }
}

void HierarchicalBackend::step(const WorkPtr& work, Level level, const char* op, std::uint64_t seq) const {
  try {
    work->wait();
  } catch (const std::exception& e) {
    std::string where;
    if (level == Level::Intra)
      where = "the step within host " + std::to_string(host_index_[rank()]) + " (ranks " + list(host_ranks_) + ")";
    else if (level == Level::Inter)
      where = "the step between the hosts' leaders (ranks " + list(leader_) + ")";
    else
      where = "the direct transfer";
    const std::string msg = describe(op, seq) + ": " + where + " failed: " + e.what();
    if (dynamic_cast<const DesyncError*>(&e)) throw DesyncError(msg);
    if (dynamic_cast<const PeerFailedError*>(&e)) throw PeerFailedError(msg);
    if (dynamic_cast<const PeerFinishedError*>(&e)) throw PeerFinishedError(msg);
    if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(msg);
    throw CommError(msg);
  }
}

void HierarchicalBackend::allreduce_impl(Tensor& t, ReduceOp op, std::uint64_t seq, const char* name) {
  const ReduceOp partial = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  if (!is_leader()) {  // both steps queued at once: one wake-up fewer
    const WorkPtr up = intra_->reduce(t, 0, partial), down = intra_->broadcast(t, 0);
    step(up, Level::Intra, name, seq);
    step(down, Level::Intra, name, seq);
    return;
  }
  if (intra_) step(intra_->reduce(t, 0, partial), Level::Intra, name, seq);
  if (inter_) step(inter_->allreduce(t, partial), Level::Inter, name, seq);
  if (op == ReduceOp::Avg) kernels_for(t.device()).divide(t, static_cast<float>(size()));
  if (intra_) step(intra_->broadcast(t, 0), Level::Intra, name, seq);
}

void HierarchicalBackend::run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
  allreduce_impl(t, op, seq, "allreduce");
}

void HierarchicalBackend::broadcast_impl(Tensor& t, int root, std::uint64_t seq, const char* name) {
  const int root_host = host_index_[root];
  const bool root_here = root_host == host_index_[rank()];
  if (root_here && intra_) step(intra_->broadcast(t, local_index_[root]), Level::Intra, name, seq);
  if (inter_) step(inter_->broadcast(t, root_host), Level::Inter, name, seq);
  if (!root_here && intra_) step(intra_->broadcast(t, 0), Level::Intra, name, seq);
}

void HierarchicalBackend::run_broadcast(Tensor& t, int root, std::uint64_t seq) {
  broadcast_impl(t, root, seq, "broadcast");
}

void HierarchicalBackend::run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) {
  const ReduceOp partial = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const int root_host = host_index_[root];
  if (is_leader()) {
    // A leader that is not the root reduces into a copy: its own tensor stays as it was.
    Tensor acc = rank() == root ? t : t.clone();
    if (intra_) step(intra_->reduce(acc, 0, partial), Level::Intra, "reduce", seq);
    if (inter_) step(inter_->reduce(acc, root_host, partial), Level::Inter, "reduce", seq);
    if (root_host == host_index_[rank()] && rank() != root)
      step(intra_->send(acc, local_index_[root], kResultTag), Level::Intra, "reduce", seq);
  } else {
    step(intra_->reduce(t, 0, partial), Level::Intra, "reduce", seq);
    if (rank() == root) step(intra_->recv(t, 0, kResultTag), Level::Intra, "reduce", seq);
  }
  if (rank() == root && op == ReduceOp::Avg) kernels_for(t.device()).divide(t, static_cast<float>(size()));
}

Tensor HierarchicalBackend::allgather_impl(const Tensor& in, std::uint64_t seq, const char* name) {
  const std::int64_t n = in.numel(), block = max_local_ * n;
  const Tensor flat_in = in.reshape({n});
  Tensor all = Tensor::empty({hosts_ * block}, in.dtype(), in.device());
  const int h = host_index_[rank()];
  if (!is_leader()) {
    const WorkPtr up = intra_->gather({}, flat_in, 0), down = intra_->broadcast(all, 0);
    step(up, Level::Intra, name, seq);
    step(down, Level::Intra, name, seq);
    return all;
  }
  // This host's block: gathered straight into `all` with one host, else into its own buffer.
  Tensor mine = inter_ ? Tensor::empty({block}, in.dtype(), in.device()) : all.narrow_rows(h * block, (h + 1) * block);
  if (intra_) {
    std::vector<Tensor> parts;
    for (std::size_t k = 0; k < host_ranks_.size(); ++k)
      parts.push_back(mine.narrow_rows(static_cast<std::int64_t>(k) * n, static_cast<std::int64_t>(k + 1) * n));
    step(intra_->gather(parts, flat_in, 0), Level::Intra, name, seq);
  } else {
    mine.narrow_rows(0, n).copy_(flat_in);
  }
  if (inter_) {
    std::vector<Tensor> blocks;
    for (int k = 0; k < hosts_; ++k) blocks.push_back(all.narrow_rows(k * block, (k + 1) * block));
    step(inter_->allgather(blocks, mine), Level::Inter, name, seq);
  }
  if (intra_) step(intra_->broadcast(all, 0), Level::Intra, name, seq);
  return all;
}

void HierarchicalBackend::run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) {
  const Tensor all = allgather_impl(in, seq, "allgather");
  const std::int64_t n = in.numel();
  for (int q = 0; q < size(); ++q) out[q].reshape({n}).copy_(all.narrow_rows(block_offset(q) * n, (block_offset(q) + 1) * n));
}

void HierarchicalBackend::run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) {
  const Tensor all = allgather_impl(in, seq, "gather");
  if (rank() != root) return;
  const std::int64_t n = in.numel();
  for (int q = 0; q < size(); ++q) out[q].reshape({n}).copy_(all.narrow_rows(block_offset(q) * n, (block_offset(q) + 1) * n));
}

void HierarchicalBackend::run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) {
  const std::int64_t n = out.numel();
  Tensor all = Tensor::empty({size() * n}, out.dtype(), out.device());
  if (rank() == root)
    for (int q = 0; q < size(); ++q) all.narrow_rows(q * n, (q + 1) * n).copy_(in[q].reshape({n}));
  broadcast_impl(all, root, seq, "scatter");
  out.reshape({n}).copy_(all.narrow_rows(rank() * n, (rank() + 1) * n));
}

void HierarchicalBackend::run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op,
                                                  std::uint64_t seq) {
  const std::int64_t n = out.numel();
  Tensor all = Tensor::empty({size() * n}, out.dtype(), out.device());
  for (int q = 0; q < size(); ++q) all.narrow_rows(q * n, (q + 1) * n).copy_(in[q].reshape({n}));
  allreduce_impl(all, op, seq, "reduce_scatter");
  out.reshape({n}).copy_(all.narrow_rows(rank() * n, (rank() + 1) * n));
}

void HierarchicalBackend::run_barrier(std::uint64_t seq) {
  if (!is_leader()) {
    const WorkPtr in = intra_->barrier(), out = intra_->barrier();
    step(in, Level::Intra, "barrier", seq);
    step(out, Level::Intra, "barrier", seq);
    return;
  }
  if (intra_) step(intra_->barrier(), Level::Intra, "barrier", seq);
  if (inter_) step(inter_->barrier(), Level::Inter, "barrier", seq);
  if (intra_) step(intra_->barrier(), Level::Intra, "barrier", seq);
}

void HierarchicalBackend::run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) {
  const WorkPtr work = direct_->send(t, dst, tag);
  defer_completion([this, work, seq] { step(work, Level::Direct, "send", seq); });
}

void HierarchicalBackend::run_recv(Tensor& t, int src, int tag, std::uint64_t seq) {
  const WorkPtr work = direct_->recv(t, src, tag);
  defer_completion([this, work, seq] { step(work, Level::Direct, "recv", seq); });
}

ProcessGroupPtr create_hierarchical_process_group(const BackendConfig& config, const HierarchyOptions& options) {
  return std::make_shared<ProcessGroup>(std::make_unique<HierarchicalBackend>(config, options));
}

}  // namespace phalanx
