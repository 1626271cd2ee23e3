// Opening files so that another local user's planted names cannot redirect a write or stall
// a read: see phalanx/core/file_safety.hpp.
#include "phalanx/core/file_safety.hpp"

#include "phalanx/core/env.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "phalanx/core/error.hpp"

namespace phalanx::files {

namespace {

std::string why(int e) { return std::string(" (") + std::strerror(e) + ")"; }

[[noreturn]] void fail_closing(int fd, const std::string& msg) {
  ::close(fd);
  throw IoError(msg);
}

void clear_nonblock(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK); }

std::string not_regular(const std::string& path, unsigned mode) {
  return path + ": is " + kind_of(mode) + ", not a regular file";
}

// Six characters from a 62-letter alphabet: about 5.7e10 names, drawn from the kernel's
// generator so that another user cannot predict the next one.
std::string random_suffix() {
  static const char kLetters[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string s(6, 'x');
  for (char& c : s) c = kLetters[rd() % 62];
  return s;
}

}  // namespace

std::string kind_of(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a file";
}

int open_regular(const std::string& path, std::size_t* size) {
  // Refused before opening where possible: opening a device can have effects of its own.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) throw IoError(not_regular(path, st.st_mode));
  // O_NONBLOCK: a FIFO swapped in meanwhile must not make open wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) throw IoError(path + ": cannot open for reading" + why(errno));
  if (::fstat(fd, &st) != 0) fail_closing(fd, path + ": cannot stat" + why(errno));
  if (!S_ISREG(st.st_mode)) fail_closing(fd, not_regular(path, st.st_mode));
  clear_nonblock(fd);
  if (size) *size = static_cast<std::size_t>(st.st_size);
  return fd;
}

void check_regular(const std::string& path) { ::close(open_regular(path)); }

unsigned private_file_mode() {
  const std::string v = env::choice("PHALANX_FILE_MODE", "0600", {"0600", "0644", "600", "644"});
  return v == "0644" || v == "644" ? 0644 : 0600;
}

unsigned private_folder_mode() { return private_file_mode() == 0644 ? 0755 : 0700; }

int create_new(const std::string& path, unsigned mode) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) throw IoError(path + ": cannot create it as a new file" + why(errno));
  return fd;
}

int create_temp(const std::string& base, unsigned mode, std::string& tmp) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = base + ".tmp." + random_suffix();
    const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, static_cast<mode_t>(mode));
    if (fd >= 0) return fd;
    if (errno != EEXIST) {
      const int e = errno;
      tmp.clear();  // not ours: a caller's cleanup must not remove it
      throw IoError(base + ": cannot create a temporary file beside it" + why(e));
    }
  }
  tmp.clear();
  throw IoError(base + ": cannot create a temporary file beside it (100 names taken)");
}

int open_output(const std::string& path, bool append, unsigned mode) {
  // A link is followed only when this user or root made it (/dev/stdout, a link of one's
  // own): one that another user planted in a folder they may write is refused. A terminal,
  // /dev/null or a FIFO with a reader may take the output; a directory, block device or
  // socket may not, and only a regular file is truncated.
  struct stat st {};
  bool follow = false;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    if (st.st_uid != ::geteuid() && st.st_uid != 0)
      throw IoError(detail::concat(path, ": is a symbolic link of another user (uid ", st.st_uid,
                                   "), which is not followed for writing; give the file itself"));
    follow = true;
  }
  // O_NONBLOCK: a FIFO without a reader fails to open instead of waiting. No O_TRUNC: a
  // file is truncated only once it is known to be regular.
  const int flags = O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW) |
                    (append ? O_APPEND : 0);
  const int fd = ::open(path.c_str(), flags, static_cast<mode_t>(mode));
  if (fd < 0 && errno == ELOOP) throw IoError(path + ": became a symbolic link while it was opened; give the file itself");
  if (fd < 0) throw IoError(path + ": cannot open for writing" + why(errno));
  if (::fstat(fd, &st) != 0) fail_closing(fd, path + ": cannot stat" + why(errno));
  if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode))
    fail_closing(fd, path + ": is " + kind_of(st.st_mode) + ", which takes no output");
  if (S_ISREG(st.st_mode) && !append && ::ftruncate(fd, 0) != 0) fail_closing(fd, path + ": cannot truncate" + why(errno));
  clear_nonblock(fd);
  return fd;
}

int open_lock_file(const std::string& path, unsigned mode) {
  // Not O_EXCL: the lock file stays between runs (removing one that another process holds
  // would let a third take a second lock on a new file of the same name).
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0 && errno == ELOOP)
    throw IoError(path + ": is a symbolic link (planted by another user?); it is not followed: remove it and run again");
  if (fd < 0) throw IoError(path + ": cannot open" + why(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_closing(fd, path + ": cannot stat" + why(errno));
  if (!S_ISREG(st.st_mode)) fail_closing(fd, not_regular(path, st.st_mode) + ": remove it and run again");
  if (st.st_uid != ::geteuid())
    fail_closing(fd, detail::concat(path, ": belongs to uid ", st.st_uid, ", not to this user (uid ", ::geteuid(),
                                    "): remove it, or choose a folder of your own"));
  if (st.st_nlink != 1)
    fail_closing(fd, detail::concat(path, ": has ", st.st_nlink,
                                    " names (hard links), so writing it would change another file: remove it and run "
                                    "again"));
  clear_nonblock(fd);
  return fd;
}

void make_folders(const std::string& dir, unsigned mode, const std::string& what) {
  for (std::size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST)
      throw IoError(what + " " + dir + ": cannot create " + part + why(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw IoError(what + " " + dir + ": exists and is not a folder");
}

std::string fd_path(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

std::string folder_refusal(const std::string& dir, const std::string& what) {
  struct stat st {};
  // The name itself first: a link another user planted (in a shared parent) would send
  // every later write into a folder of their choosing.
  if (::lstat(dir.c_str(), &st) != 0) return what + " " + dir + ": cannot stat" + why(errno);
  if (S_ISLNK(st.st_mode) && st.st_uid != ::geteuid() && st.st_uid != 0)
    return detail::concat(what, " ", dir, " is a symbolic link of uid ", st.st_uid,
                          ", not of this user: give the folder's real path, or a folder of your own");
  if (::stat(dir.c_str(), &st) != 0) return what + " " + dir + ": cannot stat" + why(errno);
  if (st.st_uid != ::geteuid())
    return detail::concat(what, " ", dir, " belongs to uid ", st.st_uid, ", not to this user (uid ", ::geteuid(),
                          "), who could replace its files: choose a folder of your own");
  // Sticky or not: in a sticky shared folder others cannot swap this user's files, but they
  // can add their own (a newer checkpoint to resume from), as ssh refuses for ~/.ssh.
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    const char* who = (st.st_mode & S_IWOTH) == 0 ? "its group" : (st.st_mode & S_IWGRP) == 0 ? "others" : "its group and others";
    return what + " " + dir + " is writable by " + who + ", who could plant or swap its files: chmod go-w " + dir +
           ", or choose a folder of your own";
  }
  return {};
}

void check_private_folder(const std::string& dir, const std::string& what) {
  const std::string reason = folder_refusal(dir, what);
  if (!reason.empty()) throw IoError(reason);
}

}  // namespace phalanx::files
