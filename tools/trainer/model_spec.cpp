#include "model_spec.hpp"

#include <cerrno>
#include <cstdlib>

#include <phalanx/core/error.hpp>

namespace phalanx::trainer {

namespace {

constexpr const char* kForm = "cnn:C1-C2-...[:CLASSES] with positive channel counts, e.g. cnn:32-64 or cnn:32-64:10";

std::int64_t positive_part(const std::string& text, const std::string& part) {
  if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos)
    throw ValueError("--model '" + text + "' must be " + kForm);
  errno = 0;
  const long long v = std::strtoll(part.c_str(), nullptr, 10);
  if (errno == ERANGE || v > (1LL << 31)) throw ValueError("--model '" + text + "': " + part + " is too large");
  if (v < 1) throw ValueError("--model '" + text + "' must be " + kForm);
  return v;
}

}  // namespace

bool is_gpt_spec(const std::string& text) { return text.rfind("gpt:", 0) == 0 || text == "gpt"; }

GptSpec parse_gpt_spec(const std::string& text) {
  const std::string form =
      "--model '" + text + "' must be gpt:LAYERS-HEADS-WIDTH:CONTEXT with positive integers, e.g. gpt:4-4-128:128";
  if (text.size() <= 4) throw ValueError(form);
  const std::string body = text.substr(4);
  const auto colon = body.find(':');
  if (colon == std::string::npos || body.find(':', colon + 1) != std::string::npos) throw ValueError(form);
  std::vector<std::string> parts;
  std::size_t start = 0;
  const std::string dims = body.substr(0, colon);
  while (true) {
    const auto dash = dims.find('-', start);
    parts.push_back(dims.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (parts.size() != 3) throw ValueError(form);
  auto number = [&](const std::string& part) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) throw ValueError(form);
    errno = 0;
    const long long v = std::strtoll(part.c_str(), nullptr, 10);
    if (errno == ERANGE || v > (1LL << 31)) throw ValueError("--model '" + text + "': " + part + " is too large");
    if (v < 1) throw ValueError(form);
    return static_cast<std::int64_t>(v);
  };
  GptSpec s{number(parts[0]), number(parts[1]), number(parts[2]), number(body.substr(colon + 1))};
  if (s.width % s.heads != 0)
    throw ValueError(detail::concat("--model ", text, ": ", s.heads, " heads do not divide the width ", s.width,
                                    " (each head takes width / heads features); use a number of heads that divides ",
                                    s.width));
  return s;
}

std::string gpt_spec_str(const GptSpec& s) {
  return detail::concat("gpt:", s.layers, "-", s.heads, "-", s.width, ":", s.context);
}

std::int64_t gpt_param_count(const GptSpec& s) {
  // Per block: ln_1, ln_2 (2E each), c_attn 3E*E + 3E, c_proj E*E + E, c_fc 4E*E + 4E,
  // mlp.c_proj 4E*E + E; then wte 256*E (tied with lm_head), wpe context*E, ln_f 2E.
  std::int64_t e2 = 0, block = 0, all = 0, emb = 0;
  if (__builtin_mul_overflow(s.width, s.width, &e2) || __builtin_mul_overflow(e2, std::int64_t{12}, &block) ||
      __builtin_add_overflow(block, 13 * s.width, &block) || __builtin_mul_overflow(block, s.layers, &all) ||
      __builtin_mul_overflow(s.context + 256 + 2, s.width, &emb) || __builtin_add_overflow(all, emb, &all))
    return -1;
  return all;
}

TensorMap nanogpt_weights(const TensorMap& saved, const TensorMap& model) {
  TensorMap out;
  const std::string mask = ".attn.bias";
  for (const auto& [name, t] : saved) {
    const bool is_mask = name.size() > mask.size() && name.compare(name.size() - mask.size(), mask.size(), mask) == 0 &&
                         t.dim() == 4;
    if (!is_mask) out.set(name, t);
  }
  if (!out.contains("lm_head.weight") && model.contains("lm_head.weight"))
    if (const Tensor* wte = out.find("transformer.wte.weight")) out.set("lm_head.weight", *wte);
  return out;
}

bool is_cnn_spec(const std::string& text) { return text.rfind("cnn:", 0) == 0 || text == "cnn"; }

CnnSpec parse_cnn_spec(const std::string& text) {
  if (text.size() <= 4) throw ValueError("--model '" + text + "' must be " + kForm);
  const std::string body = text.substr(4);
  const auto colon = body.find(':');
  const std::string chans = body.substr(0, colon);
  CnnSpec s;
  if (colon != std::string::npos) s.classes = positive_part(text, body.substr(colon + 1));
  std::size_t start = 0;
  while (true) {
    const auto dash = chans.find('-', start);
    s.channels.push_back(positive_part(text, chans.substr(start, dash == std::string::npos ? std::string::npos : dash - start)));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (s.channels.size() > 16) throw ValueError("--model '" + text + "': at most 16 conv blocks");
  return s;
}

std::string cnn_spec_str(const CnnSpec& spec, std::int64_t classes) {
  std::string s = "cnn:";
  for (std::size_t i = 0; i < spec.channels.size(); ++i) s += (i ? "-" : "") + std::to_string(spec.channels[i]);
  return s + ":" + std::to_string(classes);
}

Shape cnn_feature_shape(const CnnSpec& spec, const Shape& input, const std::string& text) {
  if (input.size() != 3)
    throw ShapeError("--model " + text + " needs images [N, C, H, W]; the data has " + shape_str(input) +
                     " features per sample (save the features as [N, C, H, W], or use --dataset fashion-mnist)");
  std::int64_t h = input[1], w = input[2];
  for (std::size_t i = 0; i < spec.channels.size(); ++i) {
    h /= 2;
    w /= 2;
    if (h < 1 || w < 1)
      throw ShapeError(detail::concat("--model ", text, ": ", i + 1, " MaxPool2d(2) stages shrink the ", input[1], "x",
                                      input[2], " images to nothing; use at most ", i, " conv blocks"));
  }
  return {spec.channels.back(), h, w};
}

}  // namespace phalanx::trainer
