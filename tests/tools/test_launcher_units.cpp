// The launcher's pieces without processes: splitting output into lines and '\r' redraws,
// the rate-limited in-place relay of rank 0's progress bar, blame order, and the reports
// the launchers of a multi-node job exchange.
#include <doctest/doctest.h>

#include <poll.h>

#include <csignal>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "launcher/blame.hpp"
#include "launcher/failure_records.hpp"
#include "launcher/job_rounds.hpp"
#include "launcher/output_relay.hpp"
#include "phalanx/backends/tcp_store.hpp"

using namespace phalanx::launcher;
using namespace std::chrono_literals;

namespace {
std::vector<LineSplitter::Event> split(LineSplitter& s, const std::string& text) {
  std::vector<LineSplitter::Event> evs;
  s.feed(text.data(), text.size(), evs);
  return evs;
}
std::string show(const std::vector<LineSplitter::Event>& evs) {
  std::string out;
  for (const auto& e : evs) out += (e.progress ? "P:" : "L:") + e.text + "|";
  return out;
}
WorkerFailure exited(int rank, int code, int round) {
  WorkerFailure f;
  f.rank = rank;
  f.exit_code = code;
  f.reap_round = round;
  f.unix_ns = 1000 + rank;
  return f;
}
WorkerFailure killed(int rank, int sig, int round) {
  WorkerFailure f = exited(rank, 0, round);
  f.term_signal = sig;
  return f;
}
}  // namespace

TEST_CASE("lines, CRLF, redraws and unfinished text are split as a terminal would show them") {
  LineSplitter s;
  CHECK(show(split(s, "a\nb")) == "L:a|");
  CHECK(show(split(s, "c\r\n")) == "L:bc|");  // CRLF: one line, no '\r' in it
  CHECK(show(split(s, "\n")) == "L:|");       // an empty line stays a line
  // A bar that writes "\r<text>" and flushes: each flush is a redraw; '\n' ends it as a line.
  CHECK(show(split(s, "\rstep 1")) == "P:step 1|");
  CHECK(show(split(s, "\rstep 2")) == "P:step 2|");
  CHECK(show(split(s, "\rstep 3\n")) == "L:step 3|");
  // Redraws ended by '\r', and a redraw split across reads.
  CHECK(show(split(s, "x 1\rx 2\rx")) == "P:x 1|P:x 2|P:x|");
  CHECK(show(split(s, " 3")) == "P:x 3|");
  std::vector<LineSplitter::Event> end;
  s.finish(end);  // a worker that died mid-bar: its last redraw becomes its last line
  CHECK(show(end) == "L:x 3|");
  LineSplitter t;
  CHECK(show(split(t, "no newline")) == "");
  end.clear();
  t.finish(end);
  CHECK(show(end) == "L:no newline|");
}

TEST_CASE("the progress relay draws in place at most once per interval and never splits a line") {
  std::string screen;
  ProgressRelay relay([&](const std::string& s) { screen += s; }, 100ms);
  const auto t0 = ProgressRelay::Clock::time_point{} + 1h;
  relay.update("step 1", t0);
  CHECK(screen == "\r[0] step 1\033[K");
  for (int i = 2; i <= 50; ++i) relay.update("step " + std::to_string(i), t0 + std::chrono::milliseconds(i));
  CHECK(relay.draws() == 1);  // 49 updates within 50 ms: none drawn yet
  CHECK(relay.next_due() == t0 + 100ms);
  relay.flush(t0 + 60ms);
  CHECK(relay.draws() == 1);
  relay.flush(t0 + 100ms);
  CHECK(relay.draws() == 2);  // the newest text, once due
  CHECK(screen.substr(screen.size() - 14) == "[0] step 50\033[K");
  CHECK(relay.next_due() == ProgressRelay::Clock::time_point::max());
  // Another worker's line: the bar is taken off the line first, then drawn again after it.
  screen.clear();
  relay.before_line();
  screen += "[1] hello\n";
  relay.flush(t0 + 110ms);
  CHECK(screen == "\r\033[K[1] hello\n\r[0] step 50\033[K");
  // Over a simulated second of redraws every millisecond: at most 10 (+1 for the first).
  ProgressRelay fast([](const std::string&) {}, 100ms);
  for (int ms = 0; ms < 1000; ++ms) {
    fast.update("s" + std::to_string(ms), t0 + std::chrono::milliseconds(ms));
    fast.flush(t0 + std::chrono::milliseconds(ms));
  }
  CHECK(fast.draws() <= 11);
  CHECK(fast.draws() >= 9);
  // The bar's own line ends it: nothing is drawn again after that line.
  screen.clear();
  relay.before_line();
  relay.end_bar();
  relay.flush(t0 + 1s);
  CHECK(screen == "\r\033[K");
}

