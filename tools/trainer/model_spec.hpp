#pragma once
// phalanx-train's --model: an MLP's layer widths ("784-256-10") or a small CNN
// ("cnn:32-64", "cnn:32-64:10"): per number one block Conv2d(C_in, C, 3, padding=1),
// BatchNorm2d(C), activation, MaxPool2d(2); then Flatten and Linear(C_last * H' * W', classes),
// with PyTorch's nn.Sequential names ("0.weight", "1.running_mean", ..., "9.bias"); or
// nanoGPT's GPT over bytes ("gpt:4-4-128:128": layers, heads, width, context).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <phalanx/core/generator.hpp>
#include <phalanx/core/nn/sequential.hpp>
#include <phalanx/core/shape.hpp>
#include <phalanx/core/tensor_map.hpp>

namespace phalanx::trainer {

struct CnnSpec {
  std::vector<std::int64_t> channels;  ///< output channels of each conv block, in order
  std::int64_t classes = 0;            ///< cnn:...:K; 0 = the dataset's (fashion-mnist: 10)
};

/// --model gpt:LAYERS-HEADS-WIDTH:CONTEXT: nanoGPT's GPT (nn::GPT) over byte tokens
/// (vocabulary 256), biases on, its block size the context.
struct GptSpec {
  std::int64_t layers = 0, heads = 0, width = 0, context = 0;
};

/// True when `text` names a GPT ("gpt:...").
bool is_gpt_spec(const std::string& text);

/// "gpt:4-4-128:128"; throws ValueError naming the form, or the heads and the width when
/// the heads do not divide it.
GptSpec parse_gpt_spec(const std::string& text);

/// The spec as text ("gpt:4-4-128:128").
std::string gpt_spec_str(const GptSpec& spec);

/// The GPT's parameter count (the tied embedding once), or -1 when it overflows.
std::int64_t gpt_param_count(const GptSpec& spec);

/// nanoGPT's saved weights as nn::GPT loads them: the causal masks an older nanoGPT keeps as
/// buffers (transformer.h.<i>.attn.bias, [1, 1, T, T]) are dropped, as nanoGPT's own
/// from_pretrained drops them, and lm_head.weight (the tied wte) is added when only
/// transformer.wte.weight was saved and `model` (the GPT's state_dict) lists it.
TensorMap nanogpt_weights(const TensorMap& saved, const TensorMap& model);

/// True when `text` names a CNN ("cnn:...").
bool is_cnn_spec(const std::string& text);

/// "cnn:32-64" or "cnn:32-64:10"; throws ValueError naming the form.
CnnSpec parse_cnn_spec(const std::string& text);

/// The spec as text ("cnn:32-64:10").
std::string cnn_spec_str(const CnnSpec& spec, std::int64_t classes);

/// The spatial size after `blocks` MaxPool2d(2) stages (floor, as PyTorch); throws
/// ShapeError when the input [C, H, W] shrinks to nothing, naming the fix.
Shape cnn_feature_shape(const CnnSpec& spec, const Shape& input, const std::string& text);

/// The CNN for inputs [C, H, W] (one sample's shape) and `classes` outputs; activation is
/// "relu" or "tanh". Initialised as PyTorch does, from `gen`.
std::shared_ptr<nn::Sequential> build_cnn(const CnnSpec& spec, const Shape& input, std::int64_t classes,
                                          const std::string& activation, Generator* gen);

}  // namespace phalanx::trainer
