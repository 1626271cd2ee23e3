#include "failure_records.hpp"

#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

#include "phalanx/parallel/internal/failure_records.hpp"

namespace phalanx::launcher {

using nlohmann::json;

std::int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool read_failure_record(Store& store, int restart_count, WorkerFailure& f) {
  try {
    if (const auto rec = parallel::read_failure(store, parallel::failure_key(restart_count, std::to_string(f.rank)))) {
      f.has_record = true;
      f.secondary = rec->secondary;
      f.message = rec->message;
      f.step = rec->step;
      if (rec->unix_ns != 0) f.unix_ns = rec->unix_ns;  // else the launcher's own time of the exit
    }
    const auto first = parallel::read_failure(store, parallel::failure_key(restart_count, "first"));
    if (first && first->rank == f.rank) {
      f.is_first = true;
      if (!f.has_record) {
        f.message = first->message;
        f.step = first->step;
      }
    }
  } catch (const std::exception&) {
    return false;  // the store is gone (its host exited): blame by what the launcher saw
  }
  return true;
}

bool post_first_failure(Store& store, int restart_count, const WorkerFailure& f) {
  parallel::FailureRecord rec;
  rec.rank = f.rank;
  rec.message = "killed by signal " + std::to_string(f.term_signal) + " (" +
                (sigabbrev_np(f.term_signal) ? std::string("SIG") + sigabbrev_np(f.term_signal) : "?") + ")";
  rec.unix_ns = f.unix_ns;
  const std::string text = parallel::encode_failure(rec);
  const Bytes desired(text.begin(), text.end());
  try {
    return store.compare_set(parallel::failure_key(restart_count, "first"), {}, desired) == desired;
  } catch (const std::exception&) {
    return false;
  }
}

std::string to_json(const WorkerFailure& f) {
  return json{{"node", f.node},
              {"rank", f.rank},
              {"pid", f.pid},
              {"exit_code", f.exit_code},
              {"term_signal", f.term_signal},
              {"signal_from_launcher", f.signal_from_launcher},
              {"after_stop", f.after_stop},
              {"reap_round", f.reap_round},
              {"unix_ns", f.unix_ns},
              {"has_record", f.has_record},
              {"secondary", f.secondary},
              {"is_first", f.is_first},
              {"message", f.message},
              {"step", f.step}}
      .dump(-1, ' ', false, json::error_handler_t::replace);  // a message is any bytes
}

bool from_json(const std::string& text, WorkerFailure& f) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return false;
  try {
    f.node = j.at("node").get<int>();
    f.rank = j.at("rank").get<int>();
    f.pid = j.at("pid").get<int>();
    f.exit_code = j.at("exit_code").get<int>();
    f.term_signal = j.at("term_signal").get<int>();
    f.signal_from_launcher = j.at("signal_from_launcher").get<bool>();
    f.after_stop = j.at("after_stop").get<bool>();
    f.reap_round = j.at("reap_round").get<int>();
    f.unix_ns = j.at("unix_ns").get<std::int64_t>();
    f.has_record = j.at("has_record").get<bool>();
    f.secondary = j.at("secondary").get<bool>();
    f.is_first = j.at("is_first").get<bool>();
    f.message = j.at("message").get<std::string>();
    f.step = j.at("step").get<std::int64_t>();
  } catch (const json::exception&) {
    return false;
  }
  return true;
}

}  // namespace phalanx::launcher
