// TextDataset: byte-level windows over text files (nanoGPT's get_batch), the 90/10 split,
// the stride, sharding with the DistributedSampler, and the errors for files that are not text.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& content) {
    char tmpl[] = "/tmp/phalanx_text_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
    ::close(fd);
    path = tmpl;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

// n bytes of pseudo-random lowercase letters (no window of 16 repeats in a few thousand).
std::string text(std::size_t n, int salt = 0) {
  std::string s(n, ' ');
  std::uint64_t h = 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(salt);
  for (std::size_t i = 0; i < n; ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    s[i] = static_cast<char>('a' + (h >> 33) % 26);
  }
  return s;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("windows are the bytes [i*stride, i*stride + context] with the next-byte shift as the target") {
  const std::string s = text(1000);
  TempFile f(s);
  const TextCorpus c = load_text_corpus({f.path});
  REQUIRE(c.bytes->size() == 1000);
  TextDataset train(c, TextSplit::Train, 16);  // stride = context
  CHECK(train.split_bytes() == 900);
  CHECK(train.size() == (900 - 17) / 16 + 1);
  CHECK(train.feature_shape() == Shape{16});
  CHECK(train.label_shape() == Shape{16});
  CHECK(train.feature_dtype() == DType::Int64);
  Tensor x = Tensor::empty({2, 16}, DType::Int64), y = Tensor::empty({2, 16}, DType::Int64);
  const std::int64_t idx[] = {3, train.size() - 1};
  train.gather(idx, 2, x, y);
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < 16; ++t) {
      const std::int64_t at = idx[r] * 16 + t;
      CHECK(x.data<std::int64_t>()[r * 16 + t] == static_cast<unsigned char>(s[at]));
      CHECK(y.data<std::int64_t>()[r * 16 + t] == static_cast<unsigned char>(s[at + 1]));
    }
  // The last window ends inside the training part: window i needs bytes up to i*16 + 16.
  CHECK(train.window_offset(train.size() - 1) + 16 < 900);
  CHECK(train.window_offset(train.size()) + 16 >= 900);
}

TEST_CASE("the split is nanoGPT's: the first int(n * 0.9) bytes train, the rest validate") {
  for (std::int64_t n : {10, 11, 999, 1000, 1001, 2576674}) {
    CAPTURE(n);
    const auto [t0, t1] = text_split_range(n, TextSplit::Train);
    const auto [v0, v1] = text_split_range(n, TextSplit::Validation);
    CHECK(t0 == 0);
    CHECK(t1 == static_cast<std::int64_t>(static_cast<double>(n) * 0.9));
    CHECK(v0 == t1);
    CHECK(v1 == n);
  }
  const std::string s = text(1000);
  TempFile f(s);
  TextDataset val(load_text_corpus({f.path}), TextSplit::Validation, 8);
  CHECK(val.split_bytes() == 100);
  CHECK(val.size() == (100 - 9) / 8 + 1);
  CHECK(val.window_offset(0) == 900);
  Tensor x = Tensor::empty({1, 8}, DType::Int64), y = Tensor::empty({1, 8}, DType::Int64);
  const std::int64_t i0 = 0;
  val.gather(&i0, 1, x, y);
  CHECK(x.data<std::int64_t>()[0] == static_cast<unsigned char>(s[900]));
  CHECK(y.data<std::int64_t>()[7] == static_cast<unsigned char>(s[908]));
}

TEST_CASE("a stride smaller than the context overlaps the windows") {
  TempFile f(text(1000));
  const TextCorpus c = load_text_corpus({f.path});
  TextDataset a(c, TextSplit::Train, 32, 1), b(c, TextSplit::Train, 32, 5);
  CHECK(a.stride() == 1);
  CHECK(a.size() == 900 - 32);
  CHECK(b.size() == (900 - 33) / 5 + 1);
  CHECK(b.window_offset(2) == 10);
}

TEST_CASE("several files are concatenated in the order given") {
  const std::string s1 = text(300, 1), s2 = text(500, 2);
  TempFile f1(s1), f2(s2);
  const TextCorpus c = load_text_corpus({f1.path, f2.path});
  CHECK(c.bytes->size() == 800);
  CHECK(std::string(c.bytes->begin(), c.bytes->end()) == s1 + s2);
  CHECK(c.name == f1.path + "," + f2.path);
}

