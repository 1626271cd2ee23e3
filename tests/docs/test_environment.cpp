// docs/environment.md against the source tree (the product: core, backends, parallel,
// samplers, data, optim, tools, include; comments ignored):
//   - every PHALANX_* variable the code reads is in the table, and every one in the table is
//     read. A read is the name as a whole string literal ("PHALANX_MMAP") that is the first
//     argument of a call (env::flag("PHALANX_MMAP", ...), simd_level("PHALANX_OPTIM_SIMD"))
//     or the value of a constant (kRdzvSecretEnv = "PHALANX_RDZV_SECRET"); setenv/unsetenv
//     and the launcher's env["PHALANX_..."] = ... set a variable, they do not read it;
//   - no getenv("PHALANX_...") outside core/src/env.cpp (the strict readers); getenv on a
//     name held in a variable only in the files below, which read launcher/system variables
//     (RANK, WORLD_SIZE, ...) through their own strict helpers.
#include <doctest/doctest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = PHALANX_SOURCE_DIR;

// getenv(name) with the name in a variable: launcher/system variables only.
const std::set<std::string> kIndirectGetenvAllowed = {"core/src/world.cpp", "core/src/timeline.cpp",
                                                      "parallel/rendezvous/src/launch_env.cpp"};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// The text with comments blanked out (string and character literals kept, newlines kept).
std::string without_comments(const std::string& s) {
  std::string out = s;
  enum { Code, Line, Block, Str, Chr } st = Code;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i], n = i + 1 < s.size() ? s[i + 1] : '\0';
    switch (st) {
      case Code:
        if (c == '/' && n == '/') st = Line, out[i] = ' ';
        else if (c == '/' && n == '*') st = Block, out[i] = out[i + 1] = ' ', ++i;
        else if (c == '"') st = Str;
        else if (c == '\'') st = Chr;
        break;
      case Line:
        if (c == '\n') st = Code;
        else out[i] = ' ';
        break;
      case Block:
        if (c == '*' && n == '/') st = Code, out[i] = out[i + 1] = ' ', ++i;
        else if (c != '\n') out[i] = ' ';
        break;
      case Str:
      case Chr:
        if (c == '\\') ++i;
        else if (c == (st == Str ? '"' : '\'')) st = Code;
        break;
    }
  }
  return out;
}

struct Source {
  std::string rel;   // path from the repository root
  std::string code;  // comments blanked out
};

