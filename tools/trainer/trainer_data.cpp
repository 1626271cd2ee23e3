#include "trainer_data.hpp"

#include <cstring>

#include <phalanx/core/file_safety.hpp>
#include <phalanx/phalanx.hpp>

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
}

Datasets load_data(const TrainConfig& c) {
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
    o.num_classes = classes;
    o.check_finite = c.check_data;  // --no-data-check skips the scan
    try {
      d.train = samplers::load_npy_dataset(c.train_x, c.train_y, o);
      if (!c.test_x.empty()) d.test = samplers::load_npy_dataset(c.test_x, c.test_y, o);
    } catch (const ValueError& e) {
      if (!std::strstr(e.what(), " is outside [0, ")) throw;
      throw ValueError(std::string(e.what()) + (c.is_cnn() ? ": the classes are --model cnn:...:K"
                                                            : ": --model must end with the number of classes"));
    }
    if (c.is_cnn()) {
      d.train = as_images(d.train, c.train_x, c);
      if (d.test) d.test = as_images(d.test, c.test_x, c);
    }
  }
  d.classes = classes;
  d.input = d.train->feature_shape();
  // One step would see at most the whole set; a larger batch would only skew the linear
  // scaling (and overflow the batch arithmetic near 2^63).
  if (c.global_batch > d.train->size())
    throw ValueError(detail::concat("--global-batch ", c.global_batch, " is larger than the training set (",
                                    d.train->size(), " samples); use --global-batch ", d.train->size(), " or less"));
  const std::string class_fix = c.is_cnn() ? ": the classes are --model cnn:...:K" : ": --model must end with the number of classes";
  for (const auto* ds : {&d.train, &d.test}) {
    if (!*ds) continue;
    if (!c.is_cnn() && (*ds)->feature_shape() != Shape{c.model.front()})
      throw ShapeError(detail::concat("the data has ", shape_str((*ds)->feature_shape()), " features per sample but --model starts with ",
                                      c.model.front(), " inputs",
                                      c.dataset.empty() ? "" : " (fashion-mnist: --model 784-...-10, or a CNN: --model cnn:32-64)"));
    if (c.is_cnn() && (*ds)->feature_shape() != d.input)
      throw ShapeError("the test set's images are " + shape_str((*ds)->feature_shape()) + " but the training set's are " +
                       shape_str(d.input));
    if ((*ds)->label_dtype() != DType::Int64) throw TypeError("labels must be integer class indices");
    try {
      samplers::TensorDataset check((*ds)->features(), (*ds)->labels(), classes);  // validates every label
    } catch (const ValueError& e) {
      throw ValueError(std::string(e.what()) + class_fix);
    }
  }
  return d;
}

}  // namespace phalanx::trainer
