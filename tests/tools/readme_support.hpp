#pragma once
// Reading the README and running its commands as written: each command runs from a scratch
// directory laid out like the repository root (build -> this build directory, examples -> the
// sources' examples), so the files the commands write stay out of the source tree.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace phalanx::test {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string readme() { return read_text(std::string(PHALANX_SOURCE_DIR) + "/README.md"); }

// The command lines of the ```sh blocks, with "\" continuations joined and trailing comments cut.
inline std::vector<std::string> sh_commands(const std::string& markdown) {
  std::vector<std::string> out;
  std::istringstream in(markdown);
  std::string line, pending;
  bool in_sh = false;
  while (std::getline(in, line)) {
    if (!in_sh) {
      in_sh = line == "```sh";
      continue;
    }
    if (line.rfind("```", 0) == 0) {
      in_sh = false;
      continue;
    }
    const bool continued = !line.empty() && line.back() == '\\';
    pending += continued ? line.substr(0, line.size() - 1) : line;
    if (continued) continue;
    const auto hash = pending.find(" #");  // a trailing comment
    if (hash != std::string::npos) pending.resize(hash);
    const auto start = pending.find_first_not_of(' ');
    if (start != std::string::npos) out.push_back(pending.substr(start));
    pending.clear();
  }
  return out;
}

// A scratch directory laid out like the repository root; removed by its destructor.
class ReadmeScratch {
 public:
  explicit ReadmeScratch(const std::string& tag)
      : dir_("/tmp/phalanx_readme_" + tag + "_" + std::to_string(::getpid())) {
    ok_ = std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_ + " && ln -s " PHALANX_BUILD_DIR " " + dir_ +
                       "/build && ln -s " PHALANX_SOURCE_DIR "/examples " + dir_ + "/examples")
                          .c_str()) == 0;
  }
  ~ReadmeScratch() { std::system(("rm -rf " + dir_).c_str()); }
  ReadmeScratch(const ReadmeScratch&) = delete;
  ReadmeScratch& operator=(const ReadmeScratch&) = delete;
  bool ok() const { return ok_; }
  const std::string& dir() const { return dir_; }

  struct Result {
    int exit_code = -1;  ///< -1: killed by a signal or the time limit
    std::string output;  ///< stdout and stderr together
  };
  /// Runs `cmd` with sh from the scratch directory, `env` (e.g. "X=1 ") before it.
  Result run(const std::string& cmd, const std::string& env = "", int timeout_s = 600) {
    const std::string n = std::to_string(runs_++);
    const std::string script = dir_ + "/cmd" + n + ".sh", log = dir_ + "/cmd" + n + ".log";
    std::ofstream(script) << cmd << "\n";
    const int status = std::system(("cd " + dir_ + " && " + env + "timeout " + std::to_string(timeout_s) + " sh " +
                                    script + " > " + log + " 2>&1")
                                       .c_str());
    Result r;
    r.output = read_text(log);
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    return r;
  }

 private:
  std::string dir_;
  bool ok_ = false;
  int runs_ = 0;
};

}  // namespace phalanx::test
