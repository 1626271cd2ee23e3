// TensorBoardWriter (parallel/tensorboard_writer.hpp): the event files are read back here by
// a reader written independently of the writer (bitwise CRC-32C, a protobuf field walker),
// checking the framing, both CRCs of every record, and each Event's fields; the ctest entry
// tools.tensorboard_reader reads phalanx-train's files with TensorBoard's own reader.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
namespace fs = std::filesystem;

namespace {

std::uint32_t crc32c_bitwise(const std::string& s) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
std::uint32_t masked(const std::string& s) {
  const std::uint32_t c = crc32c_bitwise(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

template <typename T>
T read_le(const std::string& s, std::size_t at) {
  REQUIRE(at + sizeof(T) <= s.size());
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

// The payloads of a TFRecord file; fails the test on a bad length or CRC.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < all.size()) {
    const auto len = read_le<std::uint64_t>(all, at);
    CHECK(read_le<std::uint32_t>(all, at + 8) == masked(all.substr(at, 8)));
    REQUIRE(at + 12 + len + 4 <= all.size());
    std::string payload = all.substr(at + 12, len);
    CHECK(read_le<std::uint32_t>(all, at + 12 + len) == masked(payload));
    out.push_back(std::move(payload));
    at += 12 + len + 4;
  }
  return out;
}

struct Field {
  int number = 0;
  int wire = 0;
  std::uint64_t varint = 0;
  std::string bytes;  // fixed32/fixed64 raw, or length-delimited content
};

std::uint64_t get_varint(const std::string& s, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < s.size());
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

std::vector<Field> fields(const std::string& msg) {
  std::vector<Field> out;
  std::size_t at = 0;
  while (at < msg.size()) {
    Field f;
    const std::uint64_t key = get_varint(msg, at);
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.varint = get_varint(msg, at);
    } else {
      const std::size_t n = f.wire == 1 ? 8 : f.wire == 5 ? 4 : get_varint(msg, at);
      REQUIRE((f.wire == 1 || f.wire == 2 || f.wire == 5));
      REQUIRE(at + n <= msg.size());
      f.bytes = msg.substr(at, n);
      at += n;
    }
    out.push_back(std::move(f));
  }
  return out;
}

const Field* find(const std::vector<Field>& fs_, int number) {
  for (const auto& f : fs_)
    if (f.number == number) return &f;
  return nullptr;
}

struct Scalar {
  double wall_time;
  std::int64_t step;
  std::string tag;
  float value;
};

Scalar scalar_of(const std::string& event) {
  const auto ev = fields(event);
  const Field* wall = find(ev, 1);
  const Field* step = find(ev, 2);
  const Field* summary = find(ev, 5);
  REQUIRE(wall);
  REQUIRE(step);
  REQUIRE(summary);
  const auto values = fields(summary->bytes);
  REQUIRE(values.size() == 1);
  CHECK(values[0].number == 1);
  const auto value = fields(values[0].bytes);
  const Field* tag = find(value, 1);
  const Field* simple = find(value, 2);
  REQUIRE(tag);
  REQUIRE(simple);
  CHECK(simple->wire == 5);
  Scalar s{};
  std::memcpy(&s.wall_time, wall->bytes.data(), 8);
  s.step = static_cast<std::int64_t>(step->varint);
  s.tag = tag->bytes;
  std::memcpy(&s.value, simple->bytes.data(), 4);
  return s;
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/phalanx_tb_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("the reader's CRC-32C is the Castagnoli CRC (RFC 3720 check value)") {
  CHECK(crc32c_bitwise("123456789") == 0xE3069283u);
  CHECK(crc32c_bitwise(std::string(32, '\0')) == 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
}

TEST_CASE("TensorBoardWriter writes the file version, then one framed Event per scalar") {
  TempDir dir;
  const std::string log_dir = (dir.path / "run" / "a").string();  // parents are created
  std::string file;
  {
    parallel::TensorBoardWriter tb(log_dir);
    file = tb.file();
    CHECK(fs::path(file).parent_path() == fs::path(log_dir));
    CHECK(fs::path(file).filename().string().rfind("events.out.tfevents.", 0) == 0);
    tb.add_scalar("train/loss", 2.302585, 0, 1700000000.25);
    tb.add_scalar("train/loss", 0.5, 1, 1700000001.5);
    tb.add_scalar("lr", 1e-3, -7, 1700000002.0);  // a negative step travels as int64
    tb.add_scalar("nan", std::numeric_limits<double>::quiet_NaN(), 2, 1700000003.0);
    // written at once, before any flush or close: a killed process loses nothing
    CHECK(read_records(file).size() == 5);
  }
  const auto records = read_records(file);
  REQUIRE(records.size() == 5);
  const auto head = fields(records[0]);
  REQUIRE(find(head, 3));
  CHECK(find(head, 3)->bytes == "brain.Event:2");
  CHECK(find(head, 1));
  const Scalar a = scalar_of(records[1]);
  CHECK(a.tag == "train/loss");
  CHECK(a.step == 0);
  CHECK(a.value == static_cast<float>(2.302585));
  CHECK(a.wall_time == 1700000000.25);
  const Scalar b = scalar_of(records[2]);
  CHECK(b.step == 1);
  CHECK(b.value == 0.5f);
  const Scalar c = scalar_of(records[3]);
  CHECK(c.tag == "lr");
  CHECK(c.step == -7);
  CHECK(c.value == 1e-3f);
  CHECK(std::isnan(scalar_of(records[4]).value));
}

TEST_CASE("TensorBoardWriter: purge_step writes SessionLog START at that step") {
  TempDir dir;
  parallel::TensorBoardWriter tb(dir.path.string(), parallel::TensorBoardWriterOptions().purge_step(40));
  tb.add_scalar("x", 1.0, 40);
  tb.close();
  const auto records = read_records(tb.file());
  REQUIRE(records.size() == 3);
  const auto start = fields(records[1]);
  REQUIRE(find(start, 2));
  CHECK(find(start, 2)->varint == 40);
  REQUIRE(find(start, 7));
  const auto log = fields(find(start, 7)->bytes);  // Event.session_log
  REQUIRE(find(log, 1));
  CHECK(find(log, 1)->varint == 1);  // SessionLog.START
  CHECK(scalar_of(records[2]).step == 40);
}

TEST_CASE("TensorBoardWriter: writers never share a file, a later one sorts after; the suffix ends the name") {
  TempDir dir;
  parallel::TensorBoardWriter a(dir.path.string());
  parallel::TensorBoardWriter b(dir.path.string(), parallel::TensorBoardWriterOptions().filename_suffix(".rank0"));
  CHECK(a.file() != b.file());
  CHECK(a.file() < b.file());  // TensorBoard reads in name order: a resumed run comes after its first
  // A file from the future (a clock that went back) is still sorted before a new one.
  std::ofstream((dir.path / "events.out.tfevents.9999999990.h.1.0").string());
  parallel::TensorBoardWriter c(dir.path.string());
  CHECK(fs::path(c.file()).filename().string().rfind("events.out.tfevents.9999999991.", 0) == 0);
  CHECK(b.file().size() > 6);
  CHECK(b.file().substr(b.file().size() - 6) == ".rank0");
}

TEST_CASE("TensorBoardWriter: bad use is a one-line error") {
  TempDir dir;
  const std::string not_a_dir = (dir.path / "file").string();
  std::ofstream(not_a_dir) << "x";
  CHECK_THROWS_WITH_AS(parallel::TensorBoardWriter(not_a_dir + "/runs"),
                       doctest::Contains("cannot create the log folder"), IoError);
  parallel::TensorBoardWriter tb(dir.path.string());
  CHECK_THROWS_WITH_AS(tb.add_scalar("", 1.0, 0), doctest::Contains("the tag is empty"), ValueError);
  tb.close();
  tb.close();  // idempotent
  CHECK_THROWS_WITH_AS(tb.add_scalar("x", 1.0, 0), doctest::Contains("is closed"), IoError);
}

TEST_CASE("TensorBoardWriter: a failed write (file size limit, as a full disk) is an error") {
  TempDir dir;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // write(2) then fails with EFBIG instead of killing
    rlimit limit{300, 300};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int status = 2;
    try {
      parallel::TensorBoardWriter tb(dir.path.string());
      for (int i = 0; i < 100; ++i) tb.add_scalar("train/loss", 1.0, i);
    } catch (const IoError& e) {
      status = std::string(e.what()).find("failed: File too large") != std::string::npos ? 0 : 1;
      // The torn part of the record was cut off: the file ends on a whole record.
      std::string file;
      for (const auto& f : fs::directory_iterator(dir.path)) file = f.path().string();
      std::ifstream in(file, std::ios::binary);
      const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::size_t at = 0;
      while (at + 12 <= all.size()) {
        std::uint64_t len;
        std::memcpy(&len, all.data() + at, 8);
        at += 12 + len + 4;
      }
      if (at != all.size()) status = 4;
    } catch (...) {
      status = 3;
    }
    ::_exit(status);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
