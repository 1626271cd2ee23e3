#pragma once
// Byte-level text for a language model (nanoGPT's get_batch over a token file): the bytes
// of one or more files, concatenated, are the tokens (vocabulary 256). Window i is the
// bytes [i * stride, i * stride + context]: its features are the first `context` bytes and
// its label the `context` bytes after each of them (the next-byte shift), both int64 [T].
// The first 90 % of the bytes train and the last 10 % validate (nanoGPT's prepare
// scripts: n = len(data); data[:int(n * 0.9)], data[int(n * 0.9):]). Windows never cross
// the split. A TextDataset is an ordinary Dataset: a DistributedSampler shards its windows
// and the DataLoader batches them into x int64 [B, T] and y int64 [B, T].
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phalanx/data/dataset.hpp"

namespace phalanx::samplers {

/// The tokens of a text corpus: its bytes, and which files they came from (for errors).
struct TextCorpus {
  std::shared_ptr<const std::vector<std::uint8_t>> bytes;
  std::vector<std::string> files;
  std::string name;  ///< the files joined by ',' (or the built-in's name)
};

/// A file is text when it holds no NUL byte and at most this share of its bytes lie in
/// invalid UTF-8 sequences (Latin-1 prose passes; a binary file does not).
constexpr double kMaxInvalidUtf8Share = 0.01;

/// Reads and concatenates `files` in the order given. Throws ValueError (one line, naming
/// the file and the limit) for a file that is not text, IoError for one that cannot be
/// read or is not a regular file, ValueError for an empty list or an empty file.
TextCorpus load_text_corpus(const std::vector<std::string>& files);

/// The English fortune files of Debian's `fortunes` package (every regular file in
/// `dir` that is not a .dat index or a .u8 link, sorted by name), as they are: each
/// fortune ends with a line holding only '%', which stays in the text (the model learns
/// where a fortune ends). IoError naming the package when the folder has none.
constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
std::vector<std::string> fortune_files(const std::string& dir = kFortunesDir);

enum class TextSplit { Train, Validation };

/// The byte range of a split: train [0, floor(0.9 n)), validation [floor(0.9 n), n).
std::pair<std::int64_t, std::int64_t> text_split_range(std::int64_t n, TextSplit split);

class TextDataset : public Dataset {
 public:
  /// The windows of `split` of `corpus`. context >= 1; stride >= 1 (0: stride = context).
  /// Throws ValueError naming the corpus, its split's size and the limit when the split has
  /// fewer than context + 1 bytes.
  TextDataset(TextCorpus corpus, TextSplit split, std::int64_t context, std::int64_t stride = 0);

  std::int64_t size() const override { return windows_; }
  Shape feature_shape() const override { return {context_}; }
  Shape label_shape() const override { return {context_}; }
  DType feature_dtype() const override { return DType::Int64; }
  DType label_dtype() const override { return DType::Int64; }
  /// x int64 [count, T] and y int64 [count, T] (or any tensors of those many int64 elements).
  void gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const override;

  std::int64_t context() const { return context_; }
  std::int64_t stride() const { return stride_; }
  /// Bytes of this split.
  std::int64_t split_bytes() const { return end_ - begin_; }
  /// Offset of window `i`'s first byte in the corpus.
  std::int64_t window_offset(std::int64_t i) const { return begin_ + i * stride_; }
  const TextCorpus& corpus() const { return corpus_; }

 private:
  TextCorpus corpus_;
  std::int64_t begin_ = 0, end_ = 0, context_ = 0, stride_ = 0, windows_ = 0;
};

}  // namespace phalanx::samplers
