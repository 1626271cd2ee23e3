// build_cnn: the trainer's CNN from its spec (model_spec.hpp), in PyTorch's nn.Sequential layout.
#include <phalanx/core/error.hpp>
#include <phalanx/phalanx.hpp>

#include "model_spec.hpp"

namespace phalanx::trainer {

std::shared_ptr<nn::Sequential> build_cnn(const CnnSpec& spec, const Shape& input, std::int64_t classes,
                                          const std::string& activation, Generator* gen) {
  const std::string text = cnn_spec_str(spec, classes);
  const Shape features = cnn_feature_shape(spec, input, text);
  if (activation != "relu" && activation != "tanh")
    throw ValueError("--activation '" + activation + "' is unknown for a CNN (relu or tanh)");
  auto seq = std::make_shared<nn::Sequential>();
  std::int64_t in = input[0];
  for (const std::int64_t out : spec.channels) {
    seq->push_back(std::make_shared<nn::Conv2d>(in, out, 3, 1, 1, 1, 1, true, gen));
    seq->push_back(std::make_shared<nn::BatchNorm2d>(out));
    if (activation == "relu") seq->push_back(std::make_shared<nn::ReLU>());
    else seq->push_back(std::make_shared<nn::Tanh>());
    seq->push_back(std::make_shared<nn::MaxPool2d>(2));
    in = out;
  }
  seq->push_back(std::make_shared<nn::Flatten>());
  std::int64_t flat = 0;
  if (__builtin_mul_overflow(features[0], features[1], &flat) || __builtin_mul_overflow(flat, features[2], &flat) ||
      flat > (std::int64_t{1} << 31))
    throw ValueError("--model " + text + ": the flattened features of " + shape_str(input) +
                     " images are too many for the Linear layer; add a conv block");
  seq->push_back(std::make_shared<nn::Linear>(flat, classes, true, gen));
  return seq;
}

}  // namespace phalanx::trainer
