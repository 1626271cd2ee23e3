// The figures README.md quotes are what its commands print today. Each check finds the figure
// in the README's own text (so editing the README without rerunning fails here), runs the
// command the README gives for it, as written, and compares:
//   - the demo's table (scripts/demo.sh's command): every row's words equal, its losses within
//     1.5e-4 (printed to 4 decimals; the one-process "variant" row goes through OpenBLAS, whose
//     kernel depends on the CPU);
//   - "A test accuracy after N epochs: `command`" and the CNN section's two accuracies: within
//     0.002 of the final epoch's test accuracy (OpenBLAS's kernel differs by CPU: the MLP gives
//     0.8883 on one machine of this kind and 0.8874 on another);
//   - the trainer's JSON summary: every key equal except "seconds" (a wall-clock time, only
//     required to be there); final_train_loss within 1.5e-4.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "readme_support.hpp"

using phalanx::test::ReadmeScratch;

namespace {

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool number(const std::string& s, double& v) {
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

// The one match of `pattern` in the README; fails the test when there is none or several.
std::smatch the_match(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  std::smatch m;
  auto begin = text.cbegin();
  int found = 0;
  std::smatch first;
  while (std::regex_search(begin, text.cend(), m, re)) {
    if (found++ == 0) first = m;
    begin = m.suffix().first;
  }
  INFO("README pattern: " << pattern);
  REQUIRE(found == 1);
  return first;
}

// The last "test accuracy X" a run printed.
double final_accuracy(const std::string& output) {
  const std::regex re(R"(test accuracy (\d\.\d+))");
  double last = -1;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it)
    last = std::stod((*it)[1].str());
  return last;
}

void check_accuracy(ReadmeScratch& work, const std::string& quoted, const std::string& cmd) {
  CAPTURE(cmd);
  const auto r = work.run(cmd);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const double printed = final_accuracy(r.output), readme_value = std::stod(quoted);
  MESSAGE("README says " << quoted << ", the command prints " << printed);
  CHECK(std::fabs(printed - readme_value) <= 0.002);
}

}  // namespace

TEST_CASE("the demo's table in the README is what the demo prints") {
  const std::string text = phalanx::test::readme();
  // scripts/demo.sh runs this (plus --plot): the case study on 4 workers over Gloo
  std::string demo = phalanx::test::read_text(std::string(PHALANX_SOURCE_DIR) + "/scripts/demo.sh");
  REQUIRE(demo.find("--nproc-per-node 4 --backend gloo") != std::string::npos);
  ReadmeScratch work("demo");
  REQUIRE(work.ok());
  const auto r = work.run("build/bin/phalanx-run --nproc-per-node 4 --backend gloo build/examples/lr_scaling_study");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  int rows = 0;
  const std::regex row(R"((^|\n)(\[0\] (single|direct|linear|variant|warmup) [^\n]*))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), row); it != std::sregex_iterator(); ++it) {
    const std::string quoted = (*it)[2].str(), name = (*it)[3].str();
    CAPTURE(quoted);
    const std::smatch printed = the_match(r.output, "\\[0\\] " + name + " +[0-9][^\n]*");
    const auto a = words(quoted), b = words(printed[0].str());
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      double x, y;
      if (a[i].find('.') != std::string::npos && number(a[i], x) && number(b[i], y))
        CHECK_MESSAGE(std::fabs(x - y) <= 1.5e-4, a[i] << " printed as " << b[i]);
      else
        CHECK_MESSAGE(a[i] == b[i], a[i] << " printed as " << b[i]);
    }
    ++rows;
  }
  CHECK(rows == 5);
}

TEST_CASE("the accuracies the README quotes are what the examples print") {
  const std::string text = phalanx::test::readme();
  ReadmeScratch work("accuracy");
  REQUIRE(work.ok());
  // "<acc> test accuracy after 5 epochs: `command`" (the examples table)
  const std::regex claim(R"((\d\.\d+) test accuracy after (\d+) epochs: `([^`]+)`)");
  int claims = 0;
  std::string cnn_command, cnn_figure;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), claim); it != std::sregex_iterator(); ++it) {
    const std::string cmd = (*it)[3].str();
    CHECK_MESSAGE(cmd.find("--epochs") == std::string::npos, "the examples default to 5 epochs: " << cmd);
    CHECK((*it)[2].str() == "5");
    if (cmd.find("fashion_mnist_cnn") != std::string::npos) {
      cnn_command = cmd;
      cnn_figure = (*it)[1].str();
    }
    check_accuracy(work, (*it)[1].str(), cmd);
    ++claims;
  }
  CHECK(claims == 2);
  REQUIRE(!cnn_command.empty());
  // The CNN section: "SyncBatchNorm A test accuracy, per-worker BatchNorm B" (--no-sync-bn)
  const std::smatch both = the_match(text, R"(SyncBatchNorm (\d\.\d+) test accuracy, per-worker BatchNorm (\d\.\d+))");
  CHECK(both[1].str() == cnn_figure);  // the same run as the table's
  check_accuracy(work, both[2].str(), cnn_command + " --no-sync-bn");
}

TEST_CASE("the trainer's JSON summary in the README is what its command prints") {
  const std::string text = phalanx::test::readme();
  const std::smatch quoted = the_match(text, R"(`(\{"backend"[^`]*\})`)");
  const auto readme_summary = nlohmann::json::parse(quoted[1].str());
  // the first trainer command of "The trainer CLI", which the README says printed it
  const auto section = text.find("## The trainer CLI");
  REQUIRE(section != std::string::npos);
  std::string cmd;
  for (const auto& c : phalanx::test::sh_commands(text.substr(section)))
    if (c.find("phalanx-train") != std::string::npos) {
      cmd = c;
      break;
    }
  REQUIRE(!cmd.empty());
  CAPTURE(cmd);
  ReadmeScratch work("summary");
  REQUIRE(work.ok());
  const auto r = work.run(cmd);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // the last line rank 0 prints ("[0] {...}" under the launcher)
  const auto at = r.output.rfind("{\"");
  REQUIRE(at != std::string::npos);
  const auto printed = nlohmann::json::parse(r.output.substr(at, r.output.find('\n', at) - at));
  for (const auto& [key, value] : readme_summary.items()) {
    CAPTURE(key);
    REQUIRE(printed.contains(key));
    if (key == "seconds") continue;  // wall-clock time: only its presence is checked
    if (value.is_number_float())
      CHECK(std::fabs(value.get<double>() - printed[key].get<double>()) <= 1.5e-4);
    else
      CHECK(value == printed[key]);
  }
  // and nothing printed is missing from the quote
  for (const auto& [key, value] : printed.items()) CHECK_MESSAGE(readme_summary.contains(key), key);
}
