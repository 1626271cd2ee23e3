#include "metrics_log.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <phalanx/core/error.hpp>
#include <phalanx/core/file_safety.hpp>
#include <phalanx/core/warning.hpp>

namespace phalanx::trainer {

namespace {

// A double laid out as nlohmann::json::dump() lays it out (fixed notation for decimal
// exponents in (-4, 15], else d.ddde+XX; NaN and infinities as null), with the shortest
// digits that read back as the same double (nlohmann's Grisu2 now and then writes one digit
// more: the value read back is the same), without building a JSON object per step.
void append_number(std::string& s, double v) {
  if (!std::isfinite(v)) {
    s += "null";
    return;
  }
  if (v == 0) {
    s += std::signbit(v) ? "-0.0" : "0.0";
    return;
  }
  char b[40];
  char* end = std::to_chars(b, b + sizeof b - 1, v, std::chars_format::scientific).ptr;
  *end = '\0';  // for atoi below
  const char* p = b;
  if (*p == '-') s += *p++;
  const char* e = std::find(p, static_cast<const char*>(end), 'e');
  char dig[24];
  int k = 0;
  for (const char* q = p; q < e; ++q)
    if (*q != '.') dig[k++] = *q;
  const int n = std::atoi(e + 1) + 1;  // the value is 0.DIGITS x 10^n
  if (k <= n && n <= 15) {
    s.append(dig, k);
    s.append(n - k, '0');
    s += ".0";
  } else if (0 < n && n <= 15) {
    s.append(dig, n);
    s += '.';
    s.append(dig + n, k - n);
  } else if (-4 < n && n <= 0) {
    s += "0.";
    s.append(-n, '0');
    s.append(dig, k);
  } else {
    s += dig[0];
    if (k > 1) {
      s += '.';
      s.append(dig + 1, k - 1);
    }
    const int x = std::abs(n - 1);
    s += n - 1 < 0 ? "e-" : "e+";
    if (x < 10) s += '0';
    s += std::to_string(x);
  }
}

// Creates the file, or truncates it (`append`: keeps it), never through a symbolic link
// that another user planted (this run would overwrite its target). Returns the descriptor;
// `regular`: whether it is a regular file (not /dev/null or a FIFO).
int prepare(const std::string& path, bool append, bool& regular) {
  try {
    const int fd = files::open_output(path, append);
    struct stat st {};
    regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    return fd;
  } catch (const IoError& e) {
    throw IoError(std::string("--metrics ") + e.what());
  }
}

void write_all(int fd, const std::string& text) {
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw IoError(std::string("write failed (") + std::strerror(errno) + ")");
    done += static_cast<std::size_t>(w);
  }
}

}  // namespace

// The stream opens the checked descriptor's file (never the name again: it could have been
// swapped for a link since), then the descriptor is closed.
void MetricsLog::open_through(int fd) {
  out_.open(files::fd_path(fd), std::ios::app);
  ::close(fd);
  if (!out_) throw IoError("--metrics " + path_ + ": cannot write");
}

void MetricsLog::open_fresh(const std::string& path) {
  path_ = path;
  bool regular = false;
  open_through(prepare(path, false, regular));
}

void MetricsLog::open_resumed(const std::string& path, std::int64_t step, std::int64_t epoch) {
  path_ = path;
  bool regular = false;
  const int old_fd = prepare(path, true, regular);
  if (!regular) return open_through(old_fd);  // nothing to trim in /dev/null or a FIFO
  std::string keep;
  {
    std::ifstream in(files::fd_path(old_fd));
    ::close(old_fd);
    std::string line;
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;  // a line torn by a crash
      if (j.contains("step") && j["step"].is_number_integer()) {
        if (j["step"].get<std::int64_t>() <= step) keep += line + "\n";
      } else if (j.contains("train_loss") && j.contains("epoch") && j["epoch"].is_number_integer()) {
        if (j["epoch"].get<std::int64_t>() <= epoch) keep += line + "\n";
      }  // anything else (the final evaluation) belongs to the end of a run: dropped
    }
  }
  std::string tmp;
  int fd = -1;
  try {
    fd = files::create_temp(path, 0666, tmp);  // a new file: never another writer's, never a planted link
    write_all(fd, keep);
  } catch (const IoError& e) {
    if (fd >= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
    }
    throw IoError("--metrics " + path + ": cannot write " + (tmp.empty() ? "a temporary file" : tmp) + ": " + e.what());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw IoError("--metrics " + path + ": cannot replace it");
  }
  open_through(fd);  // the file just written, under its new name
}

