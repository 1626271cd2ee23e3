// .npz: a zip of .npy members named "<key>.npy", read and written through libzip.
#include <zip.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "phalanx/core/npy.hpp"

namespace phalanx {

namespace {
struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
}  // namespace

TensorMap load_npz(const std::string& path) {
  int err = 0;
  std::unique_ptr<zip_t, ZipCloser> z(zip_open(path.c_str(), ZIP_RDONLY, &err));
  if (!z) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    std::string msg = path + ": cannot open as .npz (" + zip_error_strerror(&ze) + ")";
    zip_error_fini(&ze);
    throw IoError(msg);
  }
  TensorMap out;
  const zip_int64_t n = zip_get_num_entries(z.get(), 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    if (zip_stat_index(z.get(), i, 0, &st) != 0) throw IoError(path + ": corrupt zip directory");
    std::string name = st.name;
    zip_file_t* f = zip_fopen_index(z.get(), i, 0);
    if (!f) throw IoError(path + ": cannot read member '" + name + "'");
    std::vector<char> buf(st.size);
    const zip_int64_t got = zip_fread(f, buf.data(), st.size);
    zip_fclose(f);
    if (got != static_cast<zip_int64_t>(st.size))
      throw IoError(path + ": member '" + name + "' is truncated or corrupt");
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0)
      name.resize(name.size() - 4);
    out.set(name, parse_npy(buf.data(), buf.size(), path + "[" + name + "]"));
  }
  return out;
}

void save_npz(const std::string& path, const TensorMap& tensors) {
  const std::string tmp = path + ".tmp";
  std::remove(tmp.c_str());
  int err = 0;
  zip_t* z = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  if (!z) throw IoError(path + ": cannot create");
  std::vector<std::string> blobs;  // must outlive zip_close
  blobs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    blobs.push_back(serialize_npy(t));
    zip_source_t* src = zip_source_buffer(z, blobs.back().data(), blobs.back().size(), 0);
    const zip_int64_t idx = src ? zip_file_add(z, (name + ".npy").c_str(), src, ZIP_FL_OVERWRITE) : -1;
    if (idx < 0) {
      if (src) zip_source_free(src);
      zip_discard(z);
      throw IoError(path + ": cannot add member '" + name + "'");
    }
    zip_set_file_compression(z, idx, ZIP_CM_STORE, 0);  // like numpy.savez
  }
  if (zip_close(z) != 0) {
    std::string msg = path + ": write failed (" + zip_strerror(z) + ")";
    zip_discard(z);
    throw IoError(msg);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw IoError(path + ": rename failed");
}

}  // namespace phalanx
