// The per-host data cache (decompressed IDX files mapped by every process) and mapped
// tensors: built once by concurrent processes, reused, rebuilt when damaged or when the
// source changes; writes to a mapped tensor copy pages and never reach the file.
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <atomic>
#include <thread>
#include <vector>

#include <phalanx/phalanx.hpp>
#include <phalanx/core/tensor_impl.hpp>
#include <phalanx/data/data_cache.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

// A fresh cache directory for one test, set as PHALANX_DATA_CACHE while it lives.
struct TempCache {
  std::string dir;
  std::string old;
  bool had_old = false;
  TempCache() {
    char tmpl[] = "/tmp/phalanx_cache_test_XXXXXX";
    dir = ::mkdtemp(tmpl);
    if (const char* o = std::getenv("PHALANX_DATA_CACHE")) had_old = true, old = o;
    ::setenv("PHALANX_DATA_CACHE", (dir + "/cache").c_str(), 1);
  }
  ~TempCache() {
    if (had_old) ::setenv("PHALANX_DATA_CACHE", old.c_str(), 1);
    else ::unsetenv("PHALANX_DATA_CACHE");
    std::system(("rm -rf " + dir).c_str());
  }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

long long mtime_ns(const std::string& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return static_cast<long long>(st.st_mtim.tv_sec) * 1000000000ll + st.st_mtim.tv_nsec;
}

// A producer that doubles the source's bytes into float32 [n], and appends a line to `log`
// each time it runs (so builds can be counted across processes).
CacheProducer doubling(const std::string& source, const std::string& log) {
  return [source, log](CacheSink& sink) {
    std::ofstream(log, std::ios::app) << "built\n";
    const std::string b = slurp(source);
    sink.begin({static_cast<std::int64_t>(b.size())});
    std::vector<float> v;
    for (unsigned char c : b) v.push_back(2.f * c);
    sink.write(v.data(), v.size() * sizeof(float));
  };
}

int count_lines(const std::string& p) {
  std::ifstream f(p);
  int n = 0;
  for (std::string l; std::getline(f, l);) ++n;
  return n;
}

}  // namespace

TEST_CASE("a cached array is built once, mapped, reused unchanged, rebuilt when damaged or when the source changes") {
  TempCache tc;
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log";
  write_file(src, std::string("\x01\x02\x03\xff", 4));
  CacheInfo info;
  Tensor a = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK(info.built);
  CHECK(info.mapped);
  CHECK(a.shape() == Shape{4});
  CHECK(a.to_vector<float>() == std::vector<float>{2, 4, 6, 510});
  CHECK(a.impl()->storage()->mapped());
  const std::string entry = info.path;
  const long long t0 = mtime_ns(entry);

  // Reused: not built again, the file untouched.
  Tensor b = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.built);
  CHECK(info.mapped);
  CHECK(info.path == entry);
  CHECK(b.to_vector<float>() == a.to_vector<float>());
  CHECK(mtime_ns(entry) == t0);
  CHECK(count_lines(log) == 1);

  // Another transform of the same source is another entry.
  cached_array(src, "double-again", DType::Float32, doubling(src, log), &info);
  CHECK(info.built);
  CHECK(info.path != entry);
  CHECK(count_lines(log) == 2);

  // A damaged data byte fails the checksum: rebuilt, the right values come back.
  {
    std::string bytes = slurp(entry);
    bytes[4096 + 5] ^= 0x40;
    write_file(entry + ".new", bytes);
    REQUIRE(std::rename((entry + ".new").c_str(), entry.c_str()) == 0);
  }
  Tensor c = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK(info.built);
  CHECK(info.rebuilt_damaged);
  CHECK(c.to_vector<float>() == std::vector<float>{2, 4, 6, 510});
  CHECK(count_lines(log) == 3);
  // A truncated entry too.
  {
    std::string bytes = slurp(entry);
    write_file(entry + ".new", bytes.substr(0, bytes.size() - 4));
    REQUIRE(std::rename((entry + ".new").c_str(), entry.c_str()) == 0);
  }
  cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK(info.rebuilt_damaged);
  CHECK(count_lines(log) == 4);

  // The source changes (same size): a new entry replaces the old one.
  write_file(src, std::string("\x05\x02\x03\xff", 4));
  Tensor d = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK(info.built);
  CHECK_FALSE(info.rebuilt_damaged);
  CHECK(info.path != entry);
  CHECK(d.to_vector<float>() == std::vector<float>{10, 4, 6, 510});
  CHECK(::access(entry.c_str(), F_OK) != 0);  // the stale entry is gone ...
  CHECK(a.to_vector<float>() == std::vector<float>{2, 4, 6, 510});  // ... its mappings live on
}

