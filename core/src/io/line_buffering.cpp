// Live output under a launcher: when PHALANX_LINE_BUFFERED=1 (phalanx-run sets it for its
// workers), stdout is made line-buffered as the library loads, before main() writes
// anything. Workers write to a pipe, where stdio would otherwise buffer whole blocks:
// lines would arrive at exit, and a crashing worker's last lines would be lost.
// std::cout goes through stdio (sync_with_stdio is on by default), so it follows.
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace phalanx {
namespace {

struct LineBufferedStdout {
  LineBufferedStdout() {
    const char* v = std::getenv("PHALANX_LINE_BUFFERED");
    if (v && std::strcmp(v, "1") == 0) std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  }
};

const LineBufferedStdout g_line_buffered_stdout;

}  // namespace
}  // namespace phalanx
