#include "trainer_data.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include <phalanx/core/file_safety.hpp>
#include <phalanx/phalanx.hpp>

#include "text_format.hpp"

namespace phalanx::trainer {

namespace {

constexpr std::int64_t kFashionMnistClasses = 10;

// A CNN's images: [N, H, W] gains its channel axis; [N, C, H, W] stays; others are named.
std::shared_ptr<samplers::TensorDataset> as_images(const std::shared_ptr<samplers::TensorDataset>& ds,
                                                    const std::string& what, const TrainConfig& c) {
  const Shape& s = ds->features().shape();
  if (s.size() == 4) return ds;
  if (s.size() == 3)
    return std::make_shared<samplers::TensorDataset>(ds->features().reshape({s[0], 1, s[1], s[2]}), ds->labels());
  throw ShapeError("--model " + c.model_text + " needs images: " + what + " has the shape " + shape_str(s) +
                   "; save the features as [N, C, H, W] (or [N, H, W]) or use an MLP --model D-...-K");
}

// The file of a data option's value: F.npy, or F.npz of F.npz:KEY (as load_array reads it).
std::string data_file(const std::string& spec) {
  const auto colon = spec.rfind(".npz:");
  return colon == std::string::npos ? spec : spec.substr(0, colon + 4);
}

// An MLP's labels are only checked to be integers >= 0 while loading (their count is found
// afterwards): any bound this large.
constexpr std::int64_t kAnyClass = std::numeric_limits<std::int64_t>::max();

// "TensorDataset: label[5] = -1 is outside [0, K)" -> a negative label's message.
[[noreturn]] void throw_negative_label(const ValueError& e, const std::string& file) {
  long long row = -1, label = 0;
  const char* at = std::strstr(e.what(), "label[");
  if (!at || std::sscanf(at, "label[%lld] = %lld", &row, &label) != 2) throw e;
  throw DataUsageError(detail::concat(file, ": row ", row, " has the label ", label,
                                      ": class labels are 0, 1, ..., classes - 1"));
}

// The largest label of a set, and the first row holding a label >= `limit` (-1: none).
std::pair<std::int64_t, std::int64_t> scan_labels(const samplers::TensorDataset& ds, std::int64_t limit) {
  const Tensor& y = ds.labels();
  const std::int64_t* p = y.data<std::int64_t>();
  std::int64_t largest = -1, first_over = -1;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    largest = std::max(largest, p[i]);
    if (first_over < 0 && p[i] >= limit) first_over = i;
  }
  return {largest, first_over};
}

}  // namespace

void check_data_files(const TrainConfig& c) {
  const std::pair<const char*, const std::string*> inputs[] = {
      {"--train-x", &c.train_x}, {"--train-y", &c.train_y}, {"--test-x", &c.test_x}, {"--test-y", &c.test_y}};
  for (const auto& [option, spec] : inputs) {
    if (spec->empty()) continue;
    try {
      files::check_regular(data_file(*spec));
    } catch (const IoError& e) {
      throw IoError(std::string(option) + " " + e.what());  // e.what() starts with the file's name
    }
  }
  for (const std::string& f : text_files(c)) {  // fortunes: IoError naming the package when missing
    try {
      files::check_regular(f);
    } catch (const IoError& e) {
      throw IoError(std::string("--dataset ") + e.what());
    }
  }
}

namespace {

// An MLP's classes: --classes, else the largest label + 1 over the training and test sets.
// The model must end in that many outputs: a model ending in more trains silently on
// classes no label has (and its accuracy counts them), one ending in fewer fails mid-epoch.
std::int64_t mlp_classes(const TrainConfig& c, const Datasets& d) {
  const std::int64_t outputs = c.model.back();
  const std::int64_t limit = c.classes > 0 ? c.classes : kAnyClass;
  std::int64_t largest = -1;
  for (const auto* ds : {&d.train, &d.test}) {
    if (!*ds) continue;
    if ((*ds)->label_dtype() != DType::Int64) throw TypeError("labels must be integer class indices");
    const auto [top, over] = scan_labels(**ds, limit);
    largest = std::max(largest, top);
    if (over >= 0) {
      const std::string file = !c.dataset.empty() ? c.dataset : ds == &d.train ? c.train_y : c.test_y;
      const std::int64_t label = (*ds)->labels().data<std::int64_t>()[over];
      throw DataUsageError(detail::concat(file, ": row ", over, " has the label ", label, " but --classes is ", c.classes,
                                          " (labels 0..", c.classes - 1, "): pass --classes ", label + 1,
                                          " or more, or fix the labels"));
    }
  }
  const std::int64_t classes = c.classes > 0 ? c.classes : largest + 1;
  if (outputs != classes) {
    std::vector<std::int64_t> fixed = c.model;
    fixed.push_back(classes);
    const std::string counted =
        c.classes > 0 ? detail::concat("--classes is ", classes)
                      : detail::concat("the labels have ", classes, " classes (0..", classes - 1, ")");
    throw DataUsageError(detail::concat(
        "--model ", c.model_text, " ends in ", outputs, " outputs but ", counted, ": make the last width ", classes,
        ", e.g. --model ", widths_str(fixed),
        c.classes == 0 && outputs > classes
            ? detail::concat(", or pass --classes ", outputs, " if some classes have no labels in this data")
            : std::string()));
  }
  return classes;
}

}  // namespace