TEST_CASE("same-named sources (MNIST and Fashion-MNIST) keep their own entries: concurrent loaders never throw or rebuild") {
  TempCache tc;
  REQUIRE(::mkdir((tc.dir + "/mnist").c_str(), 0755) == 0);
  REQUIRE(::mkdir((tc.dir + "/fashion").c_str(), 0755) == 0);
  const std::string a = tc.dir + "/mnist/train-images-idx3-ubyte", b = tc.dir + "/fashion/train-images-idx3-ubyte";
  write_file(a, std::string("\x01\x02\x03", 3));
  write_file(b, std::string("\x07\x08\x09\x0a", 4));
  const std::vector<float> va{2, 4, 6}, vb{14, 16, 18, 20};
  std::atomic<int> errors{0}, builds{0}, wrong{0};
  auto loader = [&](const std::string& src, const std::vector<float>& want) {
    for (int i = 0; i < 200; ++i) {
      try {
        CacheInfo info;
        Tensor t = cached_array(src, "same transform", DType::Float32, doubling(src, tc.dir + "/log"), &info);
        if (info.built) ++builds;
        if (!info.mapped || t.to_vector<float>() != want) ++wrong;
      } catch (const std::exception& e) {
        if (errors++ == 0) MESSAGE(e.what());
      }
    }
  };
  std::thread ta(loader, a, va), tb(loader, b, vb);
  ta.join();
  tb.join();
  CHECK(errors == 0);
  CHECK(wrong == 0);
  CHECK(builds == 2);  // each source once; never each other's victim
  // Jobs alternating between the two datasets reuse both entries.
  CacheInfo ia, ib;
  cached_array(a, "same transform", DType::Float32, doubling(a, tc.dir + "/log"), &ia);
  cached_array(b, "same transform", DType::Float32, doubling(b, tc.dir + "/log"), &ib);
  CHECK_FALSE(ia.built);
  CHECK_FALSE(ib.built);
  CHECK(ia.path != ib.path);

  // An identical copy with another mtime (another host's, a fresh download) is the same key.
  const struct timespec old_times[2] = {{1000000, 0}, {1000000, 0}};
  REQUIRE(::utimensat(AT_FDCWD, a.c_str(), old_times, 0) == 0);
  cached_array(a, "same transform", DType::Float32, doubling(a, tc.dir + "/log"), &ia);
  CHECK_FALSE(ia.built);
}

TEST_CASE("a killed builder's temporary is removed by the next builder; a foreign entry is not used") {
  TempCache tc;
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log";
  write_file(src, std::string("\x01\x02", 2));
  CacheInfo info;
  cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  const std::string entry = info.path;
  // As if a builder had been killed mid-write, and then the entry were cleared.
  write_file(entry + ".tmp.999999", "partial");
  REQUIRE(std::remove(entry.c_str()) == 0);
  cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK(info.built);
  CHECK(::access((entry + ".tmp.999999").c_str(), F_OK) != 0);

  // A symlink in the entry's place (someone else's file) is not followed: private memory.
  const std::string other = tc.dir + "/other";
  write_file(other, slurp(entry));
  REQUIRE(std::remove(entry.c_str()) == 0);
  REQUIRE(::symlink(other.c_str(), entry.c_str()) == 0);
  Tensor t = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK(info.built);
  CHECK_FALSE(info.mapped);
  CHECK(t.to_vector<float>() == std::vector<float>{2, 4});
  // An entry owned by another user (checkable as root only) likewise.
  if (::geteuid() == 0) {
    REQUIRE(std::remove(entry.c_str()) == 0);
    REQUIRE(std::rename(other.c_str(), entry.c_str()) == 0);
    REQUIRE(::chown(entry.c_str(), 12345, 12345) == 0);
    Tensor u = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
    CHECK_FALSE(info.mapped);
    CHECK(u.to_vector<float>() == std::vector<float>{2, 4});
  }
}