TEST_CASE("blame: the first failure, not the lowest rank") {
  // A paused launcher reaps a survivor (exit 1) and the SIGKILLed rank in the same round.
  std::vector<WorkerFailure> same_round = {exited(0, 1, 3), exited(1, 1, 3), killed(2, SIGKILL, 3)};
  CHECK(pick_blamed(same_round) == 2);
  // A survivor that aborted on its way out ranks after the rank killed from outside.
  same_round = {killed(0, SIGABRT, 3), killed(3, SIGKILL, 3)};
  CHECK(pick_blamed(same_round) == 1);
  // An earlier poll round wins over a signal seen later.
  std::vector<WorkerFailure> rounds = {killed(0, SIGKILL, 5), exited(3, 2, 4)};
  CHECK(pick_blamed(rounds) == 1);
  // A rank whose record says it failed because of another ranks last, whatever its round.
  std::vector<WorkerFailure> recorded = {exited(0, 1, 1), exited(2, 3, 2)};
  recorded[0].has_record = recorded[0].secondary = true;
  CHECK(pick_blamed(recorded) == 1);
  // Records break ties among exit codes: failure/first, then the record's time.
  std::vector<WorkerFailure> ties = {exited(0, 1, 1), exited(1, 1, 1), exited(2, 1, 1)};
  for (auto& f : ties) f.has_record = true;
  ties[0].unix_ns = 30, ties[1].unix_ns = 10, ties[2].unix_ns = 20;
  CHECK(pick_blamed(ties) == 1);
  ties[2].is_first = true;
  CHECK(pick_blamed(ties) == 2);
  // The launcher's own SIGTERM (or an exit after it stopped the group) is never the cause.
  std::vector<WorkerFailure> stopped = {killed(0, SIGTERM, 2), exited(1, 143, 2), exited(2, 4, 1)};
  stopped[0].signal_from_launcher = true;
  stopped[1].after_stop = true;
  CHECK(pick_blamed(stopped) == 2);
  CHECK(blame_tier(stopped[0]) == 2);
  CHECK(blame_tier(stopped[1]) == 2);
  CHECK(pick_blamed({}) == -1);
  CHECK(exit_code_for(killed(0, SIGKILL, 0)) == 137);
  CHECK(exit_code_for(exited(0, 3, 0)) == 3);
  CHECK(describe_exit(killed(0, SIGKILL, 0)).find("killed by signal 9") != std::string::npos);
}

TEST_CASE("the launchers' reports survive JSON and the job blames across nodes") {
  NodeReport a, b;
  a.node = 0;
  a.failure = exited(1, 1, 7);  // node 0: a survivor exited 1 first (its own poll round is earlier)
  a.failure->node = 0;
  a.tail = {"lost a peer"};
  b.node = 1;
  b.failure = killed(2, SIGKILL, 9);
  b.failure->node = 1;
  b.failure->is_first = true;
  b.tail = {"line \"quoted\"", "x"};
  b.max_restarts = 3;
  NodeReport a2, b2;
  REQUIRE(from_json(to_json(a), a2));
  REQUIRE(from_json(to_json(b), b2));
  CHECK(b2.tail == b.tail);
  CHECK(b2.max_restarts == 3);
  REQUIRE(b2.failure);
  CHECK(b2.failure->term_signal == SIGKILL);
  CHECK(b2.failure->is_first);
  const auto verdict = job_blame({a2, b2});
  REQUIRE(verdict);
  CHECK(verdict->node == 1);
  CHECK(verdict->failure->rank == 2);
  NodeReport ok;
  ok.ok = true;
  CHECK_FALSE(job_blame({ok, ok}));
  NodeReport bad;
  CHECK_FALSE(from_json("{\"node\": 1}", bad));
  CHECK_FALSE(from_json("not json", bad));
}

TEST_CASE("failure records: the launcher reads the ranks' and posts failure/first for a signal") {
  phalanx::TcpStoreServer server(phalanx::TcpStoreOptions{});
  phalanx::TcpStoreOptions co;
  co.port = server.port();
  phalanx::TcpStore store(co);
  store.set("phalanx/r2/failure/1",
            std::string(R"({"rank":1,"message":"peer 3 closed its connection","secondary":true,"unix_ns":77})"));
  WorkerFailure survivor = exited(1, 1, 0);
  read_failure_record(store, 2, survivor);
  CHECK(survivor.has_record);
  CHECK(survivor.secondary);
  CHECK(survivor.unix_ns == 77);
  CHECK(survivor.message == "peer 3 closed its connection");
  WorkerFailure victim = killed(3, SIGKILL, 0);
  CHECK(post_first_failure(store, 2, victim));
  CHECK_FALSE(post_first_failure(store, 2, killed(0, SIGKILL, 0)));  // set once
  CHECK(store.get_string("phalanx/r2/failure/first").find("killed by signal 9 (SIGKILL)") != std::string::npos);
  read_failure_record(store, 2, victim);
  CHECK(victim.is_first);
  CHECK_FALSE(victim.has_record);
  WorkerFailure other = exited(2, 1, 0);
  read_failure_record(store, 1, other);  // another attempt's keys: nothing
  CHECK_FALSE(other.has_record);
  CHECK_FALSE(other.is_first);
}

