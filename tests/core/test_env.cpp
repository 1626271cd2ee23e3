// The strict environment readers (core/env.hpp): every kind gives its default when the
// variable is unset or empty, reads what it documents, and refuses anything else with one
// ConfigError line naming the variable, the value and what it accepts. Then three real
// variables that the ad-hoc parsers before them misread: PHALANX_GLOO_SYNC_CHUNK_BYTES=1M
// (was 1 byte), PHALANX_CPU_CACHE_MB=1g (was 1 MiB; now refused: the variable counts MiB)
// and PHALANX_MMAP=false (was "on").
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include <phalanx/core/env.hpp>
#include <phalanx/phalanx.hpp>

#include "gloo_options.hpp"  // backends/gloo, compiled into this test (tests/CMakeLists.txt)

using namespace phalanx;

namespace {

constexpr const char* kVar = "PHALANX_TEST_ENV_VALUE";  // test-only: not a product variable

/// Sets kVar for one scope, unsets it after.
struct Set {
  explicit Set(const char* value, const char* name = kVar) : name_(name) { ::setenv(name, value, 1); }
  ~Set() { ::unsetenv(name_); }
  const char* name_;
};

/// `read()` throws a ConfigError of one line that names the variable and the value, and says
/// `accepts`.
template <typename F>
void refused(const char* value, F read, const std::string& accepts, const char* name = kVar) {
  CAPTURE(value);
  Set s(value, name);
  try {
    read();
    FAIL("accepted");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    CAPTURE(m);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.rfind(std::string(name) + "='" + value + "' is not ", 0) == 0);
    CHECK(m.find(accepts) != std::string::npos);
  }
}

/// This binary again, on the child case, with `env` (NAME=value ...) set; what it printed.
std::string child_output(const std::string& env) {
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(len > 0);
  exe[len] = '\0';
  const std::string cmd = env + " PHALANX_TEST_ENV_CHILD=1 '" + std::string(exe) +
                          "' --source-file='*test_env.cpp' --test-case='*child*' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  return out;
}

std::string tmp_path(const std::string& name) { return "/tmp/phalanx_test_env_" + std::to_string(::getpid()) + name; }

}  // namespace

TEST_CASE("env readers: unset or empty gives the default") {
  ::unsetenv(kVar);
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    if (value) ::setenv(kVar, value, 1);
    CHECK_FALSE(env::text(kVar));
    CHECK_FALSE(env::path(kVar));
    CHECK(env::integer(kVar, 7, 0, 10) == 7);
    CHECK(env::real(kVar, 2.5, 0, 10) == 2.5);
    CHECK(env::bytes(kVar, 4096, 0, 1 << 20) == 4096);
    CHECK(env::choice(kVar, "b", {"a", "b"}) == "b");
    CHECK(env::flag(kVar, true));
    CHECK_FALSE(env::flag(kVar, false));
    ::unsetenv(kVar);
  }
}

TEST_CASE("env::integer: decimal digits in range; anything else is one line naming it") {
  {
    Set s("-3");
    CHECK(env::integer(kVar, 0, -5, 5) == -3);
  }
  {
    Set s("42");
    CHECK(env::integer(kVar, 0, 0, 100) == 42);
  }
  const auto read = [] { return env::integer(kVar, 0, 0, 100, "a number of widgets"); };
  for (const char* bad : {"12x", " 7", "7 ", "+7", "abc", "1e3", "0x10", "1.0", "-", "101", "-1",
                          "99999999999999999999"})
    refused(bad, read, "a number of widgets in [0, 100]");
}

TEST_CASE("env::real: a finite decimal in range; anything else is one line naming it") {
  {
    Set s("0.25");
    CHECK(env::real(kVar, 0, 0, 1) == 0.25);
  }
  {
    Set s("1e3");
    CHECK(env::real(kVar, 0, 0, 1e6) == 1000);
  }
  const auto read = [] { return env::real(kVar, 0, 0.001, 1e6, "seconds"); };
  for (const char* bad : {"20s", " 1", "+1", "0x10", "nan", "inf", "-inf", "0", "1e7", "1e400", "soon"})
    refused(bad, read, "a number of seconds in [0.001, 1e+06]");
}

TEST_CASE("env::bytes: a byte count or K/M/G/T (binary, any case); anything else is one line naming it") {
  const auto read = [] { return env::bytes(kVar, 0, 0, std::numeric_limits<std::uint64_t>::max()); };
  const std::pair<const char*, std::uint64_t> good[] = {
      {"0", 0},           {"4096", 4096},        {"64K", 64 << 10},     {"64k", 64 << 10},
      {"64M", 64 << 20},  {"1g", 1ull << 30},    {"1G", 1ull << 30},    {"2T", 2ull << 40},
      {"1.5M", 3 << 19},  {"1.5MiB", 3 << 19},   {"16KB", 16 << 10},    {"512b", 512},
      {".5K", 512},       {"18446744073709551615", std::numeric_limits<std::uint64_t>::max()}};
  for (const auto& [text, want] : good) {
    CAPTURE(text);
    Set s(text);
    CHECK(read() == want);
  }
  for (const char* bad : {"12x", "1M5", "-1", "1.5", "0.3K", "1KK", "K", "1 M", " 1M", "1P", "1iB", ".", "1.K.",
                          "18446744073709551616", "16777216T"})
    refused(bad, read, "a size (a byte count, or with a binary K, M, G or T suffix");
  const auto ranged = [] { return env::bytes(kVar, 0, 64 << 10, 1ull << 34, "a staging size"); };
  {
    Set s("1M");
    CHECK(ranged() == 1 << 20);
  }
  for (const char* bad : {"12", "63K", "17G", "16.5G"}) refused(bad, ranged, "a staging size in [64K, 16G]");
  CHECK(env::bytes_text(0) == "0");
  CHECK(env::bytes_text(1536) == "1536");
  CHECK(env::bytes_text(3 << 19) == "1536K");
  CHECK(env::bytes_text(1ull << 34) == "16G");
}