TEST_CASE("concurrent processes build a cache entry once and all map it") {
  TempCache tc;
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log";
  std::string bytes(300000, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  write_file(src, bytes);
  std::vector<pid_t> kids;
  for (int k = 0; k < 3; ++k) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 1;
      try {
        auto slow = [&](CacheSink& sink) {
          ::usleep(200 * 1000);  // a slow writer: the others must wait for it, not build too
          doubling(src, log)(sink);
        };
        CacheInfo info;
        Tensor t = cached_array(src, "double", DType::Float32, slow, &info);
        const float* p = t.data<float>();
        bool ok = info.mapped && t.numel() == 300000;
        for (std::int64_t i = 0; ok && i < t.numel(); ++i)
          ok = p[i] == 2.f * static_cast<unsigned char>(bytes[i]);
        rc = ok ? 0 : 2;
      } catch (...) {
        rc = 3;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(count_lines(log) == 1);
}

TEST_CASE("writes to a mapped tensor copy the page; the cache file and the other mappings keep their values") {
  TempCache tc;
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log";
  write_file(src, std::string(5000, '\x01'));
  CacheInfo info;
  Tensor a = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  const std::string before = slurp(info.path);
  a.mul_(3.f);
  a.narrow_rows(0, 1).fill_(-1.0);
  CHECK(a.to_vector<float>()[0] == -1.f);
  CHECK(a.to_vector<float>()[4999] == 6.f);
  CHECK(slurp(info.path) == before);
  Tensor b = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.built);  // the entry still verifies
  CHECK(b.to_vector<float>()[0] == 2.f);
  CHECK(b.to_vector<float>()[4999] == 2.f);
}

TEST_CASE("the data cache off, or an unwritable directory: private memory, same values") {
  TempCache tc;
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log";
  write_file(src, std::string("\x07\x08", 2));
  ::setenv("PHALANX_DATA_CACHE", "off", 1);
  CacheInfo info;
  Tensor a = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.mapped);
  CHECK(a.to_vector<float>() == std::vector<float>{14, 16});
  ::setenv("PHALANX_DATA_CACHE", (src + "/not-a-dir").c_str(), 1);  // under a regular file
  Tensor b = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.mapped);
  CHECK(b.to_vector<float>() == std::vector<float>{14, 16});
  // A producer that writes the wrong amount is refused, not cached.
  ::setenv("PHALANX_DATA_CACHE", (tc.dir + "/cache").c_str(), 1);
  auto short_write = [](CacheSink& s) { s.begin({4}); float v = 1; s.write(&v, 4); };
  CHECK_THROWS_WITH_AS(cached_array(src, "short", DType::Float32, short_write), doctest::Contains("wrote 4 bytes"),
                       ValueError);
}

