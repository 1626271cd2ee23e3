#include "phalanx/optim/grad_scaler.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/finite.hpp"
#include "phalanx/core/ops.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx::optim {

GradScaler::GradScaler(const GradScalerOptions& o, FoundInfAgreement agreement)
    : enabled_(o.enabled()),
      scale_(static_cast<float>(o.init_scale())),
      growth_factor_(o.growth_factor()),
      backoff_factor_(o.backoff_factor()),
      growth_interval_(o.growth_interval()),
      agreement_(std::move(agreement)) {
  if (!enabled_) return;
  if (!(o.growth_factor() > 1.0))
    throw ValueError(detail::concat("GradScaler: growth_factor must be > 1, got ", o.growth_factor()));
  if (!(o.backoff_factor() < 1.0))
    throw ValueError(detail::concat("GradScaler: backoff_factor must be < 1, got ", o.backoff_factor()));
  if (!(scale_ > 0.0f) || !std::isfinite(scale_))  // as stored: 1e-50 would be 0 in float32
    throw ValueError(detail::concat("GradScaler: init_scale must be a positive finite float32, got ",
                                    o.init_scale()));
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!enabled_) return loss;
  return loss * scale_;
}

GradScaler::PerOptimizer& GradScaler::state_of(const Optimizer& opt) {
  for (auto& s : per_optimizer_)
    if (s.opt == &opt) return s;
  per_optimizer_.push_back({&opt, Stage::Ready, false});
  return per_optimizer_.back();
}

const GradScaler::PerOptimizer* GradScaler::find(const Optimizer& opt) const {
  for (const auto& s : per_optimizer_)
    if (s.opt == &opt) return &s;
  return nullptr;
}

bool GradScaler::found_inf(const Optimizer& opt) const {
  const PerOptimizer* s = find(opt);
  return s && s->stage != Stage::Ready && s->found_inf;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!enabled_) return;
  PerOptimizer& st = state_of(opt);
  if (st.stage == Stage::Unscaled)
    throw ValueError("GradScaler: unscale_() was already called on this optimizer since the last update(); "
                     "call it once per step, before step()");
  if (st.stage == Stage::Stepped)
    throw ValueError("GradScaler: unscale_() called after step(); call unscale_() before step(), then update()");
  const timeline::Span span("grad scaler unscale", "optim");
  NoGradGuard no_grad;
  // PyTorch: inv_scale = scale.double().reciprocal().float(); each gradient is checked on its
  // input values and multiplied by inv_scale in float32 (left alone when inv_scale is 1).
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  bool found = false;
  Tensor device_sum;  // gradients outside host memory: one finiteness sum, read back once
  for (ParamGroup& group : opt.param_groups()) {
    for (const Tensor& p : group.params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      if (g.dtype() != DType::Float32)
        throw ValueError("GradScaler: unscale_ needs float32 gradients (float32 master weights), got " + g.str() +
                         "; keep the parameters in float32 and let autocast cast them");
      if (g.device().is_cpu()) {
        found |= !unscale_and_check_finite(g.data<float>(), g.numel(), inv_scale);
      } else {
        const Tensor s = sum(g * 0.f);  // x * 0 is 0 exactly for finite x, NaN otherwise
        device_sum = device_sum.defined() ? device_sum + s : s;
        if (inv_scale != 1.0f) g.mul_(inv_scale);
      }
    }
  }
  if (device_sum.defined() && !std::isfinite(device_sum.item())) found = true;
  // The gradients are divided now: should the agreement throw (a failed collective), a retried
  // step() must not divide them again, and with no agreed flag the step is skipped.
  st.stage = Stage::Unscaled;
  st.found_inf = true;
  if (agreement_) found = agreement_(found);
  st.found_inf = found;
}

