#include "phalanx/data/text_dataset.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <tuple>

#include "phalanx/core/error.hpp"
#include "phalanx/core/file_safety.hpp"

namespace phalanx::samplers {

namespace {

// Bytes that lie in invalid UTF-8 sequences (a stray continuation byte, a lead byte without
// its continuations, an overlong or out-of-range form each count their bytes).
std::int64_t invalid_utf8_bytes(const std::uint8_t* p, std::int64_t n) {
  std::int64_t bad = 0, i = 0;
  while (i < n) {
    const std::uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    std::uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok) {
      i += len;
    } else {
      ++bad;
      ++i;
    }
  }
  return bad;
}

std::string percent(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", 100 * share);
  return buf;
}

}  // namespace

TextCorpus load_text_corpus(const std::vector<std::string>& files) {
  if (files.empty()) throw ValueError("text corpus: no files given");
  auto bytes = std::make_shared<std::vector<std::uint8_t>>();
  TextCorpus c;
  for (const std::string& f : files) {
    files::check_regular(f);  // IoError "F: ..." for a missing file, a FIFO, a folder
    std::ifstream in(f, std::ios::binary);
    if (!in) throw IoError(f + ": cannot open");
    const std::vector<std::uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw IoError(f + ": read failed");
    const auto n = static_cast<std::int64_t>(data.size());
    if (n == 0) throw ValueError(f + ": the file is empty; a text file needs at least one byte");
    const auto nul = std::find(data.begin(), data.end(), std::uint8_t{0});
    if (nul != data.end())
      throw ValueError(detail::concat(f, ": not a text file: a NUL byte at offset ", nul - data.begin(),
                                      " (a text file has none; byte-level tokens come from text)"));
    const std::int64_t bad = invalid_utf8_bytes(data.data(), n);
    const double share = static_cast<double>(bad) / static_cast<double>(n);
    if (share > kMaxInvalidUtf8Share)
      throw ValueError(detail::concat(f, ": not a text file: ", percent(share), " of its ", n,
                                      " bytes are invalid UTF-8, more than the ", percent(kMaxInvalidUtf8Share),
                                      " allowed"));
    bytes->insert(bytes->end(), data.begin(), data.end());
    c.files.push_back(f);
    c.name += (c.name.empty() ? "" : ",") + f;
  }
  c.bytes = std::move(bytes);
  return c;
}

std::vector<std::string> fortune_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.empty() || name[0] == '.') continue;
      const auto ends = [&](const char* suffix) {
        const std::string s = suffix;
        return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
      };
      if (ends(".dat") || ends(".u8")) continue;  // strfile's index; the UTF-8 links to the same files
      const std::string path = dir + "/" + name;
      struct stat st;
      if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) out.push_back(path);
    }
    ::closedir(d);
  }
  if (out.empty())
    throw IoError(dir + " holds no fortune files: install Debian's fortunes package (apt-get install fortunes, "
                        "or scripts/setup.sh)");
  std::sort(out.begin(), out.end());
  return out;
}

std::pair<std::int64_t, std::int64_t> text_split_range(std::int64_t n, TextSplit split) {
  // int(n * 0.9) as Python computes it: the double product, truncated.
  const auto cut = static_cast<std::int64_t>(static_cast<double>(n) * 0.9);
  return split == TextSplit::Train ? std::make_pair(std::int64_t{0}, cut) : std::make_pair(cut, n);
}

TextDataset::TextDataset(TextCorpus corpus, TextSplit split, std::int64_t context, std::int64_t stride)
    : corpus_(std::move(corpus)), context_(context), stride_(stride == 0 ? context : stride) {
  if (!corpus_.bytes) throw ValueError("TextDataset: an empty corpus");
  if (context_ < 1) throw ValueError(detail::concat("TextDataset: context ", context_, " must be >= 1"));
  if (stride_ < 1) throw ValueError(detail::concat("TextDataset: stride ", stride_, " must be >= 1"));
  const auto n = static_cast<std::int64_t>(corpus_.bytes->size());
  std::tie(begin_, end_) = text_split_range(n, split);
  const std::int64_t have = end_ - begin_;
  if (have < context_ + 1)
    throw ValueError(detail::concat(corpus_.name, ": ", n, " bytes, of which the ",
                                    split == TextSplit::Train ? "training part (first 90 %)" : "validation part (last 10 %)",
                                    " is ", have, " bytes, fewer than context + 1 = ", context_ + 1,
                                    "; use a longer text or a smaller context"));
  windows_ = (have - context_ - 1) / stride_ + 1;
}

void TextDataset::gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const {
  if (x.dtype() != DType::Int64 || y.dtype() != DType::Int64 || x.numel() < count * context_ ||
      y.numel() < count * context_)
    throw InternalError(detail::concat("TextDataset: the batch tensors (", dtype_name(x.dtype()), " ",
                                       shape_str(x.shape()), ", ", dtype_name(y.dtype()), " ", shape_str(y.shape()),
                                       ") do not hold ", count, " windows of ", context_, " int64 tokens"));
  const std::uint8_t* bytes = corpus_.bytes->data();
  auto* xd = x.data<std::int64_t>();
  auto* yd = y.data<std::int64_t>();
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t k = idx[i];
    if (k < 0 || k >= windows_)
      throw ValueError(detail::concat("dataset index ", k, " is outside [0, ", windows_, ")"));
    const std::uint8_t* w = bytes + window_offset(k);
    std::int64_t* xr = xd + i * context_;
    std::int64_t* yr = yd + i * context_;
    for (std::int64_t t = 0; t < context_; ++t) {
      xr[t] = w[t];
      yr[t] = w[t + 1];
    }
  }
}

}  // namespace phalanx::samplers
