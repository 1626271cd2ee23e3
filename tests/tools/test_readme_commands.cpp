// The README's commands run as written. Every command line of its ```sh blocks that starts
// with build/ runs verbatim from a scratch directory laid out like the repository root
// (build -> this build directory, examples -> the sources' examples), so the files the
// commands write stay out of the source tree. PHALANX_TRAIN_MAX_EPOCHS=1 shortens the
// phalanx-train runs (announced on stderr). scripts/*.sh lines are not run here: they build
// and test the whole tree (CI runs scripts/test.sh itself).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The command lines of the ```sh blocks, with "\" continuations joined.
std::vector<std::string> sh_commands(const std::string& markdown) {
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

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace

TEST_CASE("the README's ```sh commands run as written") {
  const auto commands = sh_commands(read(std::string(PHALANX_SOURCE_DIR) + "/README.md"));
  const std::string work = "/tmp/phalanx_readme_" + std::to_string(::getpid());
  REQUIRE(std::system(("rm -rf " + work + " && mkdir -p " + work + " && ln -s " PHALANX_BUILD_DIR " " + work +
                       "/build && ln -s " PHALANX_SOURCE_DIR "/examples " + work + "/examples")
                          .c_str()) == 0);
  int ran = 0, trainer_runs = 0;
  for (std::size_t i = 0; i < commands.size(); ++i) {
    const std::string& cmd = commands[i];
    if (cmd.rfind("scripts/", 0) == 0) continue;
    REQUIRE_MESSAGE(cmd.rfind("build/", 0) == 0, "a README command this test does not know how to run: " << cmd);
    CAPTURE(cmd);
    const std::string script = work + "/cmd" + std::to_string(i) + ".sh", log = work + "/cmd" + std::to_string(i) + ".log";
    std::ofstream(script) << cmd << "\n";
    const int status = std::system(("cd " + work + " && PHALANX_TRAIN_MAX_EPOCHS=1 timeout 600 sh " + script + " > " +
                                    log + " 2>&1")
                                       .c_str());
    const std::string out = read(log);
    INFO(out);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    ++ran;
    if (cmd.find("build/bin/phalanx-train") != std::string::npos) {
      ++trainer_runs;
      CHECK(out.find("\"final_train_loss\":") != std::string::npos);
    }
    // the files the command says it writes are there
    const std::regex output(R"(--(metrics|plot|save|checkpoint-dir) (\S+))");
    for (auto it = std::sregex_iterator(cmd.begin(), cmd.end(), output); it != std::sregex_iterator(); ++it)
      CHECK_MESSAGE(exists(work + "/" + (*it)[2].str()), (*it)[0].str());
  }
  CHECK(trainer_runs >= 2);
  CHECK(ran >= 4);
  std::system(("rm -rf " + work).c_str());
}