bool GradScaler::step(Optimizer& opt) {
  if (!enabled_) {
    opt.step();
    return true;
  }
  PerOptimizer& st = state_of(opt);
  if (st.stage == Stage::Stepped)
    throw ValueError("GradScaler: step() was already called on this optimizer since the last update(); "
                     "call update() after each step()");
  if (st.stage == Stage::Ready) unscale_(opt);
  // unscale_ may have grown per_optimizer_: look the entry up again.
  PerOptimizer& now = state_of(opt);
  const bool stepped = !now.found_inf;
  if (stepped) opt.step();
  now.stage = Stage::Stepped;
  return stepped;
}

void GradScaler::update() {
  if (!enabled_) return;
  bool any_checked = false, found = false;
  for (const auto& s : per_optimizer_) {
    if (s.stage == Stage::Ready) continue;
    any_checked = true;
    found |= s.found_inf;
  }
  if (!any_checked)
    throw ValueError("GradScaler: update() with no unscale_() or step() since the last update(); "
                     "call scaler.step(optimizer) before scaler.update()");
  // PyTorch's _amp_update_scale_: the products in double, stored as float32; the scale never
  // grows to an infinity.
  if (found) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * backoff_factor_);
    growth_tracker_ = 0;
  } else {
    const std::int64_t successful = growth_tracker_ + 1;
    if (successful == growth_interval_) {
      const float grown = static_cast<float>(static_cast<double>(scale_) * growth_factor_);
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    } else {
      growth_tracker_ = successful;
    }
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!enabled_) return;
  scale_ = static_cast<float>(new_scale);
  per_optimizer_.clear();
}

namespace {
Tensor double_bits(double v) {
  std::int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return tensor(std::vector<std::int64_t>{bits}, {});
}
const Tensor& need(const TensorMap& m, const char* key) {
  const Tensor* t = m.find(key);
  if (!t)
    throw ValueError(std::string("GradScaler state: key '") + key +
                     "' is missing; pass what GradScaler::state_dict() returned");
  if (t->dtype() != DType::Int64 || t->numel() != 1)
    throw ValueError(std::string("GradScaler state: '") + key + "' must be a one-element int64, got " + t->str());
  return *t;
}
double double_of(const TensorMap& m, const char* key) {
  const std::int64_t bits = need(m, key).item_int();
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
}  // namespace

TensorMap GradScaler::state_dict() const {
  TensorMap m;
  if (!enabled_) return m;
  m.set("scale", double_bits(static_cast<double>(scale_)));
  m.set("growth_factor", double_bits(growth_factor_));
  m.set("backoff_factor", double_bits(backoff_factor_));
  m.set("growth_interval", tensor(std::vector<std::int64_t>{growth_interval_}, {}));
  m.set("_growth_tracker", tensor(std::vector<std::int64_t>{growth_tracker_}, {}));
  return m;
}

void GradScaler::load_state_dict(const TensorMap& m) {
  if (!enabled_) return;
  if (m.size() == 0)
    throw ValueError("GradScaler state is empty: it was saved from a disabled GradScaler; "
                     "construct this one with enabled(false), or start from init_scale");
  const double scale = double_of(m, "scale"), growth = double_of(m, "growth_factor"),
               backoff = double_of(m, "backoff_factor");
  const std::int64_t interval = need(m, "growth_interval").item_int(),
                     tracker = need(m, "_growth_tracker").item_int();
  if (!(static_cast<float>(scale) > 0.0f) || !std::isfinite(static_cast<float>(scale)))
    throw ValueError(detail::concat("GradScaler state: scale must be a positive finite float32, got ", scale));
  if (!(growth > 1.0) || !(backoff < 1.0))
    throw ValueError(detail::concat("GradScaler state: growth_factor must be > 1 and backoff_factor < 1, got ",
                                    growth, " and ", backoff));
  for (const auto& [key, t] : m) {
    (void)t;
    if (key != "scale" && key != "growth_factor" && key != "backoff_factor" && key != "growth_interval" &&
        key != "_growth_tracker")
      throw ValueError("unexpected key '" + key + "' in GradScaler state");
  }
  scale_ = static_cast<float>(scale);
  growth_factor_ = growth;
  backoff_factor_ = backoff;
  growth_interval_ = interval;
  growth_tracker_ = tracker;
}

}  // namespace phalanx::optim