void MetricsLog::open_tensorboard(const std::string& dir, std::int64_t first_step, std::int64_t samples_per_step,
                                  std::int64_t steps_per_epoch) {
  tb_.emplace(dir, parallel::TensorBoardWriterOptions().purge_step(first_step));
  samples_per_step_ = samples_per_step;
  steps_per_epoch_ = steps_per_epoch;
}

void MetricsLog::tb_scalar(const char* tag, double value, std::int64_t step) {
  if (!tb_) return;
  try {
    tb_->add_scalar(tag, value, step);
  } catch (const IoError& e) {
    // A full disk under the event files must not cost the training since the last
    // checkpoint: TensorBoard stops here, the run goes on, and close() reports it (as a
    // failed --metrics write is reported).
    tb_error_ = e.what();
    warn(std::string("--tensorboard: ") + e.what() + "; no more TensorBoard events are written, training goes on");
    tb_.reset();
  }
}

void MetricsLog::step(std::int64_t step, std::int64_t epoch, double loss, double lr, double seconds, double grad_norm) {
  if (tb_) {
    tb_scalar("train/loss", loss, step);
    tb_scalar("train/lr", lr, step);
    tb_scalar("train/grad_norm", grad_norm, step);
    if (last_seconds_ >= 0 && seconds > last_seconds_) {
      tb_scalar("train/step_seconds", seconds - last_seconds_, step);
      tb_scalar("train/samples_per_second", static_cast<double>(samples_per_step_) / (seconds - last_seconds_), step);
    }
    last_seconds_ = seconds;
  }
  if (!out_.is_open()) return;
  // The keys in nlohmann::json's (sorted) order, as record() would write them.
  line_.assign("{\"epoch\":");
  line_ += std::to_string(epoch);
  line_ += ",\"loss\":";
  append_number(line_, loss);
  line_ += ",\"lr\":";
  append_number(line_, lr);
  line_ += ",\"seconds\":";
  append_number(line_, seconds);
  line_ += ",\"step\":";
  line_ += std::to_string(step);
  line_ += "}\n";
  if (held_.empty()) out_ << line_;
  else held_.back() += line_;
}

void MetricsLog::record(const nlohmann::json& rec) {
  if (out_.is_open()) out_ << rec.dump() << "\n";
}

void MetricsLog::hold() {
  if (out_.is_open()) held_.emplace_back();
}

void MetricsLog::record_epoch(const nlohmann::json& rec) {
  if (tb_ && rec.contains("train_loss")) {  // not train_loss_rank0: one rank's batches are no epoch's loss
    // At the epoch's last step: one x axis for every curve, and a resumed run's purge_step
    // (a step) hides an epoch the earlier run reported after the checkpoint.
    const std::int64_t at = rec["epoch"].get<std::int64_t>() * steps_per_epoch_;
    tb_scalar("epoch/train_loss", rec["train_loss"].get<double>(), at);
    if (rec.contains("test_loss")) tb_scalar("epoch/test_loss", rec["test_loss"].get<double>(), at);
    if (rec.contains("test_acc")) tb_scalar("epoch/test_accuracy", rec["test_acc"].get<double>(), at);
    if (rec.contains("val_loss")) tb_scalar("epoch/val_loss", rec["val_loss"].get<double>(), at);
  }
  if (!out_.is_open()) return;
  out_ << rec.dump() << "\n";
  if (held_.empty()) return;
  out_ << held_.front();
  held_.pop_front();
}

MetricsLog::~MetricsLog() {
  if (!out_.is_open()) return;
  for (const auto& steps : held_) out_ << steps;
  out_.close();  // unwinding already: a failed write is not reported twice
}

void MetricsLog::close() {
  // The JSON Lines file first: a TensorBoard error must not leave it unflushed.
  bool failed = false;
  if (out_.is_open()) {
    for (const auto& steps : held_) out_ << steps;
    held_.clear();
    out_.flush();
    failed = !out_;
    out_.close();
    failed = failed || !out_;
  }
  if (tb_) tb_->close();  // fdatasync: throws IoError naming the file when it fails
  if (failed) throw IoError("--metrics " + path_ + ": write failed (disk full?); the file is incomplete");
  if (!tb_error_.empty())
    throw IoError("--tensorboard: " + tb_error_ + "; the event files stop at that point (training went on)");
}

void MetricsLog::flush() {
  if (out_.is_open() && !out_.flush()) throw IoError("--metrics " + path_ + ": write failed");
}

}  // namespace phalanx::trainer
