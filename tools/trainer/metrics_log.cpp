#include "metrics_log.hpp"

#include <unistd.h>

#include <cstdio>
#include <vector>

#include <phalanx/core/error.hpp>

namespace phalanx::trainer {

void MetricsLog::open_fresh(const std::string& path) {
  path_ = path;
  out_.open(path, std::ios::trunc);
  if (!out_) throw IoError("--metrics " + path + ": cannot write");
}

void MetricsLog::open_resumed(const std::string& path, std::int64_t step, std::int64_t epoch) {
  path_ = path;
  std::vector<std::string> keep;
  {
    std::ifstream in(path);
    if (!in) return open_fresh(path);
    std::string line;
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;  // a line torn by a crash
      if (j.contains("step") && j["step"].is_number_integer()) {
        if (j["step"].get<std::int64_t>() <= step) keep.push_back(line);
      } else if (j.contains("train_loss") && j.contains("epoch") && j["epoch"].is_number_integer()) {
        if (j["epoch"].get<std::int64_t>() <= epoch) keep.push_back(line);
      }  // anything else (the final evaluation) belongs to the end of a run: dropped
    }
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());  // not another writer's
  {
    std::ofstream o(tmp, std::ios::trunc);
    for (const auto& l : keep) o << l << "\n";
    if (!o.flush()) throw IoError("--metrics " + path + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw IoError("--metrics " + path + ": cannot replace it");
  out_.open(path, std::ios::app);
  if (!out_) throw IoError("--metrics " + path + ": cannot write");
}

void MetricsLog::step(std::int64_t step, std::int64_t epoch, double loss, double lr, double seconds) {
  if (!out_.is_open()) return;
  out_ << nlohmann::json{{"step", step}, {"epoch", epoch}, {"loss", loss}, {"lr", lr}, {"seconds", seconds}}.dump()
       << "\n";
}

void MetricsLog::record(const nlohmann::json& rec) {
  if (out_.is_open()) out_ << rec.dump() << "\n";
}

void MetricsLog::close() {
  if (!out_.is_open()) return;
  out_.flush();
  const bool failed = !out_;
  out_.close();
  if (failed || !out_) throw IoError("--metrics " + path_ + ": write failed (disk full?); the file is incomplete");
}

void MetricsLog::flush() {
  if (out_.is_open() && !out_.flush()) throw IoError("--metrics " + path_ + ": write failed");
}

}  // namespace phalanx::trainer
