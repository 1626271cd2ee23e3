#include "phalanx/parallel/tensorboard_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "phalanx/core/error.hpp"
#include "tensorboard_records.hpp"

namespace phalanx::parallel {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// SummaryWriter's default folder: runs/Dec03_11-42-05_<host>.
std::string default_log_dir() {
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &local);
  return "runs/" + std::string(stamp) + "_" + host_name();
}

std::atomic<int> g_files{0};

// The <time> of a new file's name: now, or one past the newest file already in `dir` when
// that is not older. TensorBoard reads a folder's files in name order, so a run resumed
// within the same second as the one it resumes (or on a clock that went back) still comes
// after it, and its purge_step hides the right events.
long long file_time(const std::string& dir) {
  long long t = static_cast<long long>(std::time(nullptr));
  std::error_code ec;
  const std::string stem = "events.out.tfevents.";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, stem.size(), stem) != 0) continue;
    char* end = nullptr;
    const long long theirs = std::strtoll(name.c_str() + stem.size(), &end, 10);
    if (end && *end == '.' && theirs >= t) t = theirs + 1;
  }
  return t;
}  // the <n> of the file name: writers of one process never collide

}  // namespace

TensorBoardWriter::TensorBoardWriter(std::string log_dir, TensorBoardWriterOptions options)
    : log_dir_(log_dir.empty() ? default_log_dir() : std::move(log_dir)) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
  if (ec)
    throw IoError("TensorBoardWriter: cannot create the log folder '" + log_dir_ + "': " + ec.message() +
                  "; pass a folder this process can write");
  char stamp[24];
  std::snprintf(stamp, sizeof stamp, "%010lld", file_time(log_dir_));  // SummaryWriter's width
  file_ = log_dir_ + "/events.out.tfevents." + stamp + "." +
          host_name() + "." + std::to_string(getpid()) + "." + std::to_string(g_files.fetch_add(1)) +
          options.filename_suffix();
  fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw IoError("TensorBoardWriter: cannot create '" + file_ + "': " + std::strerror(errno) +
                  "; pass a folder this process can write");
  const double t = now_seconds();
  tensorboard::encode_file_version_event(event_, t);
  write_record(event_);
  if (options.purge_step() >= 0) {
    tensorboard::encode_session_start_event(event_, t, options.purge_step());
    write_record(event_);
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write_record(const std::string& event) {
  if (fd_ < 0) throw IoError("TensorBoardWriter: '" + file_ + "' is closed; create a new writer");
  record_.clear();
  tensorboard::append_record(record_, event);
  const char* p = record_.data();
  std::size_t left = record_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      // Cut a partly written record off again: TensorBoard's reader stops at a torn record,
      // so one left in the middle would hide every event written after it.
      if (left < record_.size()) (void)::ftruncate(fd_, good_size_);
      throw IoError("TensorBoardWriter: writing '" + file_ + "' failed: " + std::strerror(err) +
                    " (is the disk full?)");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  good_size_ += static_cast<std::int64_t>(record_.size());
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, std::int64_t global_step, double walltime) {
  if (tag.empty()) throw ValueError("TensorBoardWriter::add_scalar: the tag is empty; name the curve, e.g. \"train/loss\"");
  std::lock_guard<std::mutex> lock(mu_);
  tensorboard::encode_scalar_event(event_, walltime < 0 ? now_seconds() : walltime, global_step, tag,
                                   static_cast<float>(value));
  write_record(event_);
}

void TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0 && ::fdatasync(fd_) != 0)
    throw IoError("TensorBoardWriter: flushing '" + file_ + "' failed: " + std::strerror(errno));
}

void TensorBoardWriter::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  const int synced = ::fdatasync(fd_);
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (synced != 0) throw IoError("TensorBoardWriter: flushing '" + file_ + "' failed: " + std::strerror(err));
}

}  // namespace phalanx::parallel