TEST_CASE("two launchers' rounds: a close wakes the other, reports are exchanged, a silent peer is reported") {
  phalanx::TcpStoreServer server(phalanx::TcpStoreOptions{});
  phalanx::TcpStoreOptions co;
  co.port = server.port();
  auto s0 = std::make_shared<phalanx::TcpStore>(co);
  auto s1 = std::make_shared<phalanx::TcpStore>(co);
  auto r0 = std::make_unique<JobRounds>(s0, 2, 0, 20ms, 1500ms);
  JobRounds r1(s1, 2, 1, 20ms, 1500ms);
  r0->begin(0);
  r1.begin(0);
  r1.close(0, "rank 2 was killed by signal 9");
  pollfd p{r0->wake_fd(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  CHECK(r0->why() == "node 1: rank 2 was killed by signal 9");
  pollfd own{r1.wake_fd(), POLLIN, 0};
  CHECK(::poll(&own, 1, 100) == 0);  // its own close does not wake the closer
  NodeReport m0, m1;
  m0.node = 0;
  m0.max_restarts = 2;
  m1.node = 1;
  m1.failure = killed(2, SIGKILL, 1);
  m1.failure->node = 1;
  std::vector<NodeReport> seen1;
  std::thread t([&] { seen1 = r1.exchange(0, m1); });
  const auto seen0 = r0->exchange(0, m0);
  t.join();
  REQUIRE(seen0.size() == 2);
  REQUIRE(seen1.size() == 2);
  CHECK(seen1[0].max_restarts == 2);
  CHECK(job_blame(seen0)->failure->rank == 2);
  CHECK(job_blame(seen1)->failure->rank == 2);
  // Round 1: node 0's launcher goes silent (its heartbeat stops); node 1 gives up in time.
  r1.begin(1);
  r0.reset();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r1.exchange(1, m1);
    FAIL("exchange returned without node 0's report");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("node 0's launcher stopped answering") != std::string::npos);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs >= 1.4);
  CHECK(secs < 10);
}

TEST_CASE("a line without end is cut at kMaxLine, also after a '\\r' (memory and copying stay bounded)") {
  LineSplitter s;
  const std::string chunk(65536, 'x');
  std::vector<LineSplitter::Event> evs;
  s.feed("\r", 1, evs);
  std::size_t events = 0, longest = 0;
  for (int i = 0; i < 64; ++i) {  // 4 MiB in reads of 64 KiB, no newline
    evs.clear();
    s.feed(chunk.data(), chunk.size(), evs);
    for (const auto& e : evs) longest = std::max(longest, e.text.size()), events += e.progress ? 0 : 1;
  }
  CHECK(longest <= LineSplitter::kMaxLine);
  CHECK(events == 4 * 1024 * 1024 / LineSplitter::kMaxLine);  // each piece a line of its own
  evs.clear();
  s.feed("end\n", 4, evs);
  REQUIRE(!evs.empty());
  CHECK(evs.back().text == "end");
}

TEST_CASE("a report with output that is not UTF-8, or huge, is still a report (cut, replaced)") {
  NodeReport r;
  r.node = 1;
  r.failure = exited(3, 2, 1);
  r.failure->message = "bad \xff\xfe message";
  r.tail = {"ok line", "bad \xc3\x28 bytes", std::string(10 * 1024 * 1024, 'y')};
  std::string text;
  REQUIRE_NOTHROW(text = to_json(r));
  CHECK(text.size() < 3 * kReportLineBytes + 1024);
  NodeReport back;
  REQUIRE(from_json(text, back));
  REQUIRE(back.tail.size() == 3);
  CHECK(back.tail[0] == "ok line");
  CHECK(back.tail[1] == "bad \xef\xbf\xbd( bytes");  // U+FFFD for the invalid byte
  CHECK(back.tail[2].size() <= kReportLineBytes + 8);
  REQUIRE(back.failure);
  CHECK(back.failure->rank == 3);
  CHECK(back.failure->exit_code == 2);
}
