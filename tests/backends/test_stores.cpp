// Every store implementation through one contract test; the TCP server against bad clients.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "support/multirank.hpp"

using namespace phalanx;
using namespace std::chrono_literals;

namespace {
Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }

void store_contract(Store& s) {
  s.set("a", b("1"));
  CHECK(s.get("a") == b("1"));
  CHECK(s.add("counter", 5) == 5);
  CHECK(s.add("counter", -2) == 3);
  CHECK(s.get_string("counter") == "3");
  CHECK(s.compare_set("cas", {}, b("x")) == b("x"));       // absent + empty expected -> set
  CHECK(s.compare_set("cas", b("y"), b("z")) == b("x"));   // mismatch -> unchanged
  CHECK(s.compare_set("cas", b("x"), b("z")) == b("z"));
  CHECK(s.check({"a", "cas"}));
  CHECK_FALSE(s.check({"a", "nope"}));
  const std::int64_t n = s.num_keys();
  CHECK(n >= 3);
  CHECK(s.delete_key("a"));
  CHECK_FALSE(s.delete_key("a"));
  CHECK(s.num_keys() == n - 1);
  // a waiter is woken by a later set
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    s.set("late", b("v"));
  });
  s.wait({"late"}, 5s);
  setter.join();
  CHECK(s.get_string("late") == "v");
  // a wait that times out names the missing key
  CHECK_THROWS_WITH_AS(s.wait({"late", "never"}, 200ms), doctest::Contains("never"), TimeoutError);
  s.set("text", b("abc"));
  CHECK_THROWS_AS(s.add("text", 1), ValueError);
  // a large value
  Bytes big(3 << 20, 7);
  s.set("big", big);
  CHECK(s.get("big") == big);
}
}  // namespace

TEST_CASE("MemoryStore") {
  MemoryStore s;
  store_contract(s);
}

TEST_CASE("FileStore, also across processes") {
  const std::string path = "/tmp/phalanx_filestore_" + std::to_string(::getpid());
  std::remove(path.c_str());
  {
    FileStore s(path, 5s);
    store_contract(s);
  }
  std::remove(path.c_str());
  const auto results = test::run_processes(4, [&](int rank) {
    FileStore s(path, 10s);
    for (int i = 0; i < 25; ++i) s.add("sum", rank + 1);
    s.set("done/" + std::to_string(rank), std::string("1"));
    s.wait({"done/0", "done/1", "done/2", "done/3"}, 10s);
    return s.get_string("sum") == std::to_string(25 * 10) ? 0 : 3;
  });
  for (auto& r : results) CHECK(r.exit_code == 0);
  std::remove(path.c_str());
  CHECK_THROWS_AS(FileStore("/nonexistent_dir/x"), ConfigError);
}

TEST_CASE("FileStore never writes through a planted symbolic link; its file is 0600") {
  const std::string path = "/tmp/phalanx_filestore_link_" + std::to_string(::getpid()), victim = path + ".victim";
  std::remove(path.c_str());
  { std::FILE* f = std::fopen(victim.c_str(), "w"); std::fputs("precious", f); std::fclose(f); }
  REQUIRE(::symlink(victim.c_str(), path.c_str()) == 0);
  CHECK_THROWS_WITH_AS(FileStore(path, 1s), doctest::Contains((path + ": is a symbolic link").c_str()), ConfigError);
  char buf[16] = {0};
  std::FILE* f = std::fopen(victim.c_str(), "r");
  REQUIRE(f != nullptr);
  CHECK(std::fread(buf, 1, sizeof buf - 1, f) == 8);
  std::fclose(f);
  CHECK(std::string(buf) == "precious");
  std::remove(path.c_str());
  const mode_t old = ::umask(022);
  {
    FileStore s(path, 1s);
    s.set("k", std::string("v"));
  }
  ::umask(old);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  std::remove(path.c_str());
  std::remove(victim.c_str());
}