TEST_CASE("the DistributedSampler shards the windows: two ranks see every window once") {
  TempFile f(text(5000));
  auto ds = std::make_shared<TextDataset>(load_text_corpus({f.path}), TextSplit::Train, 16);
  const std::int64_t n = ds->size();
  std::multiset<std::int64_t> seen;  // windows drawn, over both ranks
  for (int rank : {0, 1}) {
    auto sampler = std::make_shared<DistributedSampler>(
        n, DistributedSamplerOptions().num_replicas(2).rank(rank).seed(7).drop_last(true));
    DataLoader loader(ds, DataLoaderOptions(4), sampler);
    loader.set_epoch(1);
    for (Batch& b : loader) {
      CHECK(b.x.dtype() == DType::Int64);
      CHECK(b.y.dtype() == DType::Int64);
      REQUIRE(b.x.dim() == 2);
      CHECK(b.x.shape()[1] == 16);
      CHECK(b.y.shape() == b.x.shape());
      const auto* x = b.x.data<std::int64_t>();
      for (std::int64_t r = 0; r < b.x.shape()[0]; ++r) {
        // Which window is this row? Its first byte's offset, found in the corpus.
        bool found = false;
        for (std::int64_t w = 0; w < n && !found; ++w) {
          const auto* bytes = ds->corpus().bytes->data() + ds->window_offset(w);
          bool same = true;
          for (int t = 0; t < 16 && same; ++t) same = x[r * 16 + t] == bytes[t];
          if (same) seen.insert(w), found = true;
        }
        CHECK(found);
      }
    }
  }
  // drop_last: the sampler's remainder (n odd) is dropped; every other window once.
  CHECK(static_cast<std::int64_t>(seen.size()) == n / 2 * 2);
  CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == seen.size());
}

TEST_CASE("a file that is not text, or is too short, is one line naming the file and the limit") {
  std::string with_nul = text(500);
  with_nul[123] = '\0';
  TempFile nul(with_nul);
  const std::string m1 = message_of([&] { load_text_corpus({nul.path}); });
  CHECK(m1.find(nul.path) == 0);
  CHECK(m1.find("NUL byte at offset 123") != std::string::npos);
  CHECK(m1.find('\n') == std::string::npos);

  std::string binary = text(500);
  for (int i = 0; i < 20; ++i) binary[i * 20] = static_cast<char>(0xFF);
  TempFile bin(binary);
  const std::string m2 = message_of([&] { load_text_corpus({bin.path}); });
  CHECK(m2.find(bin.path) == 0);
  CHECK(m2.find("4.0 % of its 500 bytes are invalid UTF-8, more than the 1.0 % allowed") != std::string::npos);

  // A few Latin-1 bytes in prose are still text.
  std::string latin = text(500);
  latin[10] = static_cast<char>(0xE9);
  TempFile lat(latin);
  CHECK(load_text_corpus({lat.path}).bytes->size() == 500);
  // UTF-8 multi-byte characters are text.
  TempFile utf("caf\xC3\xA9 na\xC3\xAFve \xE2\x82\xAC 100 " + text(200));
  CHECK_NOTHROW(load_text_corpus({utf.path}));

  TempFile shortf(text(100));
  const std::string m3 = message_of([&] { TextDataset(load_text_corpus({shortf.path}), TextSplit::Validation, 16); });
  CHECK(m3.find(shortf.path) == 0);
  CHECK(m3.find("validation part (last 10 %) is 10 bytes, fewer than context + 1 = 17") != std::string::npos);
  const std::string m4 = message_of([&] { TextDataset(load_text_corpus({shortf.path}), TextSplit::Train, 128); });
  CHECK(m4.find("training part (first 90 %) is 90 bytes, fewer than context + 1 = 129") != std::string::npos);

  TempFile empty("");
  CHECK(message_of([&] { load_text_corpus({empty.path}); }).find("the file is empty") != std::string::npos);
  CHECK(message_of([&] { load_text_corpus({"/nonexistent/x.txt"}); }).find("/nonexistent/x.txt") == 0);
  CHECK(message_of([&] { load_text_corpus({"/tmp"}); }).find("/tmp") == 0);
}

TEST_CASE("the fortunes corpus: the package's English files, sorted, without the .dat indexes") {
  std::vector<std::string> files;
  try {
    files = fortune_files();
  } catch (const IoError& e) {
    MESSAGE("SKIPPED: " << e.what());
    return;
  }
  CHECK(files.size() > 10);
  CHECK(std::is_sorted(files.begin(), files.end()));
  for (const auto& f : files) {
    CHECK(f.find(".dat") == std::string::npos);
    CHECK(f.find(".u8") == std::string::npos);
  }
  const TextCorpus c = load_text_corpus(files);
  CHECK(c.bytes->size() > 2000000);
  CHECK(message_of([] { fortune_files("/nonexistent"); }).find("install Debian's fortunes package") !=
        std::string::npos);
}
