// PHALANX_GEMM (core/src/cpu/small_gemm.cpp): auto, blas or own; anything else is a one-line
// ConfigError naming the variable, the value and the accepted values. The choice is made once
// per process, so each value is tried in a fresh process: this binary run again on the child
// case below, with the variable set.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

namespace {

/// Runs the child case in a new process of this binary under PHALANX_GEMM=`value`; returns
/// what it printed.
std::string child_output(const std::string& value) {
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(len > 0);
  exe[len] = '\0';
  const std::string cmd = "PHALANX_GEMM='" + value + "' PHALANX_TEST_GEMM_CHILD=1 '" + std::string(exe) +
                          "' --source-file='*test_gemm_env.cpp' --test-case='*child*' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  return out;
}

}  // namespace

TEST_CASE("gemm env child: reports what blas_info() and a large matmul say") {
  if (!std::getenv("PHALANX_TEST_GEMM_CHILD")) return;  // only in the process the parent starts
  try {
    std::printf("INFO|%s|\n", blas_info().c_str());
  } catch (const ConfigError& e) {
    std::printf("INFO_ERROR|%s|\n", e.what());
  }
  set_num_threads(1);
  try {  // above the tiny-product size: the policy decides
    Tensor c = matmul(ones({128, 128}), ones({128, 128}));
    std::printf("MATMUL|%g|\n", static_cast<double>(c.data<float>()[0]));
  } catch (const ConfigError& e) {
    std::printf("MATMUL_ERROR|%s|\n", e.what());
  }
}

TEST_CASE("PHALANX_GEMM: an unknown value is a one-line ConfigError naming it; the known ones work") {
  const std::string want = "PHALANX_GEMM='bogus' is not one of auto, blas, own; set it to such a value or unset it";
  const std::string bad = child_output("bogus");
  INFO(bad);
  CHECK(bad.find("INFO_ERROR|" + want + "|\n") != std::string::npos);
  CHECK(bad.find("MATMUL_ERROR|" + want + "|\n") != std::string::npos);

  for (const std::string v : {"own", "blas"}) {
    const std::string out = child_output(v);
    INFO(out);
    CHECK(out.find("(PHALANX_GEMM=" + v + ")|") != std::string::npos);
    CHECK(out.find("MATMUL|128|") != std::string::npos);
  }
  for (const std::string v : {"auto", ""}) {  // the default, also when set empty
    const std::string out = child_output(v);
    INFO(out);
    CHECK(out.find("INFO|") != std::string::npos);
    CHECK(out.find("PHALANX_GEMM=") == std::string::npos);
    CHECK(out.find("MATMUL|128|") != std::string::npos);
  }
}