TEST_CASE("PrefixStore namespaces keys") {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore a("a", inner), c("c", inner);
  a.set("k", b("1"));
  c.set("k", b("2"));
  CHECK(a.get_string("k") == "1");
  CHECK(c.get_string("k") == "2");
  CHECK(inner->get_string("a/k") == "1");
  store_contract(a);
}

TEST_CASE("TcpStore against its server") {
  TcpStoreServer server(TcpStoreOptions{});
  TcpStoreOptions o;
  o.port = server.port();
  o.timeout = 5s;
  TcpStore s(o);
  store_contract(s);
  // two clients see each other's keys
  TcpStore t(o);
  t.set("shared", b("yes"));
  CHECK(s.get_string("shared") == "yes");
}

TEST_CASE("TCP store: values up to the 64 MiB frame limit; a larger one is a clear error") {
  TcpStoreServer server(TcpStoreOptions{});
  TcpStoreOptions o;
  o.port = server.port();
  o.timeout = 20s;
  TcpStore s(o);
  Bytes big((64u << 20) - 64, 0);
  for (std::size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<std::uint8_t>(i >> 12);
  s.set("big", big);
  CHECK(s.get("big") == big);
  CHECK(s.compare_set("big", big, b("small")) == b("small"));
  big.resize(64u << 20);
  CHECK_THROWS_WITH_AS(s.set("huge", big), doctest::Contains("over the store's limit"), ValueError);
  CHECK(s.get_string("big") == "small");  // the connection is still good
}

TEST_CASE("TCP store: a wrong token is refused (and logged); the right one is served") {
  TcpStoreOptions so;
  so.token = "job-123";
  TcpStoreServer server(so);
  TcpStoreOptions o;
  o.port = server.port();
  o.timeout = 2s;
  o.token = "job-999";
  CHECK_THROWS_WITH_AS(TcpStore{o}, doctest::Contains("refused this worker's job token"), ConfigError);
  CHECK(server.rejected_connections() == 1);
  o.token = "job-123";
  TcpStore ok(o);
  ok.set("k", b("v"));
  CHECK(ok.get_string("k") == "v");
}

TEST_CASE("TCP store: a port in use is a clear error") {
  TcpStoreServer first(TcpStoreOptions{});
  TcpStoreOptions o;
  o.port = first.port();
  CHECK_THROWS_WITH_AS(TcpStoreServer{o}, doctest::Contains("already in use"), ConfigError);
}

TEST_CASE("TCP store: no server within the timeout is a TimeoutError naming host:port") {
  int port;
  { TcpStoreServer probe(TcpStoreOptions{}); port = probe.port(); }
  TcpStoreOptions o;
  o.port = port;
  o.timeout = 300ms;
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_WITH_AS(TcpStore{o}, doctest::Contains(endpoint.c_str()), TimeoutError);
}

TEST_CASE("TCP store: garbage, oversized and truncated frames do not take the server down") {
  TcpStoreServer server(TcpStoreOptions{});
  auto raw = [&](const std::string& bytes, bool half_close) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(server.port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) {
    }
    if (half_close) ::shutdown(fd, SHUT_WR);
    std::this_thread::sleep_for(20ms);
    ::close(fd);
  };
  raw("GET / HTTP/1.1\r\nHost: x\r\n\r\n", true);                   // not our protocol
  raw(std::string("\xff\xff\xff\x7f", 4) + "xx", true);            // absurd length
  raw(std::string("\x10\x00\x00\x00\x01\x05", 6), true);           // truncated HELLO
  raw(std::string("\x05\x00\x00\x00\x09\x00\x00\x00\x00", 9), true);  // skips the handshake
  raw(std::string("\x09\x00\x00\x00\x01\xff\xff\xff\x00\x00\x00\x00\x00", 13), true);  // bad string length
  Generator g(1);
  std::string noise(4096, '\0');
  for (auto& ch : noise) ch = static_cast<char>(g.next_u32());
  raw(noise, false);
  TcpStoreOptions o;
  o.port = server.port();
  o.timeout = 2s;
  TcpStore s(o);
  s.set("still", b("serving"));
  CHECK(s.get_string("still") == "serving");
}
