#include "phalanx/core/storage.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx {

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = kernels_for(device).allocate(nbytes, device.index);
}

Storage::~Storage() {
  if (borrowed_)
    return;  // keep_alive_ is released with the object
  if (map_base_)
    ::munmap(map_base_, map_len_);
  else if (data_)
    kernels_for(device_).deallocate(data_, nbytes_, device_.index);
}

std::shared_ptr<Storage> Storage::borrow(void* data, std::size_t nbytes, Device device,
                                         std::shared_ptr<const void> keep_alive) {
  if (!data && nbytes)
    throw ValueError(detail::concat("Storage::borrow: a null pointer for ", nbytes, " bytes"));
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->borrowed_ = true;
  s->keep_alive_ = std::move(keep_alive);
  return s;
}

std::shared_ptr<Storage> Storage::map_file(const std::string& path, std::size_t offset, std::size_t nbytes) {
  if (offset % 64 != 0)
    throw IoError(detail::concat(path, ": cannot map data at byte ", offset, " (not a multiple of 64)"));
  if (nbytes == 0) return std::make_shared<Storage>(0, Device::cpu());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(path + ": cannot open for reading (" + std::strerror(errno) + ")");
  try {
    auto s = map_fd(fd, path, offset, nbytes);
    ::close(fd);  // the mapping keeps the file alive
    return s;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::shared_ptr<Storage> Storage::map_fd(int fd, const std::string& what, std::size_t offset, std::size_t nbytes) {
  if (offset % 64 != 0)
    throw IoError(detail::concat(what, ": cannot map data at byte ", offset, " (not a multiple of 64)"));
  if (nbytes == 0) return std::make_shared<Storage>(0, Device::cpu());
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError(what + ": cannot stat (" + std::strerror(errno) + ")");
  if (static_cast<std::uint64_t>(st.st_size) < offset + nbytes)
    throw IoError(detail::concat(what, ": truncated: ", offset + nbytes, " bytes needed, the file has ",
                                 static_cast<long long>(st.st_size)));
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t start = offset / page * page;
  const std::size_t len = offset + nbytes - start;
  // MAP_PRIVATE + PROT_WRITE: reads share the page cache, writes copy the page (never the file).
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(start));
  if (base == MAP_FAILED) throw IoError(what + ": cannot map the file (" + std::strerror(errno) + ")");
  std::shared_ptr<Storage> s(new Storage());
  s->map_base_ = base;
  s->map_len_ = len;
  s->data_ = static_cast<char*>(base) + (offset - start);
  s->nbytes_ = nbytes;
  s->device_ = Device::cpu();
  return s;
}

}  // namespace phalanx
