// Schedules, transcribed from torch.optim.lr_scheduler (PyTorch 1.13) so that the rates
// match PyTorch's to the last bit: same recursive forms, same evaluation order, doubles.
#include "phalanx/optim/lr_scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "phalanx/core/creation.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx::optim {

namespace {
constexpr double kPi = 3.141592653589793;
std::int64_t py_mod(std::int64_t a, std::int64_t m) { return ((a % m) + m) % m; }

Tensor int_scalar(std::int64_t v) { return tensor(std::vector<std::int64_t>{v}, {}); }
Tensor rates(const std::vector<double>& v) {
  std::vector<std::int64_t> bits(v.size());
  if (!v.empty()) std::memcpy(bits.data(), v.data(), v.size() * sizeof(double));
  return tensor(bits, {static_cast<std::int64_t>(v.size())});
}
const Tensor& need(const TensorMap& m, const std::string& key, std::int64_t numel) {
  const Tensor* t = m.find(key);
  if (!t) throw ValueError("scheduler state has no '" + key + "'");
  if (t->dtype() != DType::Int64 || (numel >= 0 && t->numel() != numel))
    throw ValueError(detail::concat("scheduler state: '", key, "' must be ", numel < 0 ? 1 : numel,
                                    " int64 value(s), got ", t->numel(), " of ", dtype_name(t->dtype())));
  return *t;
}
std::vector<double> to_rates(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  const auto bits = t.to_vector<std::int64_t>();
  if (!v.empty()) std::memcpy(v.data(), bits.data(), v.size() * sizeof(double));
  return v;
}
}  // namespace

TensorMap LRScheduler::state_dict() const {
  TensorMap m;
  m.set("last_epoch", int_scalar(last_epoch_));
  m.set("step_count", int_scalar(step_count_));
  m.set("base_lrs", rates(base_lrs_));
  m.set("last_lr", rates(last_lr_));
  return m;
}

void LRScheduler::load_state_dict(const TensorMap& m) {
  const auto groups = static_cast<std::int64_t>(base_lrs_.size());
  const Tensor& epoch = need(m, "last_epoch", 1);
  const Tensor& count = need(m, "step_count", 1);
  const Tensor& base = need(m, "base_lrs", groups);
  const Tensor& last = need(m, "last_lr", groups);
  last_epoch_ = epoch.item_int();
  step_count_ = count.item_int();
  base_lrs_ = to_rates(base);
  last_lr_ = to_rates(last);
}

LRScheduler::LRScheduler(Optimizer& opt) : opt_(opt) {
  for (auto& g : opt.param_groups()) {
    if (!g.options.count("initial_lr")) g.options["initial_lr"] = g.lr();
    base_lrs_.push_back(g.options.at("initial_lr"));
  }
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  auto& groups = opt_.param_groups();
  for (std::size_t g = 0; g < groups.size() && g < lrs.size(); ++g) groups[g].set_lr(lrs[g]);
  last_lr_.clear();
  for (auto& g : groups) last_lr_.push_back(g.lr());
}

void LRScheduler::step() {
  ++step_count_;
  ++last_epoch_;
  apply(compute_lr());
}

void LRScheduler::step_to(std::int64_t epoch) {
  ++step_count_;
  last_epoch_ = epoch;
  apply(closed_form_lr());
}

// ---- LinearLR ----
LinearLR::LinearLR(Optimizer& opt, double start, double end, std::int64_t total)
    : LRScheduler(opt), start_(start), end_(end), total_(total) {
  if (start > 1.0 || start <= 0)
    throw ValueError(detail::concat("LinearLR: start_factor must be in (0, 1], got ", start));
  if (end > 1.0 || end < 0)
    throw ValueError(detail::concat("LinearLR: end_factor must be in [0, 1], got ", end));
  if (total < 1) throw ValueError(detail::concat("LinearLR: total_iters must be >= 1, got ", total));
  initial_step();
}

std::vector<double> LinearLR::compute_lr() {
  std::vector<double> out;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    const double lr = group_lr(g);
    if (last_epoch_ == 0)
      out.push_back(lr * start_);
    else if (last_epoch_ > total_)
      out.push_back(lr);
    else
      out.push_back(lr * (1. + (end_ - start_) /
                                   (static_cast<double>(total_) * start_ +
                                    static_cast<double>(last_epoch_ - 1) * (end_ - start_))));
  }
  return out;
}

std::vector<double> LinearLR::closed_form_lr() {
  std::vector<double> out;
  for (double base : base_lrs_)
    out.push_back(base * (start_ + (end_ - start_) *
                                       static_cast<double>(std::min(total_, last_epoch_)) /
                                       static_cast<double>(total_)));
  return out;
}

// ---- StepLR ----
StepLR::StepLR(Optimizer& opt, std::int64_t step_size, double gamma)
    : LRScheduler(opt), step_size_(step_size), gamma_(gamma) {
  if (step_size < 1) throw ValueError(detail::concat("StepLR: step_size must be >= 1, got ", step_size));
  initial_step();
}

std::vector<double> StepLR::compute_lr() {
  std::vector<double> out;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    const double lr = group_lr(g);
    out.push_back(last_epoch_ == 0 || last_epoch_ % step_size_ != 0 ? lr : lr * gamma_);
  }
  return out;
}