TEST_CASE("a cache that cannot be written (file size limit, as a full disk) falls back to private memory") {
  TempCache tc;
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log";
  write_file(src, std::string(100000, '\x03'));  // 400 kB of float32
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 1;
    try {
      std::signal(SIGXFSZ, SIG_IGN);  // writes past the limit fail with EFBIG instead
      const rlimit lim{64 * 1024, 64 * 1024};
      ::setrlimit(RLIMIT_FSIZE, &lim);
      CacheInfo info;
      Tensor t = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
      const std::vector<float> v = t.to_vector<float>();
      rc = !info.mapped && v.size() == 100000 && v[0] == 6.f && v[99999] == 6.f ? 0 : 2;
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // No entry and no temporary file were left behind.
  FILE* p = ::popen(("ls " + tc.dir + "/cache | grep -v '\\.lock$' | wc -l").c_str(), "r");
  int n = -1;
  REQUIRE(std::fscanf(p, "%d", &n) == 1);
  ::pclose(p);
  CHECK(n == 0);
}

TEST_CASE("Fashion-MNIST from the cache equals Fashion-MNIST built in private memory, standardized or not") {
  TempCache tc;
  for (bool standardize : {false, true}) {
    CAPTURE(standardize);
    MnistOptions o;
    o.train = false;
    o.standardize = standardize;
    ::setenv("PHALANX_DATA_CACHE", "off", 1);
    auto priv = load_mnist(kFashionMnistDir, o);
    ::setenv("PHALANX_DATA_CACHE", (tc.dir + "/cache").c_str(), 1);
    auto mapped = load_mnist(kFashionMnistDir, o);
    CHECK(mapped->features().impl()->storage()->mapped());
    CHECK(mapped->labels().impl()->storage()->mapped());
    CHECK_FALSE(priv->features().impl()->storage()->mapped());
    CHECK(mapped->features().shape() == priv->features().shape());
    CHECK(mapped->features().to_vector<float>() == priv->features().to_vector<float>());
    CHECK(mapped->labels().to_vector<std::int64_t>() == priv->labels().to_vector<std::int64_t>());
  }
  // Both option sets have their own entries (two images, one shared labels entry).
  int entries = 0;
  for (const char* name : {"t10k-images", "t10k-labels"}) {
    const std::string cmd = "ls " + tc.dir + "/cache | grep -c '^" + name + ".*phxc$'";
    FILE* p = ::popen(cmd.c_str(), "r");
    int n = 0;
    REQUIRE(std::fscanf(p, "%d", &n) == 1);
    ::pclose(p);
    entries += n;
  }
  CHECK(entries == 3);
}

namespace {
unsigned mode_of(const std::string& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}
int entries(const std::string& dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}
}  // namespace

TEST_CASE("cache entries are 0600 in 0700 folders; a planted .lock is not followed and its target stays") {
  TempCache tc;
  const mode_t old_mask = ::umask(022);
  ::unsetenv("PHALANX_FILE_MODE");
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log";
  write_file(src, std::string("\x01\x02", 2));
  CacheInfo info;
  cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  REQUIRE(info.mapped);
  CHECK(mode_of(tc.dir + "/cache") == 0700);
  CHECK(mode_of(info.path) == 0600);
  CHECK(mode_of(info.path + ".lock") == 0600);
  // ln -s victim ENTRY.lock: the builder opened it with O_CREAT (creating a dangling link's
  // target, as root anywhere); now the link is refused and the array built in private memory.
  const std::string victim = tc.dir + "/victim";
  write_file(victim, "precious");
  REQUIRE(std::remove(info.path.c_str()) == 0);
  REQUIRE(std::remove((info.path + ".lock").c_str()) == 0);
  REQUIRE(::symlink(victim.c_str(), (info.path + ".lock").c_str()) == 0);
  Tensor t = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.mapped);
  CHECK(t.to_vector<float>() == std::vector<float>{2, 4});
  CHECK(slurp(victim) == "precious");
  REQUIRE(std::remove((info.path + ".lock").c_str()) == 0);
  std::remove(info.path.c_str());  // no entry: the next call goes for the lock
  const std::string target = tc.dir + "/created_through_lock";
  REQUIRE(::symlink(target.c_str(), (info.path + ".lock").c_str()) == 0);
  cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.mapped);
  CHECK(::access(target.c_str(), F_OK) != 0);
  ::umask(old_mask);
}

TEST_CASE("a cache folder another user owns or may write is not used: one line why, private memory") {
  TempCache tc;
  const std::string src = tc.dir + "/source.bin", log = tc.dir + "/builds.log", cache = tc.dir + "/cache";
  write_file(src, std::string("\x03", 1));
  REQUIRE(::mkdir(cache.c_str(), 0700) == 0);
  REQUIRE(::chmod(cache.c_str(), 0777) == 0);
  CacheInfo info;
  Tensor t = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.mapped);
  CHECK(t.to_vector<float>() == std::vector<float>{6});
  CHECK(entries(cache) == 0);  // nothing written there
  REQUIRE(::chmod(cache.c_str(), 01777) == 0);  // sticky: refused too (others could add entries)
  cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.mapped);
  REQUIRE(::chmod(cache.c_str(), 0700) == 0);
  cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK(info.mapped);
  if (::geteuid() != 0) return;
  const std::string theirs = tc.dir + "/theirs";
  REQUIRE(::mkdir(theirs.c_str(), 0700) == 0);
  REQUIRE(::chown(theirs.c_str(), 12345, 12345) == 0);
  ::setenv("PHALANX_DATA_CACHE", theirs.c_str(), 1);
  Tensor u = cached_array(src, "double", DType::Float32, doubling(src, log), &info);
  CHECK_FALSE(info.mapped);
  CHECK(u.to_vector<float>() == std::vector<float>{6});
}

TEST_CASE("a FIFO or /dev/zero as a cached source is refused at once, naming it") {
  TempCache tc;
  const std::string fifo = tc.dir + "/source.fifo", log = tc.dir + "/builds.log";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(cached_array(fifo, "double", DType::Float32, doubling(fifo, log)),
                       (fifo + ": is a FIFO, not a regular file").c_str(), IoError);
  CHECK_THROWS_WITH_AS(cached_array("/dev/zero", "double", DType::Float32, doubling("/dev/zero", log)),
                       "/dev/zero: is a character device, not a regular file", IoError);
}