std::vector<Source> product_sources() {
  std::vector<Source> out;
  for (const char* dir : {"core", "backends", "parallel", "samplers", "data", "optim", "tools", "include"}) {
    if (!fs::exists(kRoot / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      if (!e.is_regular_file()) continue;
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu" && ext != ".cuh" && ext != ".cc") continue;
      out.push_back({fs::relative(e.path(), kRoot).generic_string(), without_comments(slurp(e.path()))});
    }
  }
  REQUIRE(out.size() > 50);  // the tree was found
  return out;
}

/// The call (or "=") just before position `at` of `code`, over spaces: "env::flag(",
/// "simd_level(", "=", or "" when the literal is not a first argument nor a constant's value.
std::string context_before(const std::string& code, std::size_t at) {
  std::size_t i = at;
  while (i > 0 && std::isspace(static_cast<unsigned char>(code[i - 1]))) --i;
  if (i == 0) return "";
  if (code[i - 1] == '=') return i >= 2 && std::string("=!<>").find(code[i - 2]) != std::string::npos ? "" : "=";
  if (code[i - 1] != '(') return "";
  std::size_t j = i - 1;
  while (j > 0 && std::isspace(static_cast<unsigned char>(code[j - 1]))) --j;
  std::size_t k = j;
  while (k > 0 && (std::isalnum(static_cast<unsigned char>(code[k - 1])) || code[k - 1] == '_' || code[k - 1] == ':'))
    --k;
  return code.substr(k, j - k) + "(";
}

bool is_write(const std::string& call) {
  return call == "setenv(" || call == "::setenv(" || call == "unsetenv(" || call == "::unsetenv(" ||
         call == "putenv(" || call == "::putenv(";
}

/// Variable -> files that read it.
std::map<std::string, std::set<std::string>> reads(const std::vector<Source>& sources) {
  static const std::regex literal("\"(PHALANX_[A-Z0-9_]+)\"");
  std::map<std::string, std::set<std::string>> out;
  for (const auto& s : sources)
    for (auto it = std::sregex_iterator(s.code.begin(), s.code.end(), literal); it != std::sregex_iterator(); ++it) {
      const std::string call = context_before(s.code, static_cast<std::size_t>(it->position(0)));
      if (!call.empty() && !is_write(call)) out[(*it)[1]].insert(s.rel);
    }
  return out;
}

/// The PHALANX_* names in the first column of docs/environment.md's tables.
std::set<std::string> listed() {
  std::set<std::string> out;
  std::istringstream doc(slurp(kRoot / "docs/environment.md"));
  static const std::regex row(R"(^\|\s*`(PHALANX_[A-Z0-9_]+)`)");
  for (std::string line; std::getline(doc, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) out.insert(m[1]);
  }
  return out;
}

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

TEST_CASE("docs/environment.md lists every PHALANX_* variable the code reads, and no other") {
  const auto sources = product_sources();
  const auto read = reads(sources);
  const auto table = listed();
  REQUIRE(read.size() > 20);  // the scan found the reads
  std::set<std::string> unlisted, unread;
  std::string where;
  for (const auto& [name, files] : read)
    if (!table.count(name)) {
      unlisted.insert(name);
      where += "\n  " + name + " (read in " + *files.begin() + ")";
    }
  for (const auto& name : table)
    if (!read.count(name)) unread.insert(name);
  INFO("read by the code but not in docs/environment.md's table: " << join(unlisted) << where);
  CHECK(unlisted.empty());
  INFO("in docs/environment.md's table but read nowhere in the code: " << join(unread));
  CHECK(unread.empty());
}

TEST_CASE("only core/src/env.cpp calls getenv on a PHALANX_* variable") {
  static const std::regex bare(R"(getenv\s*\(\s*"(PHALANX_[A-Z0-9_]*))");
  static const std::regex indirect(R"(getenv\s*\(\s*([A-Za-z_][A-Za-z0-9_:]*)\s*\))");
  std::set<std::string> offenders;
  for (const auto& s : product_sources()) {
    if (s.rel == "core/src/env.cpp") continue;
    for (auto it = std::sregex_iterator(s.code.begin(), s.code.end(), bare); it != std::sregex_iterator(); ++it)
      offenders.insert(s.rel + ": getenv(\"" + std::string((*it)[1]) + "\")");
    for (auto it = std::sregex_iterator(s.code.begin(), s.code.end(), indirect); it != std::sregex_iterator(); ++it)
      if (!kIndirectGetenvAllowed.count(s.rel)) offenders.insert(s.rel + ": getenv(" + std::string((*it)[1]) + ")");
  }
  // The files allowed an indirect getenv read no PHALANX_* variable through it.
  static const std::regex literal("\"(PHALANX_[A-Z0-9_]+)\"");
  for (const auto& s : product_sources()) {
    if (!kIndirectGetenvAllowed.count(s.rel)) continue;
    for (auto it = std::sregex_iterator(s.code.begin(), s.code.end(), literal); it != std::sregex_iterator(); ++it) {
      const std::string call = context_before(s.code, static_cast<std::size_t>(it->position(0)));
      if (!call.empty() && call.rfind("env::", 0) != 0)
        offenders.insert(s.rel + ": " + call + "\"" + std::string((*it)[1]) + "\" (not through env::)");
    }
  }
  std::string list;
  for (const auto& o : offenders) list += "\n  " + o;
  INFO("read these through phalanx::env (core/env.hpp) instead:" << list);
  CHECK(offenders.empty());
}

TEST_CASE("README's documentation list links docs/environment.md") {
  CHECK(slurp(kRoot / "README.md").find("docs/environment.md") != std::string::npos);
}
