#pragma once
// Running phalanx-train from tests: the case study's data as a user brings it (.npy files
// and PyTorch's initial weights), and a command run with its output captured.
#include <dirent.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include <unistd.h>

#include <phalanx/phalanx.hpp>

namespace trainer_test {

/// A fresh /tmp/<prefix>_<pid> holding x.npy, y.npy and init.npz (the textbook's weights)
/// from examples/data/seed_case_study.npz.
inline std::string case_study_dir(const std::string& prefix) {
  using namespace phalanx;
  const std::string p = "/tmp/" + prefix + "_" + std::to_string(::getpid());
  std::system(("rm -rf " + p + " && mkdir -p " + p).c_str());
  const TensorMap f = load_npz(std::string(PHALANX_EXAMPLE_DATA) + "/seed_case_study.npz");
  save_npy(p + "/x.npy", f.at("x"));
  save_npy(p + "/y.npy", f.at("y"));
  TensorMap init;
  for (const char* k : {"0.weight", "0.bias", "2.weight", "2.bias"}) init.set(k, f.at(k));
  save_npz(p + "/init.npz", init);
  return p;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// The live children of `parent` whose command line mentions phalanx-train.
inline std::vector<pid_t> workers_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  while (const dirent* e = proc ? ::readdir(proc) : nullptr) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    char state;
    int ppid;
    if (close == std::string::npos || std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2 ||
        ppid != parent || state == 'Z')
      continue;
    if (slurp("/proc/" + std::to_string(pid) + "/cmdline").find("phalanx-train") != std::string::npos) out.push_back(pid);
  }
  if (proc) ::closedir(proc);
  return out;
}

/// The largest |a - b| over every weight of two .npz files of the same keys and shapes;
/// infinity when their keys or shapes differ.
inline double max_weight_diff(const std::string& a_path, const std::string& b_path) {
  using namespace phalanx;
  const TensorMap a = load_npz(a_path), b = load_npz(b_path);
  if (a.size() != b.size()) return HUGE_VAL;
  double worst = 0;
  for (const auto& [k, v] : a) {
    if (!b.contains(k)) return HUGE_VAL;
    const auto x = v.to_vector<float>(), y = b.at(k).to_vector<float>();
    if (x.size() != y.size()) return HUGE_VAL;
    for (std::size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(x[i]) - static_cast<double>(y[i])));
  }
  return worst;
}

struct Result {
  int code;
  std::string out;
};

/// Runs a shell command with stdout and stderr in `log`; its exit code (-1 when killed).
inline Result run_command(const std::string& cmd, const std::string& log) {
  const int status = std::system((cmd + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(log)};
}

}  // namespace trainer_test
