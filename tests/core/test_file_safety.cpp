// How Phalanx opens files (phalanx/core/file_safety.hpp): another local user's planted link,
// FIFO or folder never redirects a write or stalls a read; new files get the mode asked.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <phalanx/core/error.hpp>
#include <phalanx/core/file_safety.hpp>

using namespace phalanx;

namespace {

std::string scratch() {
  static const std::string d = [] {
    const std::string p = "/tmp/phalanx_file_safety_" + std::to_string(::getpid());
    std::system(("rm -rf " + p + " && mkdir -p " + p).c_str());
    return p;
  }();
  return d;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// The usual umask while it lives: the modes checked must not depend on the caller's.
struct Umask022 {
  mode_t old = ::umask(022);
  ~Umask022() { ::umask(old); }
};

// A victim file and a symbolic link to it planted at `name`.
std::string plant_link(const std::string& name) {
  const std::string victim = scratch() + "/victim_of_" + name;
  std::ofstream(victim) << "precious";
  const std::string link = scratch() + "/" + name;
  std::remove(link.c_str());
  REQUIRE(::symlink(victim.c_str(), link.c_str()) == 0);
  return victim;
}

}  // namespace

TEST_CASE("new files are created exclusively, never through a link, with the mode asked") {
  Umask022 um;
  const std::string p = scratch() + "/new.bin";
  const int fd = files::create_new(p, 0600);
  ::close(fd);
  CHECK(mode_of(p) == 0600);
  CHECK_THROWS_WITH_AS(files::create_new(p, 0600), doctest::Contains("new.bin: cannot create it as a new file"), IoError);
  const std::string victim = plant_link("planted.bin");
  CHECK_THROWS_AS(files::create_new(scratch() + "/planted.bin", 0600), IoError);
  CHECK(slurp(victim) == "precious");
  // A dangling link is not followed either: its target is not created.
  const std::string dangling = scratch() + "/dangling.bin", target = scratch() + "/created_through_link";
  REQUIRE(::symlink(target.c_str(), dangling.c_str()) == 0);
  CHECK_THROWS_AS(files::create_new(dangling, 0600), IoError);
  CHECK(::access(target.c_str(), F_OK) != 0);

  std::string tmp;
  ::close(files::create_temp(p, 0600, tmp));
  CHECK(tmp.rfind(p + ".tmp.", 0) == 0);
  CHECK(tmp.size() == p.size() + 11);
  CHECK(mode_of(tmp) == 0600);
  std::string tmp2;
  ::close(files::create_temp(p, 0666, tmp2));
  CHECK(tmp2 != tmp);
  CHECK(mode_of(tmp2) == 0644);  // 0666 less the umask
}

TEST_CASE("a lock file is reused, but never a link, a FIFO, a hard link or another user's file") {
  Umask022 um;
  const std::string lock = scratch() + "/ok.lock";
  ::close(files::open_lock_file(lock, 0600));
  ::close(files::open_lock_file(lock, 0600));  // the same file again: reuse is the point
  CHECK(mode_of(lock) == 0600);

  const std::string victim = plant_link("link.lock");
  CHECK_THROWS_WITH_AS(files::open_lock_file(scratch() + "/link.lock", 0600),
                       doctest::Contains("link.lock: is a symbolic link"), IoError);
  CHECK(slurp(victim) == "precious");

  const std::string fifo = scratch() + "/fifo.lock";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(files::open_lock_file(fifo, 0600), doctest::Contains("is a FIFO, not a regular file"), IoError);

  const std::string hard = scratch() + "/hard.lock", other = scratch() + "/other_name";
  std::ofstream(other) << "another file's bytes";
  REQUIRE(::link(other.c_str(), hard.c_str()) == 0);
  CHECK_THROWS_WITH_AS(files::open_lock_file(hard, 0600), doctest::Contains("has 2 names (hard links)"), IoError);

  if (::geteuid() != 0) return;  // giving a file away needs root
  const std::string foreign = scratch() + "/foreign.lock";
  std::ofstream(foreign) << "";
  REQUIRE(::chown(foreign.c_str(), 12345, 12345) == 0);
  CHECK_THROWS_WITH_AS(files::open_lock_file(foreign, 0600), doctest::Contains("belongs to uid 12345"), IoError);
}

TEST_CASE("a folder that another user owns or may write (sticky or not) is refused, saying what to do") {
  const std::string d = scratch() + "/shared";
  REQUIRE(::mkdir(d.c_str(), 0700) == 0);
  CHECK(files::folder_refusal(d, "checkpoint folder").empty());
  REQUIRE(::chmod(d.c_str(), 0777) == 0);
  const std::string why = files::folder_refusal(d, "checkpoint folder");
  CHECK(why.find("checkpoint folder " + d + " is writable by its group and others") != std::string::npos);
  CHECK(why.find("chmod go-w " + d) != std::string::npos);
  CHECK(why.find('\n') == std::string::npos);
  CHECK_THROWS_AS(files::check_private_folder(d, "checkpoint folder"), IoError);
  REQUIRE(::chmod(d.c_str(), 0770) == 0);
  CHECK(files::folder_refusal(d, "x").find("writable by its group, who") != std::string::npos);
  REQUIRE(::chmod(d.c_str(), 01777) == 0);  // as /tmp: others cannot swap this user's files, but can add theirs
  CHECK(files::folder_refusal(d, "x").find("writable by its group and others") != std::string::npos);
  if (::geteuid() != 0) return;
  REQUIRE(::chmod(d.c_str(), 0700) == 0);
  REQUIRE(::chown(d.c_str(), 12345, 12345) == 0);
  CHECK(files::folder_refusal(d, "data cache").find("data cache " + d + " belongs to uid 12345, not to this user (uid 0)") !=
        std::string::npos);
}

TEST_CASE("folders are made 0700 and files 0600; PHALANX_FILE_MODE=0644 shares them read-only") {
  Umask022 um;
  ::unsetenv("PHALANX_FILE_MODE");
  CHECK(files::private_file_mode() == 0600);
  CHECK(files::private_folder_mode() == 0700);
  const std::string top = scratch() + "/made", d = top + "/a/b";
  files::make_folders(d, files::private_folder_mode(), "checkpoint folder");
  for (const auto& p : {top, top + "/a", d}) CHECK(mode_of(p) == 0700);
  std::ofstream(scratch() + "/plain") << "";
  CHECK_THROWS_WITH_AS(files::make_folders(scratch() + "/plain", 0700, "checkpoint folder"),
                       doctest::Contains("plain: exists and is not a folder"), IoError);
  ::setenv("PHALANX_FILE_MODE", "0644", 1);
  CHECK(files::private_file_mode() == 0644);
  CHECK(files::private_folder_mode() == 0755);
  ::setenv("PHALANX_FILE_MODE", "0777", 1);
  CHECK_THROWS_WITH_AS(files::private_file_mode(),
                       doctest::Contains("PHALANX_FILE_MODE='0777' is not one of 0600, 0644, 600, 644"), ConfigError);
  ::unsetenv("PHALANX_FILE_MODE");
}

TEST_CASE("data is read from regular files only: /dev/zero, a FIFO, a directory are named at once") {
  const std::string fifo = scratch() + "/data.fifo", dir = scratch() + "/data_dir";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(files::open_regular("/dev/zero"), "/dev/zero: is a character device, not a regular file", IoError);
  CHECK_THROWS_WITH_AS(files::check_regular(fifo), (fifo + ": is a FIFO, not a regular file").c_str(), IoError);  // no writer: no wait
  CHECK_THROWS_WITH_AS(files::check_regular(dir), (dir + ": is a directory, not a regular file").c_str(), IoError);
  CHECK_THROWS_WITH_AS(files::check_regular(scratch() + "/missing"), doctest::Contains("missing: cannot open for reading"),
                       IoError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  // A link to a regular file is followed: users link their data.
  const std::string real = scratch() + "/real.npy", linked = scratch() + "/linked.npy";
  std::ofstream(real) << "12345";
  REQUIRE(::symlink(real.c_str(), linked.c_str()) == 0);
  std::size_t size = 0;
  const int fd = files::open_regular(linked, &size);
  CHECK(size == 5);
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
  ::close(fd);
}

TEST_CASE("an output file is never written through another user's link, and only a regular one is truncated") {
  Umask022 um;
  const std::string p = scratch() + "/out.txt";
  std::ofstream(p) << "old text";
  ::close(files::open_output(p, true));
  CHECK(slurp(p) == "old text");
  ::close(files::open_output(p, false));
  CHECK(slurp(p).empty());
  const std::string fresh = scratch() + "/fresh.txt";
  ::close(files::open_output(fresh, false));
  CHECK(mode_of(fresh) == 0644);
  // /dev/null and a link of this user's own (or root's: /dev/stdout) take the output.
  ::close(files::open_output("/dev/null", false));
  const std::string mine = scratch() + "/mine.txt";
  REQUIRE(::symlink(p.c_str(), mine.c_str()) == 0);
  const int fd = files::open_output(mine, true);
  CHECK(::write(fd, "x", 1) == 1);
  ::close(fd);
  CHECK(slurp(p) == "x");
  // A FIFO without a reader fails at once; a directory takes nothing.
  const std::string fifo = scratch() + "/out.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(files::open_output(fifo, true), doctest::Contains("out.fifo: cannot open for writing"), IoError);
  CHECK_THROWS_AS(files::open_output(scratch(), false), IoError);
  if (::geteuid() != 0) return;  // a link of another user: made as root, then given away
  const std::string victim = plant_link("out.jsonl");
  REQUIRE(::lchown((scratch() + "/out.jsonl").c_str(), 12345, 12345) == 0);
  CHECK_THROWS_WITH_AS(files::open_output(scratch() + "/out.jsonl", false),
                       doctest::Contains("out.jsonl: is a symbolic link of another user (uid 12345)"), IoError);
  CHECK(slurp(victim) == "precious");
}
