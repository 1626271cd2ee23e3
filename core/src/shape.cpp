#include "phalanx/core/shape.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx {

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int normalize_dim(std::int64_t dim, std::size_t ndim, const char* op) {
  const auto n = static_cast<std::int64_t>(ndim);
  const std::int64_t d = dim < 0 ? dim + n : dim;
  if (d < 0 || d >= n)
    throw ValueError(detail::concat(op, ": dimension ", dim, " is out of range for a tensor with ",
                                    n, " dimension(s)"));
  return static_cast<int>(d);
}

}  // namespace phalanx