std::vector<double> StepLR::closed_form_lr() {
  std::vector<double> out;
  for (double base : base_lrs_)
    out.push_back(base * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));
  return out;
}

// ---- MultiStepLR ----
MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<std::int64_t> milestones, double gamma)
    : LRScheduler(opt), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

std::vector<double> MultiStepLR::compute_lr() {
  const auto hits = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  std::vector<double> out;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    const double lr = group_lr(g);
    out.push_back(hits == 0 ? lr : lr * std::pow(gamma_, static_cast<double>(hits)));
  }
  return out;
}

std::vector<double> MultiStepLR::closed_form_lr() {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) -
                      milestones_.begin();
  std::vector<double> out;
  for (double base : base_lrs_) out.push_back(base * std::pow(gamma_, static_cast<double>(passed)));
  return out;
}

// ---- CosineAnnealingLR ----
CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, std::int64_t t_max, double eta_min)
    : LRScheduler(opt), t_max_(t_max), eta_min_(eta_min) {
  if (t_max < 1) throw ValueError(detail::concat("CosineAnnealingLR: T_max must be >= 1, got ", t_max));
  initial_step();
}

std::vector<double> CosineAnnealingLR::compute_lr() {
  const double T = static_cast<double>(t_max_), e = static_cast<double>(last_epoch_);
  std::vector<double> out;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    const double lr = group_lr(g), base = base_lrs_[g];
    if (last_epoch_ == 0)
      out.push_back(lr);
    else if (step_count_ == 1 && last_epoch_ > 0)
      out.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(e * kPi / T)) / 2);
    else if (py_mod(last_epoch_ - 1 - t_max_, 2 * t_max_) == 0)
      out.push_back(lr + (base - eta_min_) * (1 - std::cos(kPi / T)) / 2);
    else
      out.push_back((1 + std::cos(kPi * e / T)) / (1 + std::cos(kPi * (e - 1) / T)) *
                        (lr - eta_min_) +
                    eta_min_);
  }
  return out;
}

std::vector<double> CosineAnnealingLR::closed_form_lr() {
  const double T = static_cast<double>(t_max_), e = static_cast<double>(last_epoch_);
  std::vector<double> out;
  for (double base : base_lrs_)
    out.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(kPi * e / T)) / 2);
  return out;
}

// ---- SequentialLR ----
SequentialLR::SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<std::int64_t> milestones)
    : opt_(opt), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)),
      last_epoch_(0) {
  if (schedulers_.empty()) throw ValueError("SequentialLR: needs at least one scheduler");
  if (milestones_.size() + 1 != schedulers_.size())
    throw ValueError(detail::concat("SequentialLR: expected ", schedulers_.size() - 1,
                                    " milestone(s) for ", schedulers_.size(), " schedulers, got ",
                                    milestones_.size()));
  for (auto& s : schedulers_)
    if (&s->opt_ != &opt)
      throw ValueError("SequentialLR: every scheduler must drive the same optimizer");
  // As PyTorch: back to the initial rates, undo each scheduler's initial step, then the
  // first scheduler's initial step alone.
  for (auto& g : opt_.param_groups()) g.set_lr(g.options.at("initial_lr"));
  for (auto& s : schedulers_) --s->last_epoch_;
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

TensorMap SequentialLR::state_dict() const {
  TensorMap m;
  m.set("last_epoch", int_scalar(last_epoch_));
  m.set("last_lr", rates(last_lr_));
  for (std::size_t i = 0; i < schedulers_.size(); ++i)
    for (const auto& [k, v] : schedulers_[i]->state_dict()) m.set("schedulers." + std::to_string(i) + "." + k, v);
  return m;
}

void SequentialLR::load_state_dict(const TensorMap& m) {
  const Tensor& epoch = need(m, "last_epoch", 1);
  const Tensor& last = need(m, "last_lr", static_cast<std::int64_t>(last_lr_.size()));
  std::vector<TensorMap> parts(schedulers_.size());
  for (const auto& [k, v] : m) {
    if (k.rfind("schedulers.", 0) != 0) continue;
    const auto dot = k.find('.', 11);
    const std::string idx = k.substr(11, dot == std::string::npos ? std::string::npos : dot - 11);
    if (dot == std::string::npos || idx.empty() || idx.size() > 6 || idx.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(idx) >= schedulers_.size())
      throw ValueError(detail::concat("scheduler state key '", k, "' does not name one of the ", schedulers_.size(),
                                      " schedulers"));
    parts[std::stoul(idx)].set(k.substr(dot + 1), v);
  }
  // Validate every part before changing anything: load into copies of the state first.
  std::vector<TensorMap> before;
  for (auto& s : schedulers_) before.push_back(s->state_dict());
  try {
    for (std::size_t i = 0; i < schedulers_.size(); ++i) schedulers_[i]->load_state_dict(parts[i]);
  } catch (...) {
    for (std::size_t i = 0; i < schedulers_.size(); ++i) schedulers_[i]->load_state_dict(before[i]);
    throw;
  }
  last_epoch_ = epoch.item_int();
  last_lr_ = to_rates(last);
}

void SequentialLR::step() {
  ++last_epoch_;
  const std::size_t idx =
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  auto& s = schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_)
    s->step_to(0);
  else
    s->step();
  last_lr_ = s->get_last_lr();
}

}  // namespace phalanx::optim