std::vector<std::string> text_files(const TrainConfig& c) {
  if (c.dataset == "fortunes") return samplers::fortune_files();
  if (c.dataset.rfind("text:", 0) != 0) return {};
  std::vector<std::string> files;
  std::size_t start = 5;
  while (true) {
    const auto comma = c.dataset.find(',', start);
    files.push_back(c.dataset.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return files;
}

namespace {

Datasets load_text(const TrainConfig& c) {
  Datasets d;
  samplers::TextCorpus corpus;
  try {
    corpus = samplers::load_text_corpus(text_files(c));
    if (c.dataset == "fortunes") corpus.name = "--dataset fortunes (" + std::string(samplers::kFortunesDir) + ")";
    d.text_train = std::make_shared<samplers::TextDataset>(corpus, samplers::TextSplit::Train, c.gpt_context, c.stride);
    d.text_val = std::make_shared<samplers::TextDataset>(corpus, samplers::TextSplit::Validation, c.gpt_context);
  } catch (const ValueError& e) {  // not text, too short: the data does not fit the options
    throw DataUsageError(e.what());
  }
  d.input = {c.gpt_context};
  d.classes = 256;
  if (c.global_batch > d.text_train->size())
    throw DataUsageError(detail::concat("--global-batch ", c.global_batch, " is larger than the training set (",
                                        d.text_train->size(), " windows of ", c.gpt_context, " bytes at stride ",
                                        d.text_train->stride(), "); use --global-batch ", d.text_train->size(),
                                        " or less, a smaller --stride, or more text"));
  return d;
}

}  // namespace

Datasets load_data(const TrainConfig& c) {
  if (c.is_gpt()) return load_text(c);
  Datasets d;
  std::int64_t classes = c.is_cnn() ? c.cnn_classes : c.model.back();
  if (!c.dataset.empty()) {
    const auto colon = c.dataset.find(':');
    const std::string name = c.dataset.substr(0, colon);
    if (name != "fashion-mnist") throw ValueError("--dataset '" + name + "' is unknown (known: fashion-mnist[:DIR])");
    const std::string dir = colon == std::string::npos ? samplers::kFashionMnistDir : c.dataset.substr(colon + 1);
    samplers::MnistOptions mo;
    mo.standardize = true;
    mo.flatten = !c.is_cnn();  // a CNN sees [1, 28, 28] images
    d.train = samplers::load_mnist(dir, mo);
    mo.train = false;
    d.test = samplers::load_mnist(dir, mo);
    if (c.is_cnn()) {
      d.train = as_images(d.train, "fashion-mnist", c);
      d.test = as_images(d.test, "fashion-mnist", c);
      if (classes == 0) classes = kFashionMnistClasses;
    }
  } else {
    if (c.is_cnn() && classes == 0)
      throw ValueError("--model " + c.model_text + " with --train-x needs the number of classes: --model " + c.model_text +
                       ":K");
    samplers::NpyDatasetOptions o;
    o.num_classes = c.is_cnn() ? classes : kAnyClass;  // an MLP's classes are counted below
    o.check_finite = c.check_data;  // --no-data-check skips the scan
    const std::string* labels_file = &c.train_y;
    try {
      d.train = samplers::load_npy_dataset(c.train_x, c.train_y, o);
      labels_file = &c.test_y;
      if (!c.test_x.empty()) d.test = samplers::load_npy_dataset(c.test_x, c.test_y, o);
    } catch (const ValueError& e) {
      if (!std::strstr(e.what(), " is outside [0, ")) throw;
      if (!c.is_cnn()) throw_negative_label(e, *labels_file);
      throw DataUsageError(std::string(e.what()) + (c.classes > 0 ? ": --classes must exceed every label"
                                                                   : ": the classes are --model cnn:...:K"));
    }
    if (c.is_cnn()) {
      d.train = as_images(d.train, c.train_x, c);
      if (d.test) d.test = as_images(d.test, c.test_x, c);
    }
  }
  if (!c.is_cnn()) classes = mlp_classes(c, d);
  d.classes = classes;
  d.input = d.train->feature_shape();
  // One step would see at most the whole set; a larger batch would only skew the linear
  // scaling (and overflow the batch arithmetic near 2^63).
  if (c.global_batch > d.train->size())
    throw ValueError(detail::concat("--global-batch ", c.global_batch, " is larger than the training set (",
                                    d.train->size(), " samples); use --global-batch ", d.train->size(), " or less"));
  const std::string class_fix = c.classes > 0  ? ": --classes must exceed every label"
                                : c.is_cnn() ? ": the classes are --model cnn:...:K"
                                             : ": --model must end with the number of classes";
  for (const auto* ds : {&d.train, &d.test}) {
    if (!*ds) continue;
    if (!c.is_cnn() && (*ds)->feature_shape() != Shape{c.model.front()})
      throw DataUsageError(detail::concat(
          "the data has ", shape_str((*ds)->feature_shape()), " features per sample but --model starts with ",
          c.model.front(), " inputs",
          c.dataset.empty() ? "" : " (fashion-mnist: --model 784-...-10, or a CNN: --model cnn:32-64)",
          (*ds)->feature_shape().size() == 1
              ? detail::concat(": make the first width ", (*ds)->feature_shape()[0], ", e.g. --model ",
                               widths_str([&] {
                                 auto w = c.model;
                                 w.front() = (*ds)->feature_shape()[0];
                                 return w;
                               }()))
              : std::string(": an MLP takes flat features [N, D]")));
    if (c.is_cnn() && (*ds)->feature_shape() != d.input)
      throw ShapeError("the test set's images are " + shape_str((*ds)->feature_shape()) + " but the training set's are " +
                       shape_str(d.input));
    if ((*ds)->label_dtype() != DType::Int64) throw TypeError("labels must be integer class indices");
    try {
      samplers::TensorDataset check((*ds)->features(), (*ds)->labels(), classes);  // validates every label
    } catch (const ValueError& e) {
      throw DataUsageError(std::string(e.what()) + class_fix);
    }
  }
  return d;
}

}  // namespace phalanx::trainer
