// Fuzzes the TCP store's request engine (backends/src/tcp_store_engine.hpp) as the server
// drives it, with up to four connections. The input is a list of records
//   [u8 op][u16 length, little-endian][length bytes]
// op & 3 picks the connection; (op >> 2) & 3 the action: 0 feed the bytes (at most what
// room() allows, as the server reads), 1 read every queued reply (piece by piece), 2 read
// `length` bytes of replies (in gathering writes of up to 5 pieces), 3 close the connection and open a new one (as after the engine drops one). Small limits make every cap reachable;
// an input of odd length also holds back a connection whose replies pass 2 KiB (else the
// output cap is what stops it).
// Properties: buffers never pass their caps, a held-back connection's queue stays within
// the bound plus one reply, and when every connection is closed the engine's buffer
// accounting is back to zero.
#include <algorithm>
#include <cstring>

#include "fuzz_support.hpp"
#include "tcp_store_engine.hpp"

using phalanx::tcpstore::Engine;
using phalanx::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return phalanx::fuzz::guarded([&] {
    phalanx::TcpStoreLimits lim;
    lim.max_frame_before_hello = 256;
    lim.max_frame = 16u << 10;
    lim.max_output_per_connection = 24u << 10;
    lim.max_buffered_total = 40u << 10;
    const bool holds_back = size % 2 == 1;
    lim.pause_reading_above = holds_back ? 2048 : SIZE_MAX;
    Engine e("tok", lim);
    Engine::Id conns[4];
    for (auto& c : conns) c = e.open();
    std::size_t pos = 0;
    while (size - pos >= 3) {
      const std::uint8_t op = data[pos];
      std::size_t len = data[pos + 1] | (std::size_t{data[pos + 2]} << 8);
      pos += 3;
      len = std::min(len, size - pos);
      Engine::Id& id = conns[op & 3];
      switch ((op >> 2) & 3) {
        case 0: {
          const std::size_t n = std::min(len, e.room(id));
          require(e.room(id) <= 4 + lim.max_frame, "room() stays within one frame");
          if (n > 0) e.feed(id, data + pos, n);
          break;
        }
        case 1: {  // piece by piece
          for (;;) {
            const auto [p, n] = e.output(id);
            if (n == 0) break;
            require(p != nullptr, "output() gives bytes it says it has");
            e.wrote(id, n);
          }
          break;
        }
        case 2: {  // `len` bytes, as one gathering write of up to 5 pieces takes them
          Engine::Piece pieces[5];
          std::size_t want = len;
          while (want > 0) {
            const std::size_t k = e.output(id, pieces, 5);
            if (k == 0) break;
            std::size_t n = 0;
            for (std::size_t i = 0; i < k; ++i) {
              require(pieces[i].first != nullptr && pieces[i].second > 0, "output() gives bytes it says it has");
              n += pieces[i].second;
            }
            require(n <= e.queued(id), "output() gives no more than is queued");
            n = std::min(n, want);
            e.wrote(id, n);
            want -= n;
          }
          break;
        }
        default:
          e.close(id);
          id = e.open();
      }
      pos += len;
      require(e.buffered_total() <= lim.max_buffered_total, "the total buffer cap holds");
      for (auto c : conns) {
        require(e.queued(c) <= lim.max_output_per_connection, "the output cap holds");
        if (holds_back)
          require(e.queued(c) <= lim.pause_reading_above + 9 + lim.max_frame,
                  "a held-back connection queues at most one reply past the bound");
      }
      for (auto& c : conns)
        if (e.closing(c)) {  // the server closes it (logging the reason); the client reconnects
          require(!e.reason(c).empty(), "a connection the engine drops has a reason to log");
          e.close(c);
          c = e.open();
        }
    }
    for (auto c : conns) e.close(c);
    require(e.buffered_total() == 0, "buffer accounting returns to zero");
    require(e.connections() == 0, "every connection is forgotten");
  });
}
