// The README's commands run as written. Every command line of its ```sh blocks that starts
// with build/ runs verbatim from a scratch directory laid out like the repository root
// (build -> this build directory, examples -> the sources' examples), so the files the
// commands write stay out of the source tree. A phalanx-train command gets " --epochs 1"
// appended: the later value of an option wins, so the run is the README's, one epoch long.
// scripts/*.sh lines are not run here: they build and test the whole tree (CI runs
// scripts/test.sh itself).
#include <doctest/doctest.h>

#include <regex>
#include <string>

#include "readme_support.hpp"

using phalanx::test::ReadmeScratch;

namespace {
bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }
}  // namespace

TEST_CASE("the README's ```sh commands run as written") {
  const auto commands = phalanx::test::sh_commands(phalanx::test::readme());
  ReadmeScratch work("commands");
  REQUIRE(work.ok());
  int ran = 0, trainer_runs = 0;
  for (const std::string& cmd : commands) {
    if (cmd.rfind("scripts/", 0) == 0) continue;
    REQUIRE_MESSAGE(cmd.rfind("build/", 0) == 0, "a README command this test does not know how to run: " << cmd);
    CAPTURE(cmd);
    const bool trains = cmd.find("build/bin/phalanx-train") != std::string::npos;
    const auto r = work.run(trains ? cmd + " --epochs 1" : cmd);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    ++ran;
    if (trains) {
      ++trainer_runs;
      CHECK(r.output.find("\"final_train_loss\":") != std::string::npos);
    }
    // the files the command says it writes are there
    const std::regex output(R"(--(metrics|plot|save|checkpoint-dir) (\S+))");
    for (auto it = std::sregex_iterator(cmd.begin(), cmd.end(), output); it != std::sregex_iterator(); ++it)
      CHECK_MESSAGE(exists(work.dir() + "/" + (*it)[2].str()), (*it)[0].str());
  }
  CHECK(trainer_runs >= 2);
  CHECK(ran >= 4);
}
