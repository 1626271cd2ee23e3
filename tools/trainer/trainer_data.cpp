#include "trainer_data.hpp"

#include <cstring>

#include <phalanx/phalanx.hpp>

namespace phalanx::trainer {

Datasets load_data(const TrainConfig& c) {
  const std::int64_t classes = c.model.back(), dim = c.model.front();
  Datasets d;
  if (!c.dataset.empty()) {
    const auto colon = c.dataset.find(':');
    const std::string name = c.dataset.substr(0, colon);
    if (name != "fashion-mnist") throw ValueError("--dataset '" + name + "' is unknown (known: fashion-mnist[:DIR])");
    const std::string dir = colon == std::string::npos ? samplers::kFashionMnistDir : c.dataset.substr(colon + 1);
    samplers::MnistOptions mo;
    mo.standardize = true;
    d.train = samplers::load_mnist(dir, mo);
    mo.train = false;
    d.test = samplers::load_mnist(dir, mo);
  } else {
    samplers::NpyDatasetOptions o;
    o.num_classes = classes;
    o.check_finite = c.check_data;  // --no-data-check skips the scan
    try {
      d.train = samplers::load_npy_dataset(c.train_x, c.train_y, o);
      if (!c.test_x.empty()) d.test = samplers::load_npy_dataset(c.test_x, c.test_y, o);
    } catch (const ValueError& e) {
      if (!std::strstr(e.what(), " is outside [0, ")) throw;
      throw ValueError(std::string(e.what()) + ": --model must end with the number of classes");
    }
  }
  // One step would see at most the whole set; a larger batch would only skew the linear
  // scaling (and overflow the batch arithmetic near 2^63).
  if (c.global_batch > d.train->size())
    throw ValueError(detail::concat("--global-batch ", c.global_batch, " is larger than the training set (",
                                    d.train->size(), " samples); use --global-batch ", d.train->size(), " or less"));
  for (const auto* ds : {&d.train, &d.test}) {
    if (!*ds) continue;
    if ((*ds)->feature_shape() != Shape{dim})
      throw ShapeError(detail::concat("the data has ", shape_str((*ds)->feature_shape()), " features per sample but --model starts with ",
                                      dim, " inputs"));
    if ((*ds)->label_dtype() != DType::Int64) throw TypeError("labels must be integer class indices");
    try {
      samplers::TensorDataset check((*ds)->features(), (*ds)->labels(), classes);  // validates every label
    } catch (const ValueError& e) {
      throw ValueError(std::string(e.what()) + ": --model must end with the number of classes");
    }
  }
  return d;
}

}  // namespace phalanx::trainer
