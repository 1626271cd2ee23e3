// Live output under a launcher: when PHALANX_LINE_BUFFERED=1 (phalanx-run sets it for its
// workers), stdout is made line-buffered as the library loads, before main() writes
// anything. Workers write to a pipe, where stdio would otherwise buffer whole blocks:
// lines would arrive at exit, and a crashing worker's last lines would be lost.
// std::cout goes through stdio (sync_with_stdio is on by default), so it follows.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "phalanx/core/env.hpp"

namespace phalanx {
namespace {

struct LineBufferedStdout {
  LineBufferedStdout() {
    try {  // at load time: a bad value cannot be thrown to anyone
      if (env::flag("PHALANX_LINE_BUFFERED", false)) std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phalanx: %s; stdout keeps its buffering\n", e.what());
    }
  }
};

const LineBufferedStdout g_line_buffered_stdout;

}  // namespace
}  // namespace phalanx
