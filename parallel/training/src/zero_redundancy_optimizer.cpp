#include "phalanx/parallel/zero_redundancy_optimizer.hpp"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "phalanx/parallel/internal/model_sync.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/parallel/init.hpp"

namespace phalanx::parallel {

namespace {

optim::Options defaults_of(const OptimizerFactory& make, const std::vector<Tensor>& params) {
  if (!make) throw ValueError("ZeroRedundancyOptimizer: the optimizer factory is empty");
  auto probe = make(params);  // state is allocated lazily: this costs no state memory
  if (!probe) throw ValueError("ZeroRedundancyOptimizer: the optimizer factory returned null");
  if (probe->param_groups().size() != 1)
    throw ValueError("ZeroRedundancyOptimizer: the factory's optimizer must have one parameter group");
  return probe->defaults();
}

std::vector<Tensor> all_params(const std::vector<ZeroGroup>& groups) {
  if (groups.empty()) throw ValueError("ZeroRedundancyOptimizer: no parameter groups");
  std::vector<Tensor> all;
  for (const ZeroGroup& g : groups) {
    if (g.params.empty()) throw ValueError("ZeroRedundancyOptimizer: a parameter group has no parameters");
    all.insert(all.end(), g.params.begin(), g.params.end());
  }
  return all;
}

std::vector<Tensor> first_group(const std::vector<ZeroGroup>& groups) {
  all_params(groups);  // the groups' errors first
  return groups.front().params;
}

/// A view of `flat` at element `offset`, shaped `shape` (shares storage, as DDP's buckets).
Tensor view_at(const Tensor& flat, std::int64_t offset, const Shape& shape) {
  return Tensor(std::make_shared<TensorImpl>(flat.impl()->storage(),
                                             flat.impl()->byte_offset() + static_cast<std::size_t>(offset) * 4, shape,
                                             DType::Float32));
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerFactory make,
                                                 ProcessGroupPtr pg)
    : ZeroRedundancyOptimizer(std::vector<ZeroGroup>{ZeroGroup{std::move(params), {}}}, std::move(make),
                              std::move(pg)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<ZeroGroup> groups, OptimizerFactory make,
                                                 ProcessGroupPtr pg)
    : optim::Optimizer(first_group(groups), defaults_of(make, all_params(groups))),
      pg_(pg ? std::move(pg) : default_process_group()),
      params_(all_params(groups)),
      group_count_(groups.size()) {
  for (const auto& [k, v] : groups.front().overrides) {
    if (!defaults().count(k))
      throw ValueError("unknown option '" + k + "' for the optimizer of ZeroRedundancyOptimizer");
    param_groups()[0].options[k] = v;
  }
  for (std::size_t g = 1; g < groups.size(); ++g) add_param_group(groups[g].params, groups[g].overrides);
  device_ = params_.front().device();
  for (const Tensor& p : params_)
    if (p.device() != device_)
      throw ConfigError("ZeroRedundancyOptimizer: parameters on " + device_.str() + " and " + p.device().str() +
                        "; move the model to one device first");
  // PyTorch's partition, group by group: largest first (stable), each to the rank with the
  // fewest elements so far (the counts carry over from one group to the next).
  const int W = pg_->size();
  const std::size_t n = params_.size();
  std::vector<std::int64_t> sizes(W, 0);
  owner_.assign(n, 0);
  shards_.assign(W, {});
  std::vector<std::size_t> group_of(n);
  for (std::size_t g = 0, first = 0; g < groups.size(); first += groups[g].params.size(), ++g) {
    std::vector<std::size_t> order(groups[g].params.size());
    std::iota(order.begin(), order.end(), first);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return params_[a].numel() > params_[b].numel(); });
    for (std::size_t i : order) {
      const int r = static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
      owner_[i] = r;
      group_of[i] = g;
      sizes[r] += params_[i].numel();
      shards_[r].push_back(i);
    }
  }
  flat_.resize(W);
  views_.resize(W);
  for (int r = 0; r < W; ++r) {
    std::sort(shards_[r].begin(), shards_[r].end());
    if (W == 1) continue;  // nothing to broadcast
    flat_[r] = zeros({sizes[r]}, DType::Float32, device_);
    std::int64_t off = 0;
    for (std::size_t i : shards_[r]) {
      views_[r].push_back(view_at(flat_[r], off, params_[i].shape()));
      off += params_[i].numel();
    }
  }
  // The inner optimizer: one group per outer group this rank owns parameters of, in group
  // order, so its parameters in order are this shard's in ascending index (the state's k).
  const auto& mine = shards_[pg_->rank()];
  for (std::size_t a = 0; a < mine.size();) {
    const std::size_t g = group_of[mine[a]];
    std::vector<Tensor> part;
    for (; a < mine.size() && group_of[mine[a]] == g; ++a) part.push_back(params_[mine[a]]);
    if (!local_) {
      local_ = make(std::move(part));
      local_->param_groups()[0].options = param_groups()[g].options;
    } else {
      local_->add_param_group(std::move(part), param_groups()[g].options);
    }
    local_groups_.push_back(g);
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::step() {
  WorkPtr notified = Join::notify_join_context(*this);
  if (param_groups().size() != group_count_)
    throw ValueError("ZeroRedundancyOptimizer: add_param_group after construction is not supported; give every "
                     "group to the constructor (std::vector<ZeroGroup>)");
  has_consolidated_ = false;
  if (local_) {
    for (std::size_t li = 0; li < local_groups_.size(); ++li)  // lr schedules reach the shard
      local_->param_groups()[li].options = param_groups()[local_groups_[li]].options;
    local_->step();
  }
  sync_params();
  if (notified) notified->wait();
}

void ZeroRedundancyOptimizer::sync_params() {
  const int W = pg_->size();
  if (W == 1) return;
  NoGradGuard no_grad;
  const int me = pg_->rank();
  for (std::size_t k = 0; k < shards_[me].size(); ++k) views_[me][k].copy_(params_[shards_[me][k]]);
  std::vector<WorkPtr> works;
  for (int r = 0; r < W; ++r)
    if (flat_[r].numel() > 0) works.push_back(pg_->broadcast(flat_[r], r));
  for (auto& w : works) w->wait();
  for (int r = 0; r < W; ++r)
    if (r != me)
      for (std::size_t k = 0; k < shards_[r].size(); ++k) params_[shards_[r][k]].copy_(views_[r][k]);
}

std::size_t optimizer_state_bytes(const optim::Optimizer& opt) {
  std::size_t bytes = 0;
  for (const auto& [key, t] : opt.state_dict())
    if (key.rfind("state.", 0) == 0) bytes += t.nbytes();
  return bytes;
}

std::size_t ZeroRedundancyOptimizer::state_bytes() const { return local_ ? optimizer_state_bytes(*local_) : 0; }

namespace {

/// One state entry of a shard: "state.<k>.<name>" of the inner optimizer.
struct Entry {
  std::size_t global;  // parameter index in the full list
  std::string name;    // "step" or a buffer name
  std::int64_t numel;  // 1 for step (int64)
};

std::size_t param_index(const std::string& key, std::size_t* name_at) {
  const auto dot = key.find('.', 6);
  if (dot == std::string::npos) throw ValueError("optimizer state key '" + key + "' has no field name");
  *name_at = dot + 1;
  return std::stoul(key.substr(6, dot - 6));
}

}  // namespace

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int W = pg_->size(), me = pg_->rank();
  if (to < 0 || to >= W)
    throw ValueError(detail::concat("consolidate_state_dict: rank ", to, " is not in the group of ", W));
  // Each rank describes its entries ("global name numel" lines), everyone learns all.
  TensorMap local = local_ ? local_->state_dict() : TensorMap();
  std::ostringstream desc;
  std::vector<Tensor> floats, steps;
  for (const auto& [key, t] : local) {
    if (key.rfind("state.", 0) != 0) continue;
    std::size_t at = 0;
    const std::size_t k = param_index(key, &at);
    const std::string name = key.substr(at);
    desc << shards_[me][k] << ' ' << name << ' ' << t.numel() << '\n';
    (name == "step" ? steps : floats).push_back(t);
  }
  const std::vector<std::string> all = W > 1 ? allgather_bytes(*pg_, desc.str(), device_)
                                             : std::vector<std::string>{desc.str()};
  std::vector<std::vector<Entry>> entries(W);
  for (int r = 0; r < W; ++r) {
    std::istringstream in(all[r]);
    Entry e;
    while (in >> e.global >> e.name >> e.numel) entries[r].push_back(e);
  }
  TensorMap out;
  if (me == to) out = optim::Optimizer::state_dict();  // param_groups.* (the base holds no state)
  for (int r = 0; r < W; ++r) {
    std::int64_t nf = 0, ns = 0;
    for (const Entry& e : entries[r]) (e.name == "step" ? ns : nf) += e.numel;
    Tensor fbuf = zeros({nf}, DType::Float32, device_), sbuf = zeros({ns}, DType::Int64, device_);
    if (r == me) {  // pack this rank's entries in description order
      std::int64_t fo = 0, so = 0;
      std::size_t fi = 0, si = 0;
      NoGradGuard no_grad;
      for (const Entry& e : entries[r]) {
        if (e.name == "step") {
          Tensor dst(std::make_shared<TensorImpl>(sbuf.impl()->storage(), sbuf.impl()->byte_offset() + so * 8, Shape{},
                                                  DType::Int64));
          dst.copy_(steps[si++].to(device_));
          so += 1;
        } else {
          view_at(fbuf, fo, Shape{e.numel}).copy_(floats[fi++].reshape({e.numel}));
          fo += e.numel;
        }
      }
    }
    if (W > 1) {  // only `to` needs the bytes; a broadcast keeps every backend's rules simple
      if (nf > 0) pg_->broadcast(fbuf, r)->wait();
      if (ns > 0) pg_->broadcast(sbuf, r)->wait();
    }
    if (me != to) continue;
    const Tensor host_steps = sbuf.to(Device::cpu());
    const std::int64_t* sp = host_steps.data<std::int64_t>();
    std::int64_t fo = 0, so = 0;
    for (const Entry& e : entries[r]) {
      const std::string key = "state." + std::to_string(e.global) + "." + e.name;
      if (e.name == "step") {
        out.set(key, tensor(std::vector<std::int64_t>{sp[so++]}, {}));
      } else {
        out.set(key, view_at(fbuf, fo, params_[e.global].shape()).clone());
        fo += e.numel;
      }
    }
  }
  consolidated_ = std::move(out);
  has_consolidated_ = me == to;
}

TensorMap ZeroRedundancyOptimizer::state_dict() const {
  if (!has_consolidated_)
    throw ValueError(detail::concat("ZeroRedundancyOptimizer::state_dict on rank ", pg_->rank(),
                                    ": no consolidated state here; call consolidate_state_dict(to) on every "
                                    "rank after the last step, then state_dict() on rank `to`"));
  return consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const TensorMap& state) {
  const int me = pg_->rank();
  TensorMap groups, local;
  for (const auto& [key, t] : state) {
    if (key.rfind("param_groups.", 0) == 0) {
      groups.set(key, t);
      const auto dot = key.find('.', 13);
      const std::size_t g = std::stoul(key.substr(13, dot - 13));
      for (std::size_t li = 0; li < local_groups_.size(); ++li)  // the inner groups of outer group g
        if (local_groups_[li] == g) local.set("param_groups." + std::to_string(li) + key.substr(dot), t);
    } else if (key.rfind("state.", 0) == 0) {
      std::size_t at = 0;
      const std::size_t gi = param_index(key, &at);
      if (gi >= params_.size())
        throw ValueError(detail::concat("optimizer state names parameter ", gi, " but there are ", params_.size()));
      if (owner_[gi] != me) continue;
      const auto& s = shards_[me];
      const std::size_t k = std::lower_bound(s.begin(), s.end(), gi) - s.begin();
      local.set("state." + std::to_string(k) + "." + key.substr(at), t);
    } else {
      throw ValueError("unexpected key '" + key + "' in optimizer state");
    }
  }
  optim::Optimizer::load_state_dict(groups);
  if (local_) local_->load_state_dict(local);
  has_consolidated_ = false;
}

}  // namespace phalanx::parallel