TEST_CASE("env::choice, env::flag, env::path: one of their values; anything else is one line naming it") {
  {
    Set s("ring");
    CHECK(env::choice(kVar, "auto", {"auto", "ring"}) == "ring");
  }
  refused("Ring", [] { return env::choice(kVar, "auto", {"auto", "ring"}); }, "one of auto, ring");
  for (const char* yes : {"1", "true", "on", "yes"}) {
    Set s(yes);
    CHECK(env::flag(kVar, false));
  }
  for (const char* no : {"0", "false", "off", "no"}) {
    Set s(no);
    CHECK_FALSE(env::flag(kVar, true));
  }
  for (const char* bad : {"2", "True", "y", " 1"}) refused(bad, [] { return env::flag(kVar, false); }, "0 or 1");
  {
    Set s("/tmp/a b:c");
    CHECK(*env::path(kVar) == "/tmp/a b:c");
  }
  {  // the message shows the control character escaped: still one line
    Set s("/tmp/a\nb");
    const std::string want = std::string(kVar) + "='/tmp/a\\nb' is not a path (it has a control character: a "
                                                 "newline or a tab); set it to such a value or unset it";
    CHECK_THROWS_WITH_AS(env::path(kVar), want.c_str(), ConfigError);
  }
}

TEST_CASE("PHALANX_GLOO_SYNC_CHUNK_BYTES=1M is 1 MiB (it was 1 byte); garbage is refused") {
  ::unsetenv("PHALANX_GLOO_SYNC_CHUNK_BYTES");
  CHECK(gloo_backend::GlooOptions::from_env(1).sync_chunk_bytes == std::size_t(1) << 20);
  {
    Set s("1M", "PHALANX_GLOO_SYNC_CHUNK_BYTES");
    CHECK(gloo_backend::GlooOptions::from_env(1).sync_chunk_bytes == std::size_t(1) << 20);
  }
  {
    Set s("4096", "PHALANX_GLOO_SYNC_CHUNK_BYTES");
    CHECK(gloo_backend::GlooOptions::from_env(1).sync_chunk_bytes == 4096);
  }
  refused("1Mb5", [] { return gloo_backend::GlooOptions::from_env(1); }, "a size", "PHALANX_GLOO_SYNC_CHUNK_BYTES");
  {
    Set s("64K", "PHALANX_GLOO_SYNC_MAX_BYTES");
    CHECK(gloo_backend::GlooOptions::from_env(1).sync_max_bytes == 64 << 10);
  }
}

TEST_CASE("PHALANX_MMAP=false reads a .npy into private memory (it used to mean on)") {
  save_npy(tmp_path("m.npy"), ones({600, 512}));
  const auto mapped_with = [](const char* value) {
    Set s(value, "PHALANX_MMAP");
    NpyLoadInfo info;
    (void)load_npy(tmp_path("m.npy"), &info);
    return info.mapped;
  };
  ::unsetenv("PHALANX_MMAP");
  NpyLoadInfo info;
  (void)load_npy(tmp_path("m.npy"), &info);
  CHECK(info.mapped);  // the default: mapped (so that the cases below can fail)
  CHECK(mapped_with("1"));
  CHECK(mapped_with("true"));
  CHECK_FALSE(mapped_with("false"));
  CHECK_FALSE(mapped_with("off"));
  CHECK_FALSE(mapped_with("0"));
  refused("nope", [] { return load_npy(tmp_path("m.npy")); }, "0 or 1", "PHALANX_MMAP");
  std::remove(tmp_path("m.npy").c_str());
}

TEST_CASE("env child: reports whether a CPU tensor can be made") {
  if (!std::getenv("PHALANX_TEST_ENV_CHILD")) return;  // only in the process the parent starts
  try {
    const Tensor t = ones({1024, 1024});  // 4 MiB: through the block cache
    std::printf("TENSOR|%g|\n", static_cast<double>(sum(t).item()));
  } catch (const ConfigError& e) {
    std::printf("TENSOR_ERROR|%s|\n", e.what());
  }
}

TEST_CASE("PHALANX_CPU_CACHE_MB counts MiB: 1g is refused (it was read as 1), 64 works") {
  // The cache is made once per process: each value in a fresh one.
  const std::string bad = child_output("PHALANX_CPU_CACHE_MB=1g");
  CAPTURE(bad);
  CHECK(bad.find("TENSOR_ERROR|PHALANX_CPU_CACHE_MB='1g' is not a whole number of MiB in [0, 16777216]; ") !=
        std::string::npos);
  const std::string good = child_output("PHALANX_CPU_CACHE_MB=64");
  CAPTURE(good);
  CHECK(good.find("TENSOR|1.04858e+06|") != std::string::npos);
}
