#include "epoch_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include <nlohmann/json.hpp>

#include "evaluation.hpp"

namespace phalanx::trainer {

EpochReporter::EpochReporter(Context ctx, MetricsLog& metrics, ProgressBar& progress, tools::Series train_curve,
                             tools::Series test_curve)
    : ctx_(ctx),
      world_(ctx.pg->size()),
      rank_(ctx.pg->rank()),
      metrics_(metrics),
      progress_(progress),
      train_curve_(std::move(train_curve)),
      test_curve_(std::move(test_curve)),
      last_epoch_loss_(train_curve_.y.empty() ? std::nan("") : train_curve_.y.back()) {}

void EpochReporter::add(const PendingEpoch& done, std::int64_t steps) {
  steps_unreported_ += steps;
  pending_.push_back(done);
}

void EpochReporter::report(bool summed) {
  if (pending_.empty()) return;
  const bool whole = summed || world_ == 1 || ctx_.agreed;  // the loss is over every rank's batches
  const auto k = static_cast<std::int64_t>(pending_.size());
  Tensor sums = zeros({k, 2});
  for (std::int64_t i = 0; i < k; ++i) {
    sums.data<float>()[2 * i] = pending_[i].loss_sum;
    sums.data<float>()[2 * i + 1] = pending_[i].steps;
  }
  if (summed && !ctx_.agreed) sums = sum_over_ranks(sums, *ctx_.pg, ctx_.device);
  for (std::int64_t i = 0; i < k; ++i) {
    const PendingEpoch& p = pending_[i];
    last_epoch_loss_ =
        ctx_.agreed ? p.agreed_loss : sums.data<float>()[2 * i] / std::max(1.f, sums.data<float>()[2 * i + 1]);
    nlohmann::json rec{{"epoch", p.epoch + 1}, {whole ? "train_loss" : "train_loss_rank0", last_epoch_loss_}};
    train_curve_.x.push_back(static_cast<double>(p.epoch + 1));
    train_curve_.y.push_back(last_epoch_loss_);
    if (ctx_.validation) {
      rec["val_loss"] = p.test_loss;
      test_curve_.x.push_back(static_cast<double>(p.epoch + 1));
      test_curve_.y.push_back(p.test_loss);
    } else if (ctx_.has_test) {
      rec["test_loss"] = p.test_loss;
      rec["test_acc"] = p.test_acc;
      test_acc_ = p.test_acc;
      test_curve_.x.push_back(static_cast<double>(p.epoch + 1));
      test_curve_.y.push_back(p.test_loss);
    }
    metrics_.record_epoch(rec);
    if (rank_ == 0) {
      char line[1024];  // room for two doubles of 309 digits (a diverged loss in %.4f)
      std::size_t len = static_cast<std::size_t>(std::snprintf(
          line, sizeof line, "epoch %lld: train loss %.4f", static_cast<long long>(p.epoch + 1), last_epoch_loss_));
      if (ctx_.validation && len < sizeof line)
        len += static_cast<std::size_t>(
            std::snprintf(line + len, sizeof line - len, ", validation loss %.4f", p.test_loss));
      else if (ctx_.has_test && len < sizeof line)
        len += static_cast<std::size_t>(std::snprintf(line + len, sizeof line - len, ", test loss %.4f, test accuracy %.4f",
                                                      p.test_loss, p.test_acc));
      if (!whole && len < sizeof line)
        len += static_cast<std::size_t>(std::snprintf(line + len, sizeof line - len,
                                                      " (rank 0's batches only: the run stopped before the sum over the ranks)"));
      progress_.end_epoch();  // ends the bar's line (with a bar, every epoch is reported as it ends)
      console_.append(line, std::min(len, sizeof line - 1)).push_back('\n');
    }
  }
  if (rank_ == 0) {
    // One write for the group: stdout is line-buffered under phalanx-run, where a line
    // at a time would cost a write (and a wake-up of the launcher) each.
    std::fwrite(console_.data(), 1, console_.size(), stdout);
    std::fflush(stdout);
    console_.clear();
  }
  pending_.clear();
  steps_unreported_ = 0;
}

}  // namespace phalanx::trainer
