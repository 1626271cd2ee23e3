#pragma once
// Where the files that travel with the examples and benchmarks live (the examples' data, the
// benchmarks' PyTorch peers and their interpreter), with no path compiled in: an environment
// variable when set, else a folder beside the executable or one folder up. The build tree
// links examples/data and bench/peers there (examples/CMakeLists.txt, bench/CMakeLists.txt);
// the GPU bundle (scripts/gpu-bundle.sh) has bin/, data/ and peers/ side by side.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace phalanx::relocatable {

/// The folder of the running executable (symbolic links resolved), or "." if unknown.
inline std::string executable_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  const std::string exe(buf, static_cast<std::size_t>(n));
  const auto slash = exe.rfind('/');
  return slash == std::string::npos ? "." : exe.substr(0, slash);
}

inline bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// The path of `folder/file`: `$env_var/file` when `env_var` is set, else the first of
/// `<exe dir>/folder/file` and `<exe dir>/../folder/file` that exists. Throws a one-line
/// error that names the variable to set when there is none.
inline std::string find_file(const char* env_var, const std::string& folder, const std::string& file) {
  if (const char* env = std::getenv(env_var); env && *env) {
    const std::string p = std::string(env) + "/" + file;
    if (!file_exists(p))
      throw std::runtime_error(std::string(env_var) + "=" + env + " has no " + file + "; point it at the folder that holds " + file);
    return p;
  }
  const std::string dir = executable_dir();
  for (const std::string& base : {dir, dir + "/.."}) {
    const std::string p = base + "/" + folder + "/" + file;
    if (file_exists(p)) return p;
  }
  throw std::runtime_error("cannot find " + folder + "/" + file + " beside " + dir + " or one folder up; set " + env_var +
                           " to the folder that holds " + file);
}

/// The Python that runs the PyTorch peers: $PHALANX_PYTHON when set, else the first of
/// `python3` on the PATH and /usr/bin/python3 that imports torch (asked once), else python3.
inline const std::string& python() {
  static const std::string chosen = [] {
    if (const char* env = std::getenv("PHALANX_PYTHON"); env && *env) return std::string(env);
    for (const char* candidate : {"python3", "/usr/bin/python3"})
      if (std::system((std::string(candidate) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0)
        return std::string(candidate);
    return std::string("python3");
  }();
  return chosen;
}

}  // namespace phalanx::relocatable
