#include "stop_report.hpp"

#include <csignal>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

namespace phalanx::launcher {

namespace {
std::string signal_name(int sig) {
  const char* abbrev = sig > 0 ? sigabbrev_np(sig) : nullptr;
  return abbrev ? std::string("SIG") + abbrev : "a stop request";
}
}  // namespace

std::optional<StopRecord> read_stop_record(Store* store, int restart_count) {
  if (!store) return std::nullopt;
  try {
    const std::string key = "phalanx/r" + std::to_string(restart_count) + "/stopped";
    if (!store->check({key})) return std::nullopt;
    const Bytes b = store->get(key);
    const auto j = nlohmann::json::parse(b.begin(), b.end(), nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
    StopRecord r;
    r.step = j["step"].get<std::int64_t>();
    r.path = j.value("path", std::string());
    r.signal = j.value("signal", 0);
    r.error = j.value("error", std::string());
    return r;
  } catch (const std::exception&) {
    return std::nullopt;  // the store's host (node 0's launcher) is gone
  }
}

int report_stop(const Outcome& r, const std::optional<StopRecord>& rec, const LaunchOptions& o) {
  const int sig = r.signal_received ? r.signal_received : rec ? rec->signal : 0;
  const std::string name = signal_name(sig);
  if (rec && !rec->error.empty()) {
    std::fprintf(stderr, "phalanx-run: stopped by %s, but rank 0 could not save step %lld: %s; nothing was saved.\n",
                 name.c_str(), static_cast<long long>(rec->step), rec->error.c_str());
    return 1;
  }
  if (r.stopped_after_save == o.nproc_per_node) {
    if (rec)
      std::fprintf(stderr, "phalanx-run: stopped by %s after saving step %lld to %s; rerun with --resume to continue.\n",
                   name.c_str(), static_cast<long long>(rec->step), rec->path.c_str());
    else
      std::fprintf(stderr, "phalanx-run: stopped by %s; the workers saved and exited with status %d.\n", name.c_str(),
                   kExitStoppedAfterSave);
    return kExitStoppedAfterSave;
  }
  if (r.exited_ok == o.nproc_per_node) {
    std::fprintf(stderr, "phalanx-run: got %s as the job finished: every worker completed and exited 0.\n", name.c_str());
    return 0;
  }
  if (r.killed_at_deadline > 0)
    std::fprintf(stderr,
                 "phalanx-run: got %s; %d worker(s) did not exit within --term-timeout %g s and were killed%s.\n",
                 name.c_str(), r.killed_at_deadline, o.term_timeout,
                 rec ? (" (step " + std::to_string(rec->step) + " was saved to " + rec->path + ")").c_str()
                     : "; raise --term-timeout to give them time to save");
  else
    std::fprintf(stderr, "phalanx-run: got %s, stopped all workers.\n", name.c_str());
  return 128 + (sig > 0 ? sig : SIGTERM);
}

}  // namespace phalanx::launcher
