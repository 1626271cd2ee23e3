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
